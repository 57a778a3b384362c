"""FEMNIST (LEAF, Caldas et al., 2018): the letters a-j, one writer per client."""

from fedssl.data.catalog import DatasetSpec, register

register(
    DatasetSpec(
        "femnist",
        "FEMNIST",
        10,  # LEAF's letters a-j
        (1, 28, 28),
        None,  # depends on the sampling options LEAF's preprocess.sh was run with
        "fedssl.data.femnist:FEMNIST",
        downloadable=False,  # built with LEAF's scripts
    )
)
