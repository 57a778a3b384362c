"""What the data sets torchvision reads share (CIFAR-10/100, STL-10; ``_``: not a data set):
its classes with presence checks instead of the release md5 sums, CIFAR's pickles read by an
unpickler that builds only arrays, and downloads that say what to do when they fail.
torchvision is imported only when a data set is read."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from functools import cache

import numpy as np

from fedssl.data.sets import Source, Split, downloaded, not_found

_TORCHVISION_HOWTO = (
    "set `download: true` in params/datasets/{name}.yaml and run once on a machine with internet "
    "access, or place torchvision's layout ({folder}/) under the root"
)
TRAIN_TEST = {"train": {"train": True}, "test": {"train": False}}  # each split's arguments


class ArraysOnlyUnpickler(pickle.Unpickler):
    """CIFAR's files are pickled dicts of numpy arrays, lists and strings: build those and
    refuse every other global, so a crafted file cannot run code."""

    ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        *(
            (m, n)
            for m in ("numpy.core.multiarray", "numpy._core.multiarray")
            for n in ("_reconstruct", "scalar")
        ),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(
                f"refusing to unpickle {module}.{name}: a CIFAR file "
                f"holds only numpy arrays, lists and strings"
            )
        return super().find_class(module, name)


def read_cifar_pickle(path: str) -> dict:
    with open(path, "rb") as f:
        return ArraysOnlyUnpickler(f, encoding="latin1").load()


def _required(ds_cls: type) -> list[str]:
    names = [fname for fname, _md5 in ds_cls.train_list + ds_cls.test_list]
    meta = getattr(ds_cls, "meta", None)
    return names + ([meta["filename"]] if meta else [])


def _missing(ds_cls: type, root: str) -> list[str]:
    folder = os.path.join(root, ds_cls.base_folder)
    return [f for f in _required(ds_cls) if not os.path.isfile(os.path.join(folder, f))]


class PresenceCheck:
    """torchvision's integrity check by presence instead of the release md5 sums (copies that
    were converted, truncated for tests or re-packed still load; a missing file is still
    reported, before torchvision is ever asked)."""

    def _check_integrity(self) -> bool:
        return not _missing(type(self), self.root)


@cache
def cifar_class(upstream: str) -> type:
    """torchvision's ``upstream`` CIFAR class (``"CIFAR10"``, ``"CIFAR100"``) with presence
    checks, its pickles read by :class:`ArraysOnlyUnpickler` (upstream unpickles anything).
    Built on first use: torchvision is slow to import and Fashion-MNIST does not need it."""
    import torchvision.datasets as tvd

    class CIFAR(PresenceCheck, getattr(tvd, upstream)):
        def __init__(self, root: str, train: bool = True, download: bool = False) -> None:
            # upstream's reading, with the pickles read by the restricted unpickler
            tvd.VisionDataset.__init__(self, root)
            self.train = train
            if download:
                self.download()
            if not self._check_integrity():
                raise RuntimeError("Dataset not found or corrupted. You can use download=True")
            batches = [
                self._read(name) for name, _md5 in (self.train_list if train else self.test_list)
            ]
            self.data = np.vstack([b["data"] for b in batches]).reshape(-1, 3, 32, 32)
            self.data = self.data.transpose((0, 2, 3, 1))  # HWC, as upstream keeps it
            self.targets = [y for b in batches for y in b.get("labels", b.get("fine_labels"))]
            self._load_meta()

        def _read(self, name: str) -> dict:
            return read_cifar_pickle(os.path.join(self.root, self.base_folder, name))

        def _load_meta(self) -> None:
            # Upstream re-checks the md5 of the meta file here; read the class names without it.
            self.classes = self._read(self.meta["filename"])[self.meta["key"]]
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    return CIFAR


@cache
def presence_checked(upstream: str) -> type:
    """torchvision's data set class ``upstream`` (e.g. ``"STL10"``) with presence checks."""
    import torchvision.datasets as tvd

    return type(upstream, (PresenceCheck, getattr(tvd, upstream)), {})


def _via_torchvision(
    name: str, ds_cls: type, root: str, download: bool, splits: dict[str, dict], to_nchw: Callable
) -> dict[str, Split]:
    missing = _missing(ds_cls, root)
    if missing and not download:
        howto = _TORCHVISION_HOWTO.format(name=name, folder=ds_cls.base_folder)
        raise not_found(
            name, os.path.join(root, ds_cls.base_folder), f"{howto} (missing: {', '.join(missing)})"
        )
    if missing:  # fetch the archive first, so that a failed download says what to do
        howto = (
            f"run once with `download: true` on a machine with internet access and copy "
            f"{ds_cls.base_folder}/ from its data_root into {os.path.abspath(root)}"
        )
        first = next(iter(splits.values()))
        downloaded(name, root, lambda: ds_cls(root, download=True, **first), howto)
    out = {}
    for split, kwargs in splits.items():
        ds = ds_cls(root, download=download, **kwargs)
        labels = ds.targets if hasattr(ds, "targets") else ds.labels
        out[split] = Split(
            np.ascontiguousarray(to_nchw(np.asarray(ds.data)), dtype=np.uint8),
            np.asarray(labels, dtype=np.int64),
        )
    return out


def hwc_to_chw(x: np.ndarray) -> np.ndarray:
    return x.transpose(0, 3, 1, 2)  # CIFAR's .data is NHWC


def torchvision_source(
    name: str,
    upstream: Callable[[], type],
    folder: str,
    files: list[str],
    splits: dict[str, dict],
    to_nchw: Callable = hwc_to_chw,
) -> Source:
    """A data set torchvision reads with the class ``upstream()`` builds (one of the above) from
    ``<root>/<folder>``, which planning checks holds ``files`` (without importing
    torchvision); ``splits``: each split's keyword arguments to the class; ``to_nchw``: its
    ``.data`` into N, C, H, W."""

    def check(root: str) -> None:
        lost = [f for f in files if not os.path.isfile(os.path.join(root, folder, f))]
        if lost:
            howto = _TORCHVISION_HOWTO.format(name=name, folder=folder)
            raise not_found(
                name, os.path.join(root, folder), f"{howto} (missing: {', '.join(lost)})"
            )

    return Source(
        lambda root, download: _via_torchvision(name, upstream(), root, download, splits, to_nchw),
        check,
    )
