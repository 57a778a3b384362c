"""CIFAR-100 (Krizhevsky, 2009), in torchvision's python-pickle layout."""

from fedssl.data.sets import DatasetSpec, register
from fedssl.data.sets._torchvision import TRAIN_TEST, cifar_class, torchvision_source

CIFAR100 = torchvision_source(
    "cifar100",
    lambda: cifar_class("CIFAR100"),
    "cifar-100-python",
    ["train", "test", "meta"],
    TRAIN_TEST,
)

register(
    DatasetSpec(
        "cifar100", "CIFAR-100", 100, (3, 32, 32), 50000, "fedssl.data.sets.cifar100:CIFAR100"
    )
)
