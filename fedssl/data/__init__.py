"""Data sets: one file each with its reader and entry (:mod:`.sets`, found by the registry
:mod:`.catalog`), partitions, augmentation; and here the prepared-data artifact every stage
reads: per split, a uint8 image array [N, C, H, W] and int64 labels, stored as plain .npy
(memory-mappable), described with SHA-256 checksums in dataset.json."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np

from fedssl.stage.runtime import ArtifactError


def sha256(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).data).hexdigest()


def write_prepared(out_dir: Path, name: str, splits: dict) -> dict:
    """Write every split; returns the summary that goes into meta.json."""
    summary = {"dataset": name, "splits": {}}
    for split, (images, labels) in splits.items():
        images = np.ascontiguousarray(images, dtype=np.uint8)
        labels = np.ascontiguousarray(labels, dtype=np.int64)
        np.save(out_dir / f"{split}_images.npy", images)
        np.save(out_dir / f"{split}_labels.npy", labels)
        summary["splits"][split] = {
            "count": int(len(labels)),
            "shape": list(images.shape[1:]),
            "images_sha256": sha256(images),
            "labels_sha256": sha256(labels),
            "num_classes": int(labels.max()) + 1 if (labels >= 0).any() else 0,
        }
    (out_dir / "dataset.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


RERUN = "rerun the stage that writes it (or `dvc checkout` it)"  # a damaged artifact's remedy
# a partition's per-client validation indices into the training split (client_tests'
# validation_per_client)
VALIDATION_CLIENTS = "val_clients.npz"


def load_split(data_dir: Path, split: str, verify: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A prepared split's images (memory-mapped) and labels; ``verify``: compare both with the
    SHA-256 recorded in dataset.json (the stage runtime checks every input file this way
    before a stage starts, :func:`fedssl.stage.base.verify_inputs`)."""
    data_dir = Path(data_dir)
    images = _load(data_dir / f"{split}_images.npy", mmap_mode="r")
    labels = _load(data_dir / f"{split}_labels.npy")
    if verify:
        meta = json.loads((data_dir / "dataset.json").read_text())["splits"][split]
        for kind, array in (("images", images), ("labels", labels)):
            if sha256(np.asarray(array)) != meta[f"{kind}_sha256"]:
                raise ArtifactError(
                    f"{data_dir}/{split}_{kind}.npy: does not match the checksum in "
                    f"{data_dir}/dataset.json: prepare the data set again"
                )
    return images, labels


def _load(path: Path, **kwargs):
    """``np.load`` of an artifact, its failures (an object array, which would need pickle; a
    damaged file) said in one line naming it."""
    try:
        return np.load(path, **kwargs)
    except (ValueError, EOFError, OSError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise ArtifactError(
            f"{path}: not a plain array file ({str(err).splitlines()[0]}): {RERUN}"
        ) from None


def load_npz(
    path: Path, keys: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, np.ndarray]:
    """The arrays ``keys`` of an ``.npz`` artifact, and those of ``optional`` it holds, read
    now; a damaged file, an object array (which would need pickle) or a missing array said in
    one line naming the file."""
    import zlib

    try:
        with np.load(path) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise ArtifactError(f"{path}: holds no array '{missing[0]}': {RERUN}")
            return {k: z[k] for k in (*keys, *(k for k in optional if k in z.files))}
    except (FileNotFoundError, ArtifactError):
        raise
    except (ValueError, EOFError, OSError, zipfile.BadZipFile, zlib.error) as err:
        raise ArtifactError(
            f"{path}: not a file of plain arrays ({str(err).splitlines()[0]}): {RERUN}"
        ) from None


def image_shape(data_dir: Path, split: str = "train") -> tuple[int, int, int]:
    meta = json.loads((Path(data_dir) / "dataset.json").read_text())
    return tuple(meta["splits"][split]["shape"])


def to_device(images: np.ndarray, device):
    """The whole split as one uint8 tensor on the training device (batches are index gathers)."""
    import torch

    return torch.from_numpy(np.array(images, copy=True)).to(device)


def save_clients(path: Path, clients: list[np.ndarray]) -> None:
    np.savez(path, **{f"client_{i}": c for i, c in enumerate(clients)})


def load_clients(partition_dir: Path, name: str = "clients.npz") -> list[np.ndarray]:
    """Per-client index arrays as the partition stage wrote them: into the training split
    (``clients.npz``, the validation images' ``val_clients.npz``), or into the test split
    (``test_clients.npz``, personalised evaluation)."""
    path = Path(partition_dir) / name
    try:
        with np.load(path) as z:
            return [z[f"client_{i}"] for i in range(len(z.files))]
    except (ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
        raise ArtifactError(
            f"{path}: not the partition's client index file ({str(err).splitlines()[0]}): "
            f"rerun the partition stage (or `dvc checkout` it)"
        ) from None
