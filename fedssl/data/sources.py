"""Read image data sets from their usual on-disk layouts into uint8 NCHW numpy arrays.

Here: Fashion-MNIST (idx files), CIFAR-10/100 and STL-10 (torchvision layouts), Tiny-ImageNet
(the official ``tiny-imagenet-200`` folder tree); FEMNIST's reader is in :mod:`fedssl.data.femnist`.
Each is a :class:`Source` that an entry of the registry (:mod:`fedssl.data.catalog`) names
(the registry reads a data set by name: :func:`fedssl.data.catalog.load_dataset`). This module
imports nothing of the project, so the prepare stage, which calls the reader its record names,
runs no registry code. Everything is loaded into memory at once; callers cache or partition
the arrays themselves.
"""

from __future__ import annotations

import gzip
import os
import pickle
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import NamedTuple

import numpy as np


class DataNotFound(FileNotFoundError):
    """A data set is not on disk; the message says where we looked and how to get it."""


class Split(NamedTuple):
    images: np.ndarray  # uint8 [N, C, H, W]
    labels: np.ndarray  # int64 [N]; -1 marks unlabelled samples


class Source(NamedTuple):
    """How one data set is read. ``load(root, download)``: its splits, e.g. {'train': Split,
    'test': Split}. ``check(root)``: raise :class:`DataNotFound` saying how to get it when its
    files are not under ``root``, reading no data (planning calls it)."""

    load: Callable[[str, bool], dict[str, Split]]
    check: Callable[[str], None]


_TORCHVISION_HOWTO = (
    "set `download: true` in params/datasets/{name}.yaml and run once on a machine with internet "
    "access, or place torchvision's layout ({folder}/) under the root"
)


def _not_found(name: str, looked_at: str, howto: str) -> DataNotFound:
    return DataNotFound(f"{name} not found at {os.path.abspath(looked_at)}. To get it: {howto}.")


def _downloaded(name: str, target: str, fetch: Callable[[], object], howto: str):
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


# --------------------------------------------------------------------------- Fashion-MNIST
# Where Debian's package dataset-fashion-mnist installs the idx files (a read-only system folder):
# the data set's default root (fedssl/data/sets/fashion_mnist.py).
DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def _read_idx(path: Path) -> np.ndarray:
    """Parse an idx file: 2 zero bytes, a type code (0x08 = uint8), ndim, big-endian int32 dims.
    A damaged file (truncated, a flipped byte: gzip checks a CRC) is refused naming it."""
    import zlib

    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as err:
        raise DataNotFound(f"{path}: damaged ({err}): reinstall or download it again") from None
    if raw[:3] != b"\x00\x00\x08":
        raise DataNotFound(f"{path}: not an unsigned-byte idx file: reinstall or download it")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">i4", count=ndim, offset=4)
    if len(raw) != 4 + 4 * ndim + int(np.prod(dims, dtype=np.int64)):
        raise DataNotFound(
            f"{path}: holds {len(raw)} bytes, its header says {4 + 4 * ndim} + "
            f"{' x '.join(map(str, dims))}: truncated or damaged, reinstall or download it"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def raw_train_size(name: str, root: str) -> int | None:
    """The training samples a data set's raw files under ``root`` hold, read from a header
    without loading them (Fashion-MNIST's idx labels file); None where there is no such
    header."""
    if name != "fashion_mnist":
        return None
    path = _find_idx(Path(root), "train-labels-idx1-ubyte")
    if path is None:
        return None
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            header = f.read(8)
    except (OSError, EOFError):
        return None
    return int.from_bytes(header[4:8], "big") if header[:4] == b"\x00\x00\x08\x01" else None


def _find_idx(root: Path, stem: str) -> Path | None:
    # Flat layout (Debian package) first, then torchvision's FashionMNIST/raw; gz or extracted.
    for folder in (root, root / "FashionMNIST" / "raw"):
        for suffix in ("", ".gz"):
            if (folder / (stem + suffix)).is_file():
                return folder / (stem + suffix)
    return None


def _fashion_split(root: Path, prefix: str) -> Split | None:
    images = _find_idx(root, f"{prefix}-images-idx3-ubyte")
    labels = _find_idx(root, f"{prefix}-labels-idx1-ubyte")
    if images is None or labels is None:
        return None
    return Split(_read_idx(images)[:, None].copy(), _read_idx(labels).astype(np.int64))


def _load_fashion_mnist(root: str, download: bool) -> dict[str, Split]:
    splits = {
        "train": _fashion_split(Path(root), "train"),
        "test": _fashion_split(Path(root), "t10k"),
    }
    if None not in splits.values():
        return splits
    if download:
        # The default root is a read-only system folder, so download next to the other data sets.
        target = "data/fashion_mnist" if root == DEBIAN_FASHION_MNIST else root
        import torchvision.datasets as tvd

        _downloaded(
            "fashion_mnist",
            target,  # fetches both splits' raw files
            lambda: tvd.FashionMNIST(target, train=True, download=True),
            f"`apt-get install dataset-fashion-mnist` and set data_root to "
            f"{DEBIAN_FASHION_MNIST}, or copy the four idx files from a "
            f"machine with internet access into {os.path.abspath(target)}",
        )
        return _load_fashion_mnist(target, download=False)
    raise _not_found(
        "fashion_mnist",
        root,
        "`apt-get install dataset-fashion-mnist` (installs /usr/share/datasets/fashion-mnist), "
        "or set data_root to a folder holding the idx files, or set `download: true`",
    )


def _check_fashion_mnist(root: str) -> None:
    stems = [
        f"{p}-{k}" for p in ("train", "t10k") for k in ("images-idx3-ubyte", "labels-idx1-ubyte")
    ]
    if any(_find_idx(Path(root), s) is None for s in stems):
        _load_fashion_mnist(root, False)  # raises with the instructions


FASHION_MNIST = Source(_load_fashion_mnist, _check_fashion_mnist)


# --------------------------------------------------------------------------- CIFAR / STL-10


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


@cache
def _torchvision_classes() -> dict[str, type]:
    """torchvision's data set classes, with presence checks instead of the release md5 sums
    (copies that were converted, truncated for tests or re-packed still load; a missing file is
    still reported, before torchvision is ever asked). Built on first use: torchvision is slow
    to import and Fashion-MNIST does not need it."""
    import torchvision.datasets as tvd

    class PresenceCheck:
        def _check_integrity(self) -> bool:
            return not _missing(type(self), self.root)

    class CIFAR10(PresenceCheck, tvd.CIFAR10):
        def __init__(self, root: str, train: bool = True, download: bool = False) -> None:
            # upstream's reading, with CIFAR's pickles read by an unpickler that builds only
            # numpy arrays (upstream unpickles anything)
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

    class CIFAR100(CIFAR10, tvd.CIFAR100):
        pass

    class STL10(PresenceCheck, tvd.STL10):
        pass

    return {"cifar10": CIFAR10, "cifar100": CIFAR100, "stl10": STL10}


def _via_torchvision(
    name: str, root: str, download: bool, splits: dict[str, dict], to_nchw: Callable
) -> dict[str, Split]:
    ds_cls = _torchvision_classes()[name]
    missing = _missing(ds_cls, root)
    if missing and not download:
        howto = _TORCHVISION_HOWTO.format(name=name, folder=ds_cls.base_folder)
        raise _not_found(
            name, os.path.join(root, ds_cls.base_folder), f"{howto} (missing: {', '.join(missing)})"
        )
    if missing:  # fetch the archive first, so that a failed download says what to do
        howto = (
            f"run once with `download: true` on a machine with internet access and copy "
            f"{ds_cls.base_folder}/ from its data_root into {os.path.abspath(root)}"
        )
        first = next(iter(splits.values()))
        _downloaded(name, root, lambda: ds_cls(root, download=True, **first), howto)
    out = {}
    for split, kwargs in splits.items():
        ds = ds_cls(root, download=download, **kwargs)
        labels = ds.targets if hasattr(ds, "targets") else ds.labels
        out[split] = Split(
            np.ascontiguousarray(to_nchw(np.asarray(ds.data)), dtype=np.uint8),
            np.asarray(labels, dtype=np.int64),
        )
    return out


def _hwc_to_chw(x: np.ndarray) -> np.ndarray:
    return x.transpose(0, 3, 1, 2)  # CIFAR's .data is NHWC


def _torchvision_source(
    name: str, folder: str, files: list[str], splits: dict[str, dict], to_nchw: Callable
) -> Source:
    """A torchvision data set; planning checks that ``files`` are in ``<root>/<folder>``."""

    def check(root: str) -> None:
        lost = [f for f in files if not os.path.isfile(os.path.join(root, folder, f))]
        if lost:
            howto = _TORCHVISION_HOWTO.format(name=name, folder=folder)
            raise _not_found(
                name, os.path.join(root, folder), f"{howto} (missing: {', '.join(lost)})"
            )

    return Source(
        lambda root, download: _via_torchvision(name, root, download, splits, to_nchw), check
    )


_TRAIN_TEST = {"train": {"train": True}, "test": {"train": False}}
CIFAR10 = _torchvision_source(
    "cifar10",
    "cifar-10-batches-py",
    [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"],
    _TRAIN_TEST,
    _hwc_to_chw,
)
CIFAR100 = _torchvision_source(
    "cifar100", "cifar-100-python", ["train", "test", "meta"], _TRAIN_TEST, _hwc_to_chw
)
# torchvision already undoes STL's column-major storage and returns NCHW, labels 0-based.
STL10 = _torchvision_source(
    "stl10",
    "stl10_binary",
    ["train_X.bin", "train_y.bin", "test_X.bin", "test_y.bin", "unlabeled_X.bin"],
    {s: {"split": s} for s in ("train", "test", "unlabeled")},
    lambda x: x,
)


# --------------------------------------------------------------------------- Tiny-ImageNet

_TINY_HOWTO = (
    "download http://cs231n.stanford.edu/tiny-imagenet-200.zip and unzip it into the root "
    "(giving <root>/tiny-imagenet-200/wnids.txt, train/, val/)"
)


def _tiny_base(root: str) -> Path:
    for base in (Path(root) / "tiny-imagenet-200", Path(root)):
        if (base / "wnids.txt").is_file() and (base / "train").is_dir() and (base / "val").is_dir():
            return base
    raise _not_found("tiny_imagenet", root, _TINY_HOWTO)


def _tiny_val(val: Path, class_to_idx: dict[str, int]) -> list[tuple[str, int]]:
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    annotations = val / "val_annotations.txt"
    if not annotations.is_file():  # already sorted into val/<wnid>/ (ImageFolder form)
        return make_dataset(str(val), class_to_idx, extensions=IMG_EXTENSIONS, allow_empty=True)
    rows = [line.split("\t") for line in annotations.read_text().splitlines() if line.strip()]
    return [(str(val / "images" / r[0]), class_to_idx[r[1]]) for r in rows]


def _read_images(samples: list[tuple[str, int]], where: Path) -> Split:
    from torchvision.datasets.folder import pil_loader

    if not samples:
        raise _not_found("tiny_imagenet", str(where), _TINY_HOWTO)
    first = np.asarray(pil_loader(samples[0][0]))
    images = np.empty(
        (len(samples), 3, *first.shape[:2]), dtype=np.uint8
    )  # filled in place: 1.2 GB at full size
    for i, (path, _) in enumerate(samples):
        images[i] = np.asarray(pil_loader(path)).transpose(2, 0, 1)  # pil_loader converts to RGB
    return Split(images, np.array([label for _, label in samples], dtype=np.int64))


def _load_tiny_imagenet(root: str, download: bool) -> dict[str, Split]:
    # No download: the archive is not served by torchvision and needs unzipping by hand.
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    base = _tiny_base(root)
    wnids = sorted((base / "wnids.txt").read_text().split())
    class_to_idx = {w: i for i, w in enumerate(wnids)}
    train = make_dataset(
        str(base / "train"), class_to_idx, extensions=IMG_EXTENSIONS, allow_empty=True
    )
    return {
        "train": _read_images(train, base / "train"),
        "test": _read_images(_tiny_val(base / "val", class_to_idx), base / "val"),
    }


TINY_IMAGENET = Source(_load_tiny_imagenet, _tiny_base)
