"""Fashion-MNIST (Xiao et al., 2017): the embedded default, read from Debian's package
``dataset-fashion-mnist`` (the original idx.gz files), torchvision's ``FashionMNIST/raw`` or
a flat folder of idx files, gzipped or not."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from fedssl.data.sets import (
    DataNotFound,
    DatasetSpec,
    Source,
    Split,
    downloaded,
    not_found,
    register,
)

# Where Debian's package dataset-fashion-mnist installs the idx files (a read-only system folder):
# the data set's default root.
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


def _raw_train_size(root: str) -> int | None:
    """The training samples the idx labels file under ``root`` holds, read from its header."""
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

        downloaded(
            "fashion_mnist",
            target,  # fetches both splits' raw files
            lambda: tvd.FashionMNIST(target, train=True, download=True),
            f"`apt-get install dataset-fashion-mnist` and set data_root to "
            f"{DEBIAN_FASHION_MNIST}, or copy the four idx files from a "
            f"machine with internet access into {os.path.abspath(target)}",
        )
        return _load_fashion_mnist(target, download=False)
    raise not_found(
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


FASHION_MNIST = Source(_load_fashion_mnist, _check_fashion_mnist, _raw_train_size)


register(
    DatasetSpec(
        "fashion_mnist",
        "F-MNIST",
        10,
        (1, 28, 28),
        60000,
        "fedssl.data.sets.fashion_mnist:FASHION_MNIST",
        default_root=DEBIAN_FASHION_MNIST,  # Debian's dataset-fashion-mnist
    )
)
