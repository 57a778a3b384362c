"""Tiny data sets written in each data set's real on-disk format: the one home of the writers
that the readers' tests (test_sources, test_datasets, test_femnist) and the pipelines'
rehearsal (tests/rehearsal.py) use. Every writer returns what it wrote, split by split, as
(images [N, C, H, W] uint8, labels) in the order the files hold them."""

from __future__ import annotations

import gzip
import json
import pickle
import struct
from pathlib import Path

import numpy as np

LETTER_A = 36  # LEAF: 0-9 digits, 10-35 upper case, 36-61 lower case


def pixels(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.integers(0, 256, size=shape, dtype=np.uint8)


def labels_cycling(rng: np.random.Generator, n: int, classes: int) -> np.ndarray:
    """``n`` labels covering the classes as evenly as ``n`` allows, in random order."""
    return rng.permutation(np.arange(n) % classes)


# --------------------------------------------------------------------------- Fashion-MNIST (idx)
def idx_bytes(array: np.ndarray) -> bytes:
    """The idx format: two zero bytes, type 0x08 (uint8), ndim, big-endian int32 dims, data."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">i", d) for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_fashion_mnist(folder: Path, splits: dict, gz: bool = True) -> None:
    """``splits``: {'train'|'t10k': (images [N, 28, 28] uint8, labels [N])}."""
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, (images, labels) in splits.items():
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            name = folder / f"{prefix}-{kind}-ubyte"
            if gz:
                with gzip.open(f"{name}.gz", "wb") as f:
                    f.write(idx_bytes(array))
            else:
                name.write_bytes(idx_bytes(array))


def write_random_fashion_mnist(
    folder: Path, n_train: int = 5, n_test: int = 3, gz: bool = True, seed: int = 0
) -> dict:
    rng = np.random.default_rng(seed)
    data = {
        prefix: (pixels(rng, n, 28, 28), labels_cycling(rng, n, 10))
        for prefix, n in (("train", n_train), ("t10k", n_test))
    }
    write_fashion_mnist(folder, data, gz)
    return data


# --------------------------------------------------------------------------- CIFAR (pickles)
class _Py2Pickler(pickle._Pickler):
    """Writes bytes as Python 2 ``str`` opcodes, as the cPickle that made the CIFAR files did.

    That is why the keys read back as b'data' with encoding='bytes' and as 'data' with the
    encoding='latin1' torchvision uses; Python 3 ``bytes`` would stay bytes under both.
    """

    dispatch = dict(pickle._Pickler.dispatch)

    def _save_py2_str(self, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = _save_py2_str


def _dump_py2(obj: dict, path: Path) -> None:
    with open(path, "wb") as f:
        _Py2Pickler(f, protocol=2).dump(obj)


def _cifar_batch(rng, labels: np.ndarray, label_key: bytes) -> tuple[dict, np.ndarray, list]:
    n = len(labels)
    images = pixels(rng, n, 3, 32, 32)
    labels = [int(x) for x in labels]
    # Each row holds the 1024 red, then green, then blue values of one image, rows in
    # row-major order.
    batch = {
        b"batch_label": b"fixture",
        label_key: labels,
        b"data": images.reshape(n, 3072),
        b"filenames": [b"img_%d.png" % i for i in range(n)],
    }
    return batch, images, labels


def write_cifar10(root: Path, n_train: int = 8, n_test: int = 2, seed: int = 0) -> dict:
    """``cifar-10-batches-py/``: the training images over the five data batches."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    train_images, train_labels = [], []
    for i, part in enumerate(np.array_split(labels_cycling(rng, n_train, 10), 5), start=1):
        batch, images, labels = _cifar_batch(rng, part, b"labels")
        _dump_py2(batch, folder / f"data_batch_{i}")
        train_images.append(images)
        train_labels += labels
    batch, test_images, test_labels = _cifar_batch(rng, labels_cycling(rng, n_test, 10), b"labels")
    _dump_py2(batch, folder / "test_batch")
    meta = {
        b"label_names": [b"c%d" % i for i in range(10)],
        b"num_cases_per_batch": 10000,
        b"num_vis": 3072,
    }
    _dump_py2(meta, folder / "batches.meta")
    return {
        "train": (np.concatenate(train_images), train_labels),
        "test": (test_images, test_labels),
    }


def write_cifar100(root: Path, n_train: int = 4, n_test: int = 3, seed: int = 0) -> dict:
    """``cifar-100-python/``: train, test (fine and coarse labels) and meta."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    out = {}
    for name, n in (("train", n_train), ("test", n_test)):
        batch, images, labels = _cifar_batch(rng, labels_cycling(rng, n, 100), b"fine_labels")
        batch[b"coarse_labels"] = [label // 5 for label in labels]
        _dump_py2(batch, folder / name)
        out[name] = (images, labels)
    meta = {
        b"fine_label_names": [b"f%d" % i for i in range(100)],
        b"coarse_label_names": [b"c%d" % i for i in range(20)],
    }
    _dump_py2(meta, folder / "meta")
    return out


# --------------------------------------------------------------------------- STL-10 (binaries)
def _stl_bytes(images: np.ndarray) -> bytes:
    # STL-10 stores each channel of each image column by column (Fortran order).
    return b"".join(channel.tobytes(order="F") for image in images for channel in image)


def write_stl10(
    root: Path, n_train: int = 3, n_test: int = 2, n_unlabeled: int = 2, seed: int = 0
) -> dict:
    """``stl10_binary/``: {split}_X.bin, {split}_y.bin (labels 1..10 on disk, 10 first), class
    names. Returns the labels as written (1..10; None for the unlabelled split)."""
    rng = np.random.default_rng(seed)
    folder = root / "stl10_binary"
    folder.mkdir(parents=True)
    data = {
        "train": (pixels(rng, n_train, 3, 96, 96), 10 - labels_cycling(rng, n_train, 10)),
        "test": (pixels(rng, n_test, 3, 96, 96), 10 - labels_cycling(rng, n_test, 10)),
        "unlabeled": (pixels(rng, n_unlabeled, 3, 96, 96), None),
    }
    for split, (images, labels) in data.items():
        (folder / f"{split}_X.bin").write_bytes(_stl_bytes(images))
        if labels is not None:
            (folder / f"{split}_y.bin").write_bytes(labels.astype(np.uint8).tobytes())
    (folder / "class_names.txt").write_text("\n".join(f"class{i}" for i in range(10)) + "\n")
    return data


# --------------------------------------------------------------------------- Tiny-ImageNet (JPEGs)
def _jpeg(path: Path, colour: tuple[int, int, int], grey: bool = False) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", (64, 64), colour)
    (image.convert("L") if grey else image).save(path, "JPEG", quality=95)


def write_tiny_imagenet(
    base: Path,
    train: list[tuple[str, int]],
    val: list[str],
    colours: dict[str, tuple[int, int, int]],
    val_sorted: bool = False,
    grey: tuple[str, ...] = (),
) -> tuple[list, list]:
    """The folder ``base`` (tiny-imagenet-200/): wnids.txt in the order of ``colours``;
    train/<wnid>/images/ with ``count`` solid-colour JPEGs per (wnid, count) (those of ``grey``
    saved grey) and their boxes; val/images/ with val_annotations.txt, or val/<wnid>/ when
    ``val_sorted``; an empty test/. Returns the train and val wnids in the order written."""
    base.mkdir(parents=True)
    (base / "wnids.txt").write_text("\n".join(colours) + "\n")
    for wnid, count in train:
        for i in range(count):
            image = base / "train" / wnid / "images" / f"{wnid}_{i}.JPEG"
            _jpeg(image, colours[wnid], grey=wnid in grey)
        (base / "train" / wnid / f"{wnid}_boxes.txt").write_text(f"{wnid}_0.JPEG\t0\t0\t63\t63\n")
    rows = []
    for i, wnid in enumerate(val):
        name = f"val_{i}.JPEG"
        _jpeg(base / "val" / (wnid if val_sorted else "images") / name, colours[wnid])
        rows.append(f"{name}\t{wnid}\t0\t0\t63\t63")
    if not val_sorted:
        (base / "val" / "val_annotations.txt").write_text("\n".join(rows) + "\n")
    (base / "test" / "images").mkdir(parents=True)  # official test split: unlabelled, ignored
    return [w for w, n in train for _ in range(n)], val


def write_random_tiny_imagenet(
    root: Path, classes: int = 3, per_class: int = 2, val_per_class: int = 1, seed: int = 0
) -> tuple[list, list]:
    """``tiny-imagenet-200/`` with ``classes`` wnids of random solid colours."""
    rng = np.random.default_rng(seed)
    colours = {f"n{i:08d}": tuple(int(v) for v in rng.integers(0, 256, 3)) for i in range(classes)}
    val = [w for w in colours for _ in range(val_per_class)]
    train = [(w, per_class) for w in colours]
    return write_tiny_imagenet(root / "tiny-imagenet-200", train, val, colours)


# --------------------------------------------------------------------------- FEMNIST (LEAF json)
def write_leaf_file(path: Path, users: dict[str, tuple[np.ndarray, list[int]]]) -> None:
    """One LEAF json: pixels as floats in [0, 1], 784 per image, row-major."""
    blob = {
        "users": list(users),
        "num_samples": [len(y) for _, y in users.values()],
        "user_data": {
            u: {"x": (x.reshape(len(y), -1) / 255).tolist(), "y": list(y)}
            for u, (x, y) in users.items()
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(blob))


def write_femnist(root: Path, writers: int = 1, per_writer: int = 11, seed: int = 0) -> None:
    """``data/{train,test}/x.json``: each writer's images cycle over the letters a-j, with a
    digit among them (the reader drops it)."""
    rng = np.random.default_rng(seed)
    for split in ("train", "test"):
        users = {}
        for w in range(writers):
            letters = [LETTER_A + k % 10 for k in range(per_writer - 1)] + [3]
            users[f"w{w}"] = (pixels(rng, per_writer, 28, 28), letters)
        write_leaf_file(root / "data" / split / "x.json", users)


# Each registered data set's writer with the sizes its readers' tests use: ``writer(root)``.
WRITERS = {
    "fashion_mnist": write_random_fashion_mnist,
    "cifar10": write_cifar10,
    "cifar100": write_cifar100,
    "stl10": write_stl10,
    "tiny_imagenet": write_random_tiny_imagenet,
    "femnist": write_femnist,
}
