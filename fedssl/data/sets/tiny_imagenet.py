"""Tiny-ImageNet (200 classes, 64x64), from its unzipped archive (the official
``tiny-imagenet-200`` folder tree)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedssl.data.sets import DatasetSpec, Source, Split, not_found, register

_TINY_HOWTO = (
    "download http://cs231n.stanford.edu/tiny-imagenet-200.zip and unzip it into the root "
    "(giving <root>/tiny-imagenet-200/wnids.txt, train/, val/)"
)


def _tiny_base(root: str) -> Path:
    for base in (Path(root) / "tiny-imagenet-200", Path(root)):
        if (base / "wnids.txt").is_file() and (base / "train").is_dir() and (base / "val").is_dir():
            return base
    raise not_found("tiny_imagenet", root, _TINY_HOWTO)


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
        raise not_found("tiny_imagenet", str(where), _TINY_HOWTO)
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


register(
    DatasetSpec(
        "tiny_imagenet",
        "Tiny",
        200,
        (3, 64, 64),
        100000,
        "fedssl.data.sets.tiny_imagenet:TINY_IMAGENET",
        downloadable=False,  # the archive needs unzipping by hand
    )
)
