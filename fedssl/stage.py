"""The stage contract, in one place: validate params before any compute, write the declared
output directory atomically, record what ran (meta.json with the DAG fingerprint)."""
from __future__ import annotations

import os
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch

from fedssl.params import ParamsError
from fedssl.pipeline import output_digest
from fedssl.runtime import PeakMemory, atomic_dir, environment, pick_device, write_json

RESUME_DIR = Path("artifacts/.resume")  # checkpoints of unfinished stages, outside all outputs


class StageFailed(RuntimeError):
    """An expected failure (missing data set, bad params): printed without a traceback."""


def set_threads() -> None:
    threads = int(os.environ.get("FEDSSL_THREADS", "0"))
    if threads > 0:
        torch.set_num_threads(threads)


@contextmanager
def stage_run(dag, name: str):
    """Run stage ``name`` of ``dag``: yields (stage, scratch output dir, device, info
    dict); on success the scratch dir becomes the stage's output with meta.json in it."""
    stage = dag.stages[name]
    fingerprint = dag.fingerprint(name)
    device = pick_device()
    set_threads()
    info: dict = {}
    start = time.time()
    with atomic_dir(Path(stage.out)) as out:
        with PeakMemory(device) as peak:
            yield stage, out, device, info
        info.setdefault("wall_seconds", round(time.time() - start, 2))
        write_json(out / "meta.json", {
            "stage": name, "fingerprint": fingerprint,
            "output_digest": output_digest(stage, out), "command": stage.cmd,
            "params": dag.param_values(stage), "environment": environment(device),
            "peak_memory_bytes": peak.bytes, "peak_memory_kind": peak.kind,
            "threads": torch.get_num_threads(), **info})


def resume_path(name: str) -> Path:
    RESUME_DIR.mkdir(parents=True, exist_ok=True)
    return RESUME_DIR / f"{name}.pt"


def main_guard(body) -> None:
    """Run a stage's body; params and data problems exit 2 with a one-paragraph message."""
    try:
        body(sys.argv[1:])
    except (ParamsError, StageFailed, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.exit(130)
