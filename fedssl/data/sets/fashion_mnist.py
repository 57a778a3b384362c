"""Fashion-MNIST (Xiao et al., 2017): the embedded default, read from Debian's package
``dataset-fashion-mnist`` (the original idx.gz files)."""

from fedssl.data.catalog import DatasetSpec, register
from fedssl.data.sources import DEBIAN_FASHION_MNIST

register(
    DatasetSpec(
        "fashion_mnist",
        "F-MNIST",
        10,
        (1, 28, 28),
        60000,
        "fedssl.data.sources:FASHION_MNIST",
        default_root=DEBIAN_FASHION_MNIST,  # Debian's dataset-fashion-mnist
    )
)
