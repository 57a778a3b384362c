"""STL-10 (Coates et al., 2011), in its binary layout."""

from fedssl.data.catalog import DatasetSpec, register

register(DatasetSpec("stl10", "STL-10", 10, (3, 96, 96), 5000, "fedssl.data.sources:STL10"))
