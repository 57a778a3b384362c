"""CIFAR-100 (Krizhevsky, 2009), in torchvision's python-pickle layout."""

from fedssl.data.catalog import DatasetSpec, register

register(
    DatasetSpec("cifar100", "CIFAR-100", 100, (3, 32, 32), 50000, "fedssl.data.sources:CIFAR100")
)
