"""The data-set registry: one :class:`~fedssl.data.sets.DatasetSpec` per supported data set.
Params validation, planning checks, costs, the report's labels and the prepare stage's record
all read it.

A data set is one drop-in file under :mod:`fedssl.data.sets` that holds its reader and
registers its entry, found like the methods: every module there is imported when the registry
is first read (by name, so no stage's code depends on the data sets' files: adding one reruns
nothing). A stage that reads a data set's entry (the report) depends on that file, and so does
its prepare stage, which runs the reader the entry names (``"module:object"``, a
:class:`~fedssl.data.sets.Source`) from its record: its code is that file and the package file
it builds on, none of this module. This module imports no torch and no numpy; a data-set file
imports torch and torchvision only when it reads.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import replace

import fedssl.data.sets as sets
from fedssl.data.sets import DATASETS, DatasetSpec


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
    entry the module that registered it. On first use, not when this module is imported."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for info in pkgutil.iter_modules(sets.__path__):
        if info.name.startswith("_"):
            continue  # code the data-set files share
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
    raises :class:`fedssl.data.sets.DataNotFound`, a FileNotFoundError: caught as such,
    so that the registry imports no reader.)"""
    spec = dataset_spec(name)
    if download and spec.downloadable:
        return None
    try:
        spec.reader().check(root or spec.root)
    except FileNotFoundError as e:
        return str(e)
    return None


def raw_train_size(name: str, root: str | None = None) -> int | None:
    """The training samples data set ``name``'s raw files under ``root`` hold, where its
    reader reads that from a header without loading them (Fashion-MNIST's idx files); else
    None."""
    spec = dataset_spec(name)
    reader = spec.reader()
    return reader.train_size(root or spec.root) if reader.train_size else None
