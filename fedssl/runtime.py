"""Run-time plumbing shared by every stage: device choice, seeds, atomic writes, run metadata."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where it is used: planning and light stages skip it
    import torch


class StageFailed(RuntimeError):
    """An expected failure (missing data set, bad params, a diverged loss): the stage prints
    the message without a traceback and exits 2."""


def check_finite(loss: float, where: str, kept: str) -> None:
    """Stop a training stage whose loss became NaN or infinite, keeping what it saved last."""
    if not math.isfinite(loss):
        raise StageFailed(
            f"the loss is {loss} at {where}: training diverged (lower the learning rate?); {kept}"
        )


def pick_device() -> torch.device:
    """CUDA when present, else CPU; FEDSSL_DEVICE overrides (e.g. 'cpu' on a GPU box)."""
    import torch

    name = os.environ.get("FEDSSL_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from any tuple of values (independent of call order/history)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def numpy_rng(*parts: object) -> np.random.Generator:
    return np.random.default_rng(derive_seed(*parts))


def torch_generator(device: torch.device, *parts: object) -> torch.Generator:
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(*parts))
    return gen


def write_json(path: Path, obj) -> None:
    """Atomic JSON write: a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=float) + "\n")
    os.replace(tmp, path)


def write_tsv(rows: list[dict], path: Path, fields: list[str]) -> None:
    """A per-round / per-epoch log that `dvc plots show` reads (header even when empty)."""
    import csv

    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fields, delimiter="\t")
        writer.writeheader()
        writer.writerows(rows)


def torch_save(obj, path: Path) -> None:
    import torch

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_checkpoint(
    path: Path, fingerprint: str, device: torch.device | str = "cpu"
) -> dict | None:
    """The resume checkpoint at ``path`` if it was written by this very configuration, else
    None (absent, or from other params: a ``fingerprint`` that differs). Loaded with
    ``weights_only=True``: a file holding anything but tensors, numbers, strings and
    containers is refused with a message naming it, and no code in it runs."""
    import pickle

    import torch

    path = Path(path)
    if not path.exists():
        return None
    try:
        ck = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as err:
        raise StageFailed(
            f"{path}: not a checkpoint of plain tensors and numbers, refused "
            f"unread (delete it to start afresh): {err}"
        ) from None
    if not isinstance(ck, dict) or ck.get("fingerprint") != fingerprint:
        print(f"{path.name}: a checkpoint of other params, ignored", flush=True)
        return None
    return ck


@contextmanager
def atomic_dir(final: Path):
    """Yield a scratch directory that replaces ``final`` only if the block succeeds, so a killed
    stage never leaves a plausible-looking output behind."""
    final = Path(final)
    tmp = final.with_name(final.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    if final.exists():
        shutil.rmtree(final) if final.is_dir() else final.unlink()
    os.replace(tmp, final)


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def environment(device: torch.device | None) -> dict:
    """What a run's numbers depend on besides its inputs: versions, device and, on the CPU,
    the thread count (results reproduce to the digit only on the same hardware and threads)."""
    import sys

    from fedssl.hardware import cpu

    env = {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "numpy": np.__version__,
        "pydantic": _version("pydantic"),
        "device": str(device or "cpu"),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
    }
    env.update(cpu())  # model and vector extensions: they pick the float kernels
    if "torch" in sys.modules:  # light stages never load it
        env["torch_threads"] = sys.modules["torch"].get_num_threads()
    for var in ("FEDSSL_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY"):
        if os.environ.get(var):
            env[var] = os.environ[var]
    if device is not None and device.type == "cuda":
        import torch

        env["gpu"] = torch.cuda.get_device_name(device)
    return env


class PeakMemory:
    """Peak memory of a block: CUDA allocator peak on GPU, process max-RSS on CPU."""

    def __init__(self, device: torch.device | None):
        self.cuda = device is not None and device.type == "cuda"
        self.device = device

    def __enter__(self):
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc):
        if self.cuda:
            import torch

            self.bytes = torch.cuda.max_memory_allocated(self.device)
            self.kind = "cuda_max_allocated"
        else:
            import resource

            self.bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.kind = "cpu_max_rss"
        return False


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start
        return False
