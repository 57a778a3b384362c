"""The stage contract, in one place, for any stage: hold the stage's lock (both front ends
take it), check every input file against the digest its producer recorded, write the declared
output directory and the committed result files atomically, on success only, and record what
ran (meta.json with the stage's fingerprint and each file's SHA-256).

A :class:`Stage` runs by its plan record (:mod:`fedssl.stage.record`: its command, params keys,
inputs, outputs, code), not by the DAG, so the planner is no code of any stage; it gives the
body where its inputs are, a scratch output folder and the ``info`` dict that ends up in
meta.json. It loads no presets: a stage that reads an experiment's (or a partition's,
a pipeline's) validated params runs :class:`fedssl.stage.context.StageContext`, which adds them, the
method and the device; the prepare stage reads what it needs from its record. torch is
imported only by stages that compute with it.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager, nullcontext
from functools import cached_property
from pathlib import Path

from fedssl.stage.record import (
    ParamsError,
    changed_files,
    fingerprint,
    fingerprint_inputs,
    is_current,
    output_digest,
    raw_values,
    read_record,
    remember_files,
    sha256_file,
    write_records,
)
from fedssl.stage.runtime import (
    RESUME_DIR,
    ArtifactError,
    PeakMemory,
    StageFailed,
    atomic_dir,
    environment,
    join_run,
    move_file,
    refusal,
    resume_fingerprint,
    scratch_name,
    stage_lock,
    write_error,
    write_json,
)

# How each stage's last run went (wall time, memory, device, host): kept apart from its outputs,
# which hold only what the inputs determine, so an identical rerun leaves identical outputs
# (and an unchanged dvc.lock).
RUNS_DIR = Path("artifacts/.runs")


class Stage:
    """Stage ``<kind>__<name>``, run by its plan record."""

    def __init__(self, kind: str, name: str):
        self.record = plan_record(kind, name)
        self.stage_name = self.record["stage"]
        # a shared stage runs with the params of the experiment that owns its content
        self.kind, self.name = kind, self.record["name"]
        self.out: Path | None = None  # the scratch output folder, inside run()
        self.device = None
        self.info: dict = {}  # facts of the output, into meta.json
        self.run_info: dict = {}  # facts of this run (timings, resumes), into its run record
        # committed folder -> this run's scratch copy of it (inside run(): a stage's result
        # files land beside its outputs when it succeeds, never while it runs)
        self.landing: dict[Path, Path] = {}
        self.running = False

    @classmethod
    def from_argv(cls, kind: str, argv: list[str], what: str):
        """The stage named by a stage script's one argument (``what``: a preset name)."""
        import argparse

        ap = argparse.ArgumentParser(prog=f"python -m stages.{kind}")
        ap.add_argument("name", help=what)
        return cls(kind, ap.parse_args(argv).name)

    def hook(self, index: int = 0):
        """The object the record's ``index``-th hook names (``"module:object"``, imported now:
        the planner names its module among the stage's code)."""
        module, _, name = self.record["hooks"][index].partition(":")
        return getattr(importlib.import_module(module), name)

    # ------------------------------------------------------------------ where things are
    def committed_dir(self, path: Path) -> Path:
        """The folder to write the committed files of ``path`` into (see :attr:`results_dir`)."""
        if self.running:
            if path not in self.landing:
                self.landing[path] = scratch_name(self.output_dir, f"partial-{path.name}")
            path = self.landing[path]
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
        """What the output depends on (:func:`fedssl.stage.record.fingerprint_inputs`), as the
        stage starts."""
        return fingerprint_inputs(self.record, raw_values(self.record["params"]))

    @property
    def settings(self) -> dict:
        """The compute settings of this run that its numbers depend on (device, threads,
        precision), as :meth:`compute_settings` made them."""
        settings = {"device": str(self.device or "cpu")}
        if "torch" in sys.modules:
            settings["threads"] = sys.modules["torch"].get_num_threads()
        if "precision" in self.info:
            settings["precision"] = self.info["precision"]
        if "compile" in self.info:  # recorded where not off: old checkpoints still resume
            settings["compile"] = self.info["compile"]
        return settings

    @property
    def fingerprint(self) -> str:
        """What a resume checkpoint must match: the stage's fingerprint and the compute
        settings of this run."""
        return resume_fingerprint(fingerprint(self.fingerprint_inputs), self.settings)

    # ------------------------------------------------------------------ running
    def compute_settings(self):
        """(the context the body runs in, what its numbers depend on): set the thread count;
        a stage that computes on a device adds its device and precision
        (:meth:`fedssl.stage.context.StageContext.compute_settings`)."""
        set_threads()
        return nullcontext(), {}

    @contextmanager
    def run(self):
        """Run the stage's body: yields the scratch output folder; on success it becomes the
        stage's output with meta.json in it."""
        inputs = self.fingerprint_inputs
        stage_fingerprint = fingerprint(inputs)
        policy, computed = self.compute_settings()
        bound_kernel_cache()
        keep_freed_memory()
        say(f"{self.stage_name}: started on {self.device or 'cpu'}")
        start = time.time()
        try:
            with stage_lock(self.stage_name):
                join_run(self.stage_name)  # no run of the other front end is in progress
                with atomic_dir(self.output_dir) as out:
                    verify_inputs(self.record)
                    self.out, self.running = out, True
                    try:
                        with PeakMemory(self.device) as peak, policy:
                            yield out
                        staged = self.staged_files()
                        files = file_digests(self.output_dir, out, self.committed, staged)
                        self.write_meta(out, stage_fingerprint, inputs, staged, files)
                        self.land(staged)  # then atomic_dir puts the outputs in place
                    finally:
                        self.running = False
                        for scratch in self.landing.values():
                            shutil.rmtree(scratch, ignore_errors=True)
                remember_files(self.stage_name, files)  # as they lie: planning hashes none
        except BaseException:
            say(f"{self.stage_name}: stopped after {time.time() - start:.1f} s")
            raise
        wall = round(time.time() - start, 2)
        say(f"{self.stage_name}: done in {wall:.1f} s")
        self.write_run_record(wall, computed, peak)

    def write_meta(
        self, out: Path, stage_fingerprint: str, inputs: dict, staged, files: dict
    ) -> None:
        """The output's meta.json: what made it (fingerprint, inputs, command), the digest of
        what it holds and the stage's own facts (``info``)."""
        write_json(
            out / "meta.json",
            {
                "stage": self.stage_name,
                "fingerprint": stage_fingerprint,
                "inputs": inputs,
                "output_digest": output_digest(self.committed, out, staged),
                "files": files,
                "command": self.record["command"],
                **self.info,
            },
        )

    def write_run_record(self, wall: float, computed: dict, peak: PeakMemory) -> None:
        """artifacts/.runs/<stage>.json: how this run went (wall time, environment, compute
        settings, peak memory), kept outside the output."""
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

    def staged_files(self) -> dict[str, Path]:
        """Every committed file this run wrote (its path in the repository -> its scratch
        copy)."""
        return {
            str(real / f.relative_to(scratch)): f
            for real, scratch in self.landing.items()
            for f in sorted(scratch.rglob("*"))
            if f.is_file()
        }

    def land(self, staged: dict[str, Path]) -> None:
        """Move this run's committed files into place (each file atomically, from whatever
        disk ``artifacts/`` is on)."""
        for path, scratch in staged.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            move_file(scratch, Path(path))

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
    if record is not None and is_current(record):
        return record
    dag, stage = importlib.import_module("fedssl.plan.dag").Dag.for_stage(kind, name)
    if record is not None and record["stage"] == stage:
        write_records([dag.record(stage)])
    return dag.record(stage)


def file_digests(
    final: Path, out: Path, committed: list[str], staged: dict[str, Path]
) -> dict[str, str]:
    """SHA-256 of each file a stage wrote, by its path in the repository: its output folder's
    (``out``, to land at ``final``; but meta.json) and its ``committed`` files (``staged``:
    where those lie until they land)."""
    files = {str(final / f.relative_to(out)): f for f in sorted(out.rglob("*")) if f.is_file()}
    files.pop(str(final / "meta.json"), None)
    files.update({c: Path(staged.get(c, c)) for c in committed})
    return {name: sha256_file(path) for name, path in files.items() if path.is_file()}


def verify_inputs(record: dict) -> None:
    """Refuse to read an upstream output that changed since its stage wrote it (a flipped
    byte, a file replaced by hand or by another tool): each file is compared with the SHA-256
    its producer recorded in its meta.json; the message names the file and the stage to rerun."""
    for upstream, spec in record["inputs"].items():
        meta_path = Path(spec["out"]) / "meta.json"
        try:
            recorded = json.loads(meta_path.read_text())["files"]
        except (OSError, ValueError, KeyError):
            continue  # not run here (the front ends run it first), or before files were recorded
        changed = changed_files(upstream, Path(spec["out"]), recorded, trust_stat=False)
        if changed:
            more = f" and {len(changed) - 1} more" if changed[1:] else ""
            raise StageFailed(
                f"{changed[0]}: changed since {upstream} wrote it (its SHA-256 differs from "
                f"the one in {meta_path}{more}): rerun it (`snakemake {upstream} --forcerun "
                f"{upstream}` or `dvc repro --force --single-item {upstream}`), or `dvc "
                f"checkout {spec['out']}`"
            )


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


# glibc hands a freed block over its mmap threshold back to the kernel and trims the heap's free
# top, so the next step's activations of the same size fault their pages in again, zero-filled:
# FedSimCLR's round at 20,000 images spent a quarter of its CPU in the kernel, 2.9 million page
# faults a round (benchmarks/page_faults.py). Kept in the heap, the blocks are reused: the same
# round 1.2-1.5x faster, the same numbers (where a block comes from changes no arithmetic).
MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks up to 32 MiB come from the heap
TRIM_THRESHOLD = 1 << 30  # free heap the process keeps before it gives memory back
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


def keep_freed_memory() -> bool:
    """Let glibc's allocator keep freed blocks for reuse (see :data:`MMAP_THRESHOLD`); a user's
    own ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` win. Returns whether it was
    set (False off glibc: another allocator has its own policy)."""
    if any(v in os.environ for v in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def main_guard(body) -> None:
    """Run a stage's body; params and data problems exit 2 with a one-paragraph message."""
    import pickle

    try:
        body(sys.argv[1:])
    except (ParamsError, StageFailed, FileNotFoundError, ArtifactError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # out of space, a read-only folder, the file size limit
        failed = write_error(e)
        if failed is None:
            raise
        print(f"error: {failed}", file=sys.stderr)
        sys.exit(2)
    except pickle.UnpicklingError as e:
        print(
            f"error: {loaded_file(e) or 'a checkpoint or artifact'}: refused, not a file of "
            f"plain tensors and values (loaded with weights_only=True; nothing in it ran): "
            f"rerun the stage that writes it: {refusal(e)}",
            file=sys.stderr,
        )
        sys.exit(2)
    except (RuntimeError, EOFError) as e:  # torch.load of a truncated or overwritten file
        path = loaded_file(e)
        if path is None:
            raise
        print(
            f"error: {path}: not a readable checkpoint or model (truncated or overwritten?): "
            f"rerun the stage that writes it, or `dvc checkout` it: {str(e).splitlines()[0]}",
            file=sys.stderr,
        )
        sys.exit(2)
    except KeyboardInterrupt:
        print(
            "interrupted: a stage that checkpoints resumes where it stopped when run again",
            file=sys.stderr,
        )
        sys.exit(130)


def loaded_file(err: BaseException) -> str | None:
    """The file ``torch.load`` was reading when ``err`` was raised (None when it was raised
    elsewhere): a load site anywhere in a method's code is named in the stage's error."""
    import traceback

    for frame, _ in traceback.walk_tb(err.__traceback__):
        code = frame.f_code
        if code.co_name == "load" and code.co_filename.endswith("torch/serialization.py"):
            f = frame.f_locals.get("f")
            return str(f) if isinstance(f, (str, os.PathLike)) else None
    return None


def run_record(stage_name: str) -> dict:
    """The run record of a stage's last run ({} when there is none)."""
    import json

    try:
        return json.loads((RUNS_DIR / f"{stage_name}.json").read_text())
    except (OSError, ValueError):
        return {}
