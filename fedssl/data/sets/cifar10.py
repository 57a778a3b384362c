"""CIFAR-10 (Krizhevsky, 2009), in torchvision's python-pickle layout."""

from fedssl.data.sets import DatasetSpec, register
from fedssl.data.sets._torchvision import TRAIN_TEST, cifar_class, torchvision_source

CIFAR10 = torchvision_source(
    "cifar10",
    lambda: cifar_class("CIFAR10"),
    "cifar-10-batches-py",
    [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"],
    TRAIN_TEST,
)

register(
    DatasetSpec("cifar10", "CIFAR-10", 10, (3, 32, 32), 50000, "fedssl.data.sets.cifar10:CIFAR10")
)
