"""The stage contract, in one place: validate params before any compute, write the declared
output directory atomically, record what ran (meta.json with the stage's fingerprint).

A stage script builds a :class:`StageContext` for its stage and runs its body inside
:meth:`StageContext.run`. The context reads the stage's plan record (:mod:`fedssl.plan.record`:
its command, params keys, inputs, outputs, code), not the DAG, so the planner is no code of any
stage. It gives the body its validated params, where its inputs are, a scratch output folder,
the device, and the ``info`` dict that ends up in meta.json. torch is imported only by stages
that compute with it. It implements :class:`fedssl.contract.StepContext`, the type the method
plugins name.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from functools import cached_property
from pathlib import Path

from fedssl.hardware import computed_on
from fedssl.params import ParamsError
from fedssl.plan.fingerprint import output_digest
from fedssl.plan.layout import data_dir, experiment_dir, partition_dir, results_dir
from fedssl.plan.record import (
    PRECISION,
    fingerprint,
    fingerprint_inputs,
    read_record,
    values_digest,
    write_records,
)
from fedssl.presets import command_line_overrides
from fedssl.runtime import PeakMemory, StageFailed, atomic_dir, environment, pick_device, write_json

RESUME_DIR = Path("artifacts/.resume")  # checkpoints of unfinished stages, outside all outputs
# How each stage's last run went (wall time, memory, device, host): kept apart from its outputs,
# which hold only what the inputs determine, so an identical rerun leaves identical outputs
# (and an unchanged dvc.lock).
RUNS_DIR = Path("artifacts/.runs")
__all__ = ["StageContext", "StageFailed", "main_guard", "RESUME_DIR", "RUNS_DIR", "run_record"]


class StageContext:
    """Stage ``<kind>__<name>`` of the project under ``params/``."""

    def __init__(self, kind: str, name: str):
        self.record = plan_record(kind, name)
        self.stage_name = self.record["stage"]
        # a shared stage runs with the params of the experiment that owns its content
        self.kind, self.name = kind, self.record["name"]
        self.out: Path | None = None  # the scratch output folder, inside run()
        self.device = None
        self.info: dict = {}  # facts of the output, into meta.json
        self.run_info: dict = {}  # facts of this run (timings, resumes), into its run record

    # ------------------------------------------------------------------ params
    @cached_property
    def presets(self):
        from fedssl.presets import Presets

        return Presets()

    @cached_property
    def exp(self):
        return self.presets.load("experiment", self.name)

    @cached_property
    def partition(self):
        return self.presets.load("partition", self.exp.partition)

    @cached_property
    def dataset_name(self) -> str:
        """The data set preset the experiment's partition splits."""
        return self.partition.dataset

    @cached_property
    def method(self):
        """The experiment's method plugin (the registry is imported by name: it is code of
        every stage that loads an experiment's params, through the experiment model)."""
        return importlib.import_module("fedssl.methods.registry").get(self.exp.method.name)

    # ------------------------------------------------------------------ where things are
    @property
    def data_dir(self) -> Path:
        return Path(data_dir(self.dataset_name))

    @property
    def partition_dir(self) -> Path:
        return Path(partition_dir(self.exp.partition))

    @property
    def exp_dir(self) -> Path:
        return Path(experiment_dir(self.name))

    @property
    def results_dir(self) -> Path:
        path = Path(results_dir(self.name))
        path.mkdir(parents=True, exist_ok=True)
        return path

    def input(self, step: str) -> Path:
        """The output folder of the upstream stage of kind ``step`` (an earlier step of this
        experiment's method, or one it shares with another experiment)."""
        for upstream in self.record["inputs"].values():
            if upstream["kind"] == step:
                return Path(upstream["out"])
        raise KeyError(f"{self.stage_name} reads no '{step}' stage")

    @property
    def output_dir(self) -> Path:
        """Where the stage's output goes when it succeeds (``out`` is its scratch copy)."""
        return Path(self.record["outputs"]["out"])

    @property
    def committed(self) -> list[str]:
        """The small result files it writes under ``results/`` (DVC outs, cache: false)."""
        outputs = self.record["outputs"]
        return outputs["results"] + outputs["metrics"] + outputs["plots"]

    @property
    def resume_path(self) -> Path:
        RESUME_DIR.mkdir(parents=True, exist_ok=True)
        return RESUME_DIR / f"{self.stage_name}.pt"

    @cached_property
    def fingerprint_inputs(self) -> dict:
        """What the output depends on (:func:`fedssl.plan.record.fingerprint_inputs`), as the
        stage starts."""
        return fingerprint_inputs(self.record, raw_values(self.record["params"]))

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.fingerprint_inputs)

    # ------------------------------------------------------------------ data
    @cached_property
    def image_shape(self) -> tuple[int, int, int]:
        from fedssl.data.store import image_shape

        return image_shape(self.data_dir)

    def split(self, split: str = "train"):
        """(uint8 images [N, C, H, W] memory-mapped, int64 labels) of the prepared data."""
        from fedssl.data.store import load_split

        return load_split(self.data_dir, split)

    def clients(self):
        """Each client's indices into the training split."""
        from fedssl.data.store import load_clients

        return load_clients(self.partition_dir)

    def client_tests(self):
        """Each client's indices into the test split (partitions with ``client_tests``)."""
        from fedssl.data.store import load_clients

        if not (self.partition_dir / "test_clients.npz").exists():
            raise StageFailed(
                f"partition '{self.exp.partition}' has no per-client test splits: "
                f"set its `client_tests`"
            )
        return load_clients(self.partition_dir, "test_clients.npz")

    def server_indices(self):
        """The partition's server-side slice of the training split (``server_holdout``)."""
        import numpy as np

        path = self.partition_dir / "server.npy"
        if not path.exists():
            raise StageFailed(
                f"partition '{self.exp.partition}' keeps no data for the server: "
                f"set its `server_holdout`"
            )
        return np.load(path)

    def true_groups(self) -> list[int] | None:
        """Each client's group when the partition has groups (class_groups), else None."""
        import json

        counts = json.loads((self.partition_dir / "class_counts.json").read_text())
        return counts.get("groups")

    # ------------------------------------------------------------------ running
    @contextmanager
    def run(self):
        """Run the stage's body: yields the scratch output folder; on success it becomes the
        stage's output with meta.json in it."""
        inputs = self.fingerprint_inputs
        fingerprint = self.fingerprint
        policy, computed = nullcontext(), {}
        if self.record["gpu"]:  # it computes on the device, in the experiment's precision
            # by name: only a stage that computes on the device runs it (its record says so)
            precision = importlib.import_module(PRECISION)

            self.device = pick_device()
            setting = self.exp.precision
            policy = precision.policy(setting)
            computed = {"precision": precision.resolved(self.device, setting)}
        set_threads()
        if self.record["gpu"]:  # what its numbers depend on: hardware, threads, precision
            computed["computed_on"] = computed_on(self.device)
            self.info.update(computed)
            computed["precision_setting"] = setting
        overrides = command_line_overrides().get(self.name)
        if overrides:  # a one-off run's settings stay beside what it made
            self.info["overrides"] = computed["overrides"] = overrides
        bound_kernel_cache()
        say(f"{self.stage_name}: started on {self.device or 'cpu'}")
        start = time.time()
        try:
            with atomic_dir(self.output_dir) as out:
                self.out = out
                with PeakMemory(self.device) as peak, policy:
                    yield out
                write_json(
                    out / "meta.json",
                    {
                        "stage": self.stage_name,
                        "fingerprint": fingerprint,
                        "inputs": inputs,
                        "output_digest": output_digest(self.committed, out),
                        "command": self.record["command"],
                        **self.info,
                    },
                )
        except BaseException:
            say(f"{self.stage_name}: stopped after {time.time() - start:.1f} s")
            raise
        wall = round(time.time() - start, 2)
        say(f"{self.stage_name}: done in {wall:.1f} s")
        RUNS_DIR.mkdir(parents=True, exist_ok=True)
        write_json(
            RUNS_DIR / f"{self.stage_name}.json",
            {
                "stage": self.stage_name,
                "wall_seconds": wall,
                "environment": environment(self.device),
                **computed,
                "peak_memory_bytes": peak.bytes,
                "peak_memory_kind": peak.kind,
                **self.run_info,
            },
        )

    def done(self) -> None:
        """The stage finished: its resume checkpoint is no longer needed."""
        (RESUME_DIR / f"{self.stage_name}.pt").unlink(missing_ok=True)


def plan_record(kind: str, name: str) -> dict:
    """The plan record of stage ``<kind>__<name>``: the one ``pipeline write`` (or the
    Snakefile) wrote, while the params it reads are as they were then. Else the record the DAG
    makes now, the same the front ends write: for a stage of an experiment no written pipeline
    runs, or a preset that shares another experiment's stage (nothing is written), or after a
    params edit (it replaces the stale record, as ``dvc repro --single-item`` runs no DAG
    check first: DVC then records the record the stage ran by). The planner is imported by
    name, as it is not the stage's code: its record is."""
    record = read_record(f"{kind}__{name}")
    current = record is not None and record["params_digest"] == values_digest(
        raw_values(record["params"])
    )
    if current:
        return record
    dag, stage = importlib.import_module("fedssl.plan.dag").Dag.for_stage(kind, name)
    if record is not None and record["stage"] == stage:
        write_records([dag.record(stage)])
    return dag.record(stage)


def raw_values(params: dict) -> dict:
    """The raw values of the params keys a record names (file -> keys)."""
    from fedssl.presets import raw_values

    return raw_values(params)


def say(line: str) -> None:
    """A line of the stage's log (stdout, which Snakemake tees into it; stderr is for errors)."""
    print(line, flush=True)


# One thread per stage unless told: on a CPU shared with other work a second OpenMP thread waits
# on a descheduled sibling, and the step runs several times slower than on one thread
# (benchmarks/threads.py, README "Speed"); Snakemake runs stages side by side, one a core.
DEFAULT_THREADS = 1


def set_threads() -> None:
    """Compute on ``FEDSSL_THREADS`` threads (default :data:`DEFAULT_THREADS`; 0: torch's own
    choice, every core): torch if it is loaded, and, through the OpenMP and MKL variables read
    when their libraries load, a torch imported later, whose idle threads then sleep
    (``OMP_WAIT_POLICY=PASSIVE``) rather than spin."""
    threads = int(os.environ.get("FEDSSL_THREADS") or DEFAULT_THREADS)
    if threads <= 0:
        return
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    elif threads > 1:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# oneDNN keeps every CPU kernel it built (one per layer, pass and batch shape; 1,024 by default)
# and the memory each holds: clients whose last batches differ in size each added theirs, so a
# round's peak memory grew with the client count (FedSimCLR on the same 20,000 images: +0.6 GB
# from 10 to 100 Dirichlet clients; +0.14 GB with 128, which keeps the kernels every step
# reuses: no slowdown measured).
KERNEL_CACHE = 128


def bound_kernel_cache() -> None:
    """Cap oneDNN's kernel cache (read at its first use, so call before any compute); an
    ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` set by the user wins."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(KERNEL_CACHE))


def main_guard(body) -> None:
    """Run a stage's body; params and data problems exit 2 with a one-paragraph message."""
    import pickle

    try:
        body(sys.argv[1:])
    except (ParamsError, StageFailed, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except pickle.UnpicklingError as e:
        print(
            f"error: refusing to load a checkpoint or artifact that holds more than plain "
            f"tensors and values (loaded with weights_only=True): {str(e).splitlines()[0]}",
            file=sys.stderr,
        )
        sys.exit(2)
    except KeyboardInterrupt:
        print(
            "interrupted: a stage that checkpoints resumes where it stopped when run again",
            file=sys.stderr,
        )
        sys.exit(130)


def run_record(stage_name: str) -> dict:
    """The run record of a stage's last run ({} when there is none)."""
    import json

    try:
        return json.loads((RUNS_DIR / f"{stage_name}.json").read_text())
    except (OSError, ValueError):
        return {}
