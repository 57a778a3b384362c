"""The prepared-data artifact: per split, a uint8 image array [N, C, H, W] and int64 labels,
stored as plain .npy (memory-mappable), described with SHA-256 checksums in dataset.json."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np


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


def load_split(data_dir: Path, split: str, verify: bool = False) -> tuple[np.ndarray, np.ndarray]:
    data_dir = Path(data_dir)
    images = np.load(data_dir / f"{split}_images.npy", mmap_mode="r")
    labels = np.load(data_dir / f"{split}_labels.npy")
    if verify:
        meta = json.loads((data_dir / "dataset.json").read_text())["splits"][split]
        if sha256(np.asarray(images)) != meta["images_sha256"]:
            raise ValueError(f"{data_dir}/{split}_images.npy does not match its checksum")
    return images, labels


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
    (``clients.npz``), or into the test split (``test_clients.npz``, personalised evaluation)."""
    with np.load(Path(partition_dir) / name) as z:
        return [z[f"client_{i}"] for i in range(len(z.files))]
