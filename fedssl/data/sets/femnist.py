"""FEMNIST in LEAF's on-disk format: its reader, and the letters a-j that MpFedcon / FedRep use.

LEAF (``github.com/TalwalkarLab/leaf``, ``data/femnist``) writes ``data/train/*.json`` and
``data/test/*.json``; each file holds ``users``, ``num_samples`` and ``user_data: {user: {x:
[[784 floats in [0, 1]], ...], y: [labels]}}``. Labels are 0-9 digits, 10-35 upper-case and
36-61 lower-case letters; pixels are NIST's grey levels / 255 (white background = 1.0), kept
as they are here (scaled back to uint8).

MpFedcon's parties (FedRep's sampler: the writers ignored, party ``i`` given the letters
``(i + j) mod 10``, a log-normal number of images) are a partition scheme,
``cyclic_lognormal`` in :mod:`fedssl.data.partition`; this module only reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from fedssl.data.sets import DataNotFound, DatasetSpec, Source, Split, register

LOWERCASE_OFFSET = 36  # LEAF label of 'a'
IMAGE_SIDE = 28

_HOWTO = (
    "clone https://github.com/TalwalkarLab/leaf, run `./preprocess.sh -s niid --sf 1.0 -k 0 "
    "-t sample` in leaf/data/femnist (it downloads NIST SD19 and writes data/train/*.json and "
    "data/test/*.json), and point the root at that femnist folder"
)


class FemnistSplit(NamedTuple):
    images: np.ndarray  # uint8 [N, 1, 28, 28]
    labels: np.ndarray  # int64 [N], LEAF's 62-class labels
    users: np.ndarray  # int64 [N], index into user_ids of the writer of each image
    user_ids: list[str]  # every user of both splits, sorted


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


def load_femnist(root: str) -> dict[str, FemnistSplit]:
    """Both LEAF splits as ``{'train': FemnistSplit, 'test': FemnistSplit}``."""
    dirs = _found_split_dirs(root)
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
            "files (see fedssl/data/sets/femnist.py) and set download: false"
        )
    out = {}
    for split, data in load_femnist(root).items():
        keep = (data.labels >= LOWERCASE_OFFSET) & (data.labels < LOWERCASE_OFFSET + 10)
        out[split] = Split(data.images[keep], data.labels[keep] - LOWERCASE_OFFSET)
    return out


FEMNIST = Source(_load_letters, _found_split_dirs)


def per_user(split: FemnistSplit) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{user id: (images, labels)}`` for the users present in ``split``."""
    return {
        split.user_ids[u]: (split.images[split.users == u], split.labels[split.users == u])
        for u in np.unique(split.users)
    }


register(
    DatasetSpec(
        "femnist",
        "FEMNIST",
        10,  # LEAF's letters a-j
        (1, 28, 28),
        None,  # depends on the sampling options LEAF's preprocess.sh was run with
        "fedssl.data.sets.femnist:FEMNIST",
        downloadable=False,  # built with LEAF's scripts
    )
)
