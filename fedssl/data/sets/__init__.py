"""The data sets, one drop-in file each: a module here holds its data set's reader (a
:class:`Source`) and registers its entry (a :class:`DatasetSpec`); the registry
(:mod:`fedssl.data.catalog`) imports every module here whose name has no leading underscore.

This file is what a data-set file builds on, and all it imports of the project: the prepare
stage runs a data set's file by the name its record gives, so its code is that file and this
one, not the registry's. It imports nothing beyond the standard library.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class DatasetSpec:
    name: str  # the key in params/datasets/*.yaml (``name:``)
    label: str  # how reports print it
    classes: int  # labels are 0 .. classes - 1 as loaded
    shape: tuple[int, int, int]  # C, H, W as loaded
    train_size: int | None  # None: only known once read (it depends on how it was sampled)
    source: str  # "module:object" reading it (a Source: load / check)
    default_root: str = ""  # where it is read from when params give no data_root; "" = data/<name>
    downloadable: bool = True  # `download: true` can fetch it
    module: str = ""  # the module that registers it (set when it is discovered)

    @property
    def root(self) -> str:
        return self.default_root or f"data/{self.name}"

    @property
    def source_module(self) -> str:
        return self.source.partition(":")[0]

    def reader(self) -> Source:
        """The object that reads this data set (imported now)."""
        module, _, name = self.source.partition(":")
        return getattr(importlib.import_module(module), name)


DATASETS: dict[str, DatasetSpec] = {}  # read through fedssl.data.catalog, which fills it


def register(spec: DatasetSpec) -> DatasetSpec:
    if spec.name in DATASETS:
        raise ValueError(f"data set {spec.name!r} is registered twice")
    DATASETS[spec.name] = spec
    return spec


class DataNotFound(FileNotFoundError):
    """A data set is not on disk; the message says where we looked and how to get it."""


class Split(NamedTuple):
    images: np.ndarray  # uint8 [N, C, H, W]
    labels: np.ndarray  # int64 [N]; -1 marks unlabelled samples


class Source(NamedTuple):
    """How one data set is read. ``load(root, download)``: its splits, e.g. {'train': Split,
    'test': Split}. ``check(root)``: raise :class:`DataNotFound` saying how to get it when its
    files are not under ``root``, reading no data (planning calls it). ``train_size(root)``,
    optional: the training samples its raw files hold, read from a header without loading
    them (planning's partition-size check), or None."""

    load: Callable[[str, bool], dict[str, Split]]
    check: Callable[[str], None]
    train_size: Callable[[str], int | None] | None = None


def not_found(name: str, looked_at: str, howto: str) -> DataNotFound:
    return DataNotFound(f"{name} not found at {os.path.abspath(looked_at)}. To get it: {howto}.")


def downloaded(name: str, target: str, fetch: Callable[[], object], howto: str):
    """``fetch()``, the download of data set ``name`` into ``target``; when it fails (no
    internet, a server down: a URLError or OSError, or torchvision's RuntimeError once every
    mirror failed) a :class:`DataNotFound` saying how to get the files instead."""
    try:
        return fetch()
    except DataNotFound:
        raise
    except (OSError, RuntimeError) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        raise DataNotFound(
            f"{name} is not at {os.path.abspath(target)} and could not be downloaded ({reason}); "
            f"is this machine offline? To get it: {howto}, then set `download: false`."
        ) from None
