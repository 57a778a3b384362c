"""Facts about the supported data sets that planning needs without reading them (no torch)."""

from __future__ import annotations

NUM_CLASSES = {
    "fashion_mnist": 10,
    "cifar10": 10,
    "cifar100": 100,
    "stl10": 10,
    "tiny_imagenet": 200,
    "femnist": 10,
}  # femnist: LEAF's letters a-j
# (femnist has none: its size depends on the sampling options LEAF's preprocess.sh was run with)
TRAIN_SIZES = {
    "fashion_mnist": 60000,
    "cifar10": 50000,
    "cifar100": 50000,
    "stl10": 5000,
    "tiny_imagenet": 100000,
}
IMAGE_SHAPES = {
    "fashion_mnist": (1, 28, 28),
    "cifar10": (3, 32, 32),
    "cifar100": (3, 32, 32),
    "stl10": (3, 96, 96),
    "tiny_imagenet": (3, 64, 64),
    "femnist": (1, 28, 28),
}  # C, H, W as loaded
DEFAULT_ROOTS = {name: f"data/{name}" for name in NUM_CLASSES}
DEFAULT_ROOTS["fashion_mnist"] = (
    "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist
)
