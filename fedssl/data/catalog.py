"""The data-set registry: one :class:`DatasetSpec` per supported data set, the only place that
names them. Params validation, planning checks, costs, the report's labels and the prepare stage
all read it, so a new data set is one entry here plus the reader it names.

The entry names its reader as ``"module:object"`` (an object with ``load(root, download)``
and ``check(root)``, see :class:`fedssl.data.sources.Source`), imported only when data is read
or checked: planning and every other stage read the facts here without the readers' code, and
the prepare stage depends on the module the entry names. This module imports no torch and no
numpy.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetSpec:
    name: str  # the key in params/datasets/*.yaml (``name:``)
    label: str  # how reports print it
    classes: int  # labels are 0 .. classes - 1 as loaded
    shape: tuple[int, int, int]  # C, H, W as loaded
    train_size: int | None  # None: only known once read (it depends on how it was sampled)
    source: str  # "module:object" reading it (load / check)
    default_root: str = ""  # where it is read from when params give no data_root; "" = data/<name>
    downloadable: bool = True  # `download: true` can fetch it

    @property
    def root(self) -> str:
        return self.default_root or f"data/{self.name}"

    @property
    def source_module(self) -> str:
        return self.source.partition(":")[0]

    def reader(self):
        """The object that reads this data set (imported now)."""
        module, _, name = self.source.partition(":")
        return getattr(importlib.import_module(module), name)


DATASETS: dict[str, DatasetSpec] = {}


def register(spec: DatasetSpec) -> DatasetSpec:
    if spec.name in DATASETS:
        raise ValueError(f"data set {spec.name!r} is registered twice")
    DATASETS[spec.name] = spec
    return spec


def dataset_spec(name: str) -> DatasetSpec:
    """The entry of data set ``name`` ('-' and upper case accepted, e.g. 'Tiny-ImageNet')."""
    key = name.lower().replace("-", "_")
    if key not in DATASETS:
        raise ValueError(
            f"unknown data set {name!r}; known data sets: {', '.join(sorted(DATASETS))}"
        )
    return DATASETS[key]


_SOURCES = "fedssl.data.sources"
register(
    DatasetSpec(
        "fashion_mnist",
        "F-MNIST",
        10,
        (1, 28, 28),
        60000,
        f"{_SOURCES}:FASHION_MNIST",
        default_root="/usr/share/datasets/fashion-mnist",  # Debian's dataset-fashion-mnist
    )
)
register(DatasetSpec("cifar10", "CIFAR-10", 10, (3, 32, 32), 50000, f"{_SOURCES}:CIFAR10"))
register(DatasetSpec("cifar100", "CIFAR-100", 100, (3, 32, 32), 50000, f"{_SOURCES}:CIFAR100"))
register(DatasetSpec("stl10", "STL-10", 10, (3, 96, 96), 5000, f"{_SOURCES}:STL10"))
register(
    DatasetSpec(
        "tiny_imagenet",
        "Tiny",
        200,
        (3, 64, 64),
        100000,
        f"{_SOURCES}:TINY_IMAGENET",
        downloadable=False,  # the archive needs unzipping by hand
    )
)
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
