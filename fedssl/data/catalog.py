"""The data-set registry: one :class:`DatasetSpec` per supported data set. Params validation,
planning checks, costs, the report's labels and the prepare stage all read it.

A data set is one drop-in file under :mod:`fedssl.data.sets` that registers its entry, found
like the methods: every module there is imported when the registry is first read (by name, so
no stage's code depends on the other data sets' files: adding one reruns nothing). A stage that
reads a data set's entry (its prepare stage, the report) depends on that file.

The entry names its reader as ``"module:object"`` (an object with ``load(root, download)``
and ``check(root)``, see :class:`fedssl.data.sources.Source`), imported only when data is read
or checked (:func:`load_dataset`, :func:`missing_data`): planning and every other stage read
the facts here without the readers' code. The prepare stage runs none of this module: its
record holds the entry's facts it needs and names the reader, whose module is its code. This
module imports no torch and no numpy.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, replace


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
    module: str = ""  # the module that registers it (set when it is discovered)

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


def datasets() -> dict[str, DatasetSpec]:
    """Every registered data set: name -> entry (the files of :mod:`fedssl.data.sets` are
    imported on the first call)."""
    _discover()
    return DATASETS


def dataset_spec(name: str) -> DatasetSpec:
    """The entry of data set ``name`` ('-' and upper case accepted, e.g. 'Tiny-ImageNet')."""
    _discover()
    key = name.lower().replace("-", "_")
    if key not in DATASETS:
        raise ValueError(
            f"unknown data set {name!r}; known data sets: {', '.join(sorted(DATASETS))}"
        )
    return DATASETS[key]


_discovered = False


def _discover() -> None:
    """Import every data-set file of :mod:`fedssl.data.sets` (alphabetically) and note in each
    entry the module that registered it. On first use, not when this module is imported: a
    data-set file may import a reader module that imports this one."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    import fedssl.data.sets as sets

    for info in pkgutil.iter_modules(sets.__path__):
        module = f"{sets.__name__}.{info.name}"
        before = set(DATASETS)
        importlib.import_module(module)
        for name in set(DATASETS) - before:
            DATASETS[name] = replace(DATASETS[name], module=module)


def load_dataset(name: str, root: str | None = None, download: bool = False):
    """The named data set's splits, e.g. {'train': Split, 'test': Split}, read from ``root``
    (None: the entry's default place)."""
    spec = dataset_spec(name)
    return spec.reader().load(root or spec.root, download)


def missing_data(name: str, root: str | None = None, download: bool = False) -> str | None:
    """Why data set ``name`` cannot be loaded from ``root`` and how to get it, or None when its
    files are there (or it will be downloaded). Reads no data: the front ends call this while
    planning, so a missing data set stops them before any stage runs. (A reader's ``check``
    raises :class:`fedssl.data.sources.DataNotFound`, a FileNotFoundError: caught as such,
    so that the registry imports no reader.)"""
    spec = dataset_spec(name)
    if download and spec.downloadable:
        return None
    try:
        spec.reader().check(root or spec.root)
    except FileNotFoundError as e:
        return str(e)
    return None
