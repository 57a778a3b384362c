"""FEMNIST in LEAF's on-disk format, and the MpFedcon / FedRep party split of its letters a-j.

LEAF (``github.com/TalwalkarLab/leaf``, ``data/femnist``) writes ``data/train/*.json`` and
``data/test/*.json``; each file holds ``users``, ``num_samples`` and ``user_data: {user: {x:
[[784 floats in [0, 1]], ...], y: [labels]}}``. Labels are 0-9 digits, 10-35 upper-case and
36-61 lower-case letters; pixels are NIST's grey levels / 255 (white background = 1.0), kept
as they are here (scaled back to uint8).

:func:`femnist_parties` rebuilds the partition MpFedcon takes from FedRep (mpfedcon spec §4):
the writers are ignored, images of the letters a-j are pooled per letter, party ``i`` gets the
letters ``(i + j) mod 10`` for ``j < classes_per_party``, a log-normal number of images split
evenly over them, and keeps 90 % for training and 10 % for testing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from fedssl.data.catalog import dataset_spec
from fedssl.data.partition import deal
from fedssl.data.sources import DataNotFound, Source, Split

DEFAULT_ROOT = dataset_spec("femnist").root
LOWERCASE_OFFSET = 36  # LEAF label of 'a'
IMAGE_SIDE = 28

_HOWTO = (
    "clone https://github.com/TalwalkarLab/leaf, run `./preprocess.sh -s niid --sf 1.0 -k 0 "
    "-t sample` in leaf/data/femnist (it downloads NIST SD19 and writes data/train/*.json and "
    "data/test/*.json), and point the root at that femnist folder"
)

__all__ = [
    "FemnistSplit",
    "FemnistParties",
    "load_femnist",
    "per_user",
    "femnist_parties",
    "DEFAULT_ROOT",
]


class FemnistSplit(NamedTuple):
    images: np.ndarray  # uint8 [N, 1, 28, 28]
    labels: np.ndarray  # int64 [N], LEAF's 62-class labels
    users: np.ndarray  # int64 [N], index into user_ids of the writer of each image
    user_ids: list[str]  # every user of both splits, sorted


class FemnistParties(NamedTuple):
    images: np.ndarray  # uint8 [P, 1, 28, 28], the pooled letters
    labels: np.ndarray  # int64 [P], letter index 0..len(letters)-1
    train: list[np.ndarray]  # per party, indices into images (may repeat across parties)
    test: list[np.ndarray]
    classes: np.ndarray  # int64 [parties, classes_per_party]


# --------------------------------------------------------------------------- loading
def _split_dirs(root: Path) -> dict[str, Path] | None:
    """Accept the femnist folder, its data/ folder, or any folder holding train/ and test/."""
    for base in (root / "data", root):
        dirs = {s: base / s for s in ("train", "test")}
        if all(d.is_dir() and any(d.glob("*.json")) for d in dirs.values()):
            return dirs
    return None


def _read_split(folder: Path) -> tuple[list[np.ndarray], list[np.ndarray], list[str]]:
    images, labels, owners = [], [], []
    for path in sorted(folder.glob("*.json")):
        with open(path) as f:
            blob = json.load(f)
        for user in blob["users"]:
            record = blob["user_data"][user]
            x = np.asarray(record["x"], dtype=np.float64).reshape(-1, 1, IMAGE_SIDE, IMAGE_SIDE)
            images.append(np.rint(np.clip(x, 0.0, 1.0) * 255).astype(np.uint8))
            labels.append(np.asarray(record["y"], dtype=np.int64))
            owners.extend([user] * len(record["y"]))
    return images, labels, owners


def _found_split_dirs(root: str) -> dict[str, Path]:
    dirs = _split_dirs(Path(root))
    if dirs is None:
        raise DataNotFound(
            f"femnist not found at {os.path.abspath(root)} (need data/train/*.json "
            f"and data/test/*.json). To get it: {_HOWTO}."
        )
    return dirs


def load_femnist(root: str | None = None) -> dict[str, FemnistSplit]:
    """Both LEAF splits as ``{'train': FemnistSplit, 'test': FemnistSplit}``."""
    dirs = _found_split_dirs(root or DEFAULT_ROOT)
    read = {s: _read_split(d) for s, d in dirs.items()}
    user_ids = sorted({u for _, _, owners in read.values() for u in owners})
    index = {u: i for i, u in enumerate(user_ids)}
    out = {}
    for split, (images, labels, owners) in read.items():
        out[split] = FemnistSplit(
            np.concatenate(images)
            if images
            else np.empty((0, 1, IMAGE_SIDE, IMAGE_SIDE), np.uint8),
            np.concatenate(labels) if labels else np.empty(0, np.int64),
            np.array([index[u] for u in owners], dtype=np.int64),
            user_ids,
        )
    return out


def _load_letters(root: str, download: bool) -> dict[str, Split]:
    """LEAF's FEMNIST reduced to the lower-case letters a-j (MpFedcon / FedRep), labels 0-9,
    LEAF's own train / test splits; the writers are dropped (a partition deals the images)."""
    if download:
        raise DataNotFound(
            "femnist cannot be downloaded by the pipeline: build LEAF's json "
            "files (see fedssl/data/femnist.py) and set download: false"
        )
    out = {}
    for split, data in load_femnist(root).items():
        keep = (data.labels >= LOWERCASE_OFFSET) & (data.labels < LOWERCASE_OFFSET + 10)
        out[split] = Split(data.images[keep], data.labels[keep] - LOWERCASE_OFFSET)
    return out


FEMNIST = Source(_load_letters, _found_split_dirs)  # the registry's entry "femnist" reads this


def per_user(split: FemnistSplit) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{user id: (images, labels)}`` for the users present in ``split``."""
    return {
        split.user_ids[u]: (split.images[split.users == u], split.labels[split.users == u])
        for u in np.unique(split.users)
    }


# --------------------------------------------------------------------------- MpFedcon parties
def _letter_pool(
    data: dict[str, FemnistSplit], letters: str, max_per_class: int | None, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Every image of the chosen lower-case letters from all splits, relabelled 0..L-1.

    Each letter's images are shuffled and, like FedRep's sampler, capped at ``max_per_class``.
    """
    images = np.concatenate([s.images for s in data.values()])
    leaf_labels = np.concatenate([s.labels for s in data.values()])
    keep_images, keep_labels = [], []
    for new_label, letter in enumerate(letters):
        leaf_label = LOWERCASE_OFFSET + ord(letter) - ord("a")
        rows = rng.permutation(np.flatnonzero(leaf_labels == leaf_label))
        if rows.size == 0:
            raise ValueError(f"no images of letter {letter!r} in the loaded FEMNIST data")
        rows = rows[:max_per_class]
        keep_images.append(images[rows])
        keep_labels.append(np.full(rows.size, new_label, dtype=np.int64))
    return np.concatenate(keep_images), np.concatenate(keep_labels)


def _party_sizes(
    num_parties: int, mean: float, sigma: float, offset: float, rng: np.random.Generator
) -> np.ndarray:
    return rng.lognormal(mean, sigma, size=num_parties) + offset


def femnist_parties(
    data: dict[str, FemnistSplit],
    num_parties: int = 150,
    classes_per_party: int = 3,
    letters: str = "abcdefghij",
    lognormal_mean: float = 4.0,
    lognormal_sigma: float = 1.0,
    size_offset: float = 100.0,
    test_fraction: float = 0.1,
    max_per_class: int | None = 4000,
    min_per_class: int = 2,
    seed: int = 0,
) -> FemnistParties:
    """MpFedcon's FEMNIST (150, 3) split (see the module docstring).

    Party ``i`` draws ``size_i ~ lognormal(mean, sigma) + offset`` and takes
    ``max(min_per_class, floor(size_i / classes_per_party))`` images of each of its letters,
    consecutively from that letter's shuffled pool (wrapping around with a reshuffle when it
    runs out, so images are shared between parties only then). Its images are shuffled and the
    first ``floor((1 - test_fraction) * n)`` are its training set.
    """
    if not 1 <= classes_per_party <= len(letters):
        raise ValueError(f"classes_per_party={classes_per_party} must lie in [1, {len(letters)}]")
    if not 0 <= test_fraction < 1:
        raise ValueError(f"test_fraction must lie in [0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    images, labels = _letter_pool(data, letters, max_per_class, rng)
    pools = {c: np.flatnonzero(labels == c) for c in range(len(letters))}
    cursors = dict.fromkeys(pools, 0)
    sizes = _party_sizes(num_parties, lognormal_mean, lognormal_sigma, size_offset, rng)

    train, test, classes = [], [], []
    for party, size in enumerate(sizes):
        mine = [(party + j) % len(letters) for j in range(classes_per_party)]
        per_class = max(min_per_class, int(size // classes_per_party))
        rows = []
        for c in mine:
            taken, pools[c], cursors[c] = deal(pools[c], cursors[c], per_class, rng)
            rows.append(taken)
        rows = rng.permutation(np.concatenate(rows))
        cut = int(np.floor((1 - test_fraction) * rows.size + 1e-9))  # 0.9 * 70 is 63.000...01
        train.append(rows[:cut])
        test.append(rows[cut:])
        classes.append(mine)
    return FemnistParties(images, labels, train, test, np.asarray(classes, dtype=np.int64))
