"""CIFAR-10 (Krizhevsky, 2009), in torchvision's python-pickle layout."""

from fedssl.data.catalog import DatasetSpec, register

register(DatasetSpec("cifar10", "CIFAR-10", 10, (3, 32, 32), 50000, "fedssl.data.sources:CIFAR10"))
