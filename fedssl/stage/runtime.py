"""Run-time plumbing shared by every stage: device choice, seeds, atomic writes, run metadata
(the versions and the machine a run's numbers came from)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import shutil
import time
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where it is used: planning and light stages skip it
    import torch


class StageFailed(RuntimeError):
    """An expected failure (missing data set, bad params, a diverged loss): the stage prints
    the message without a traceback and exits 2."""


class ArtifactError(ValueError):
    """A stored artifact that cannot be used as it is; the message names the file and what to
    do (the stage runtime prints it without a traceback)."""


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


def scratch_name(path: Path, tag: str = "tmp") -> Path:
    """A sibling of ``path`` that only this process writes (two processes never share one)."""
    path = Path(path)
    return path.with_name(f"{path.name}.{tag}-{os.getpid()}")


@contextmanager
def replacing(path: Path):
    """Yield a scratch path that replaces ``path`` when the block succeeds (a reader sees the
    old file or the new one, never half of one); a failed block leaves ``path`` as it was."""
    path = Path(path)
    tmp = scratch_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def move_file(src: Path, dst: Path) -> None:
    """Move ``src`` onto ``dst`` atomically (a reader sees the old file or the new one). Across
    file systems (``artifacts/`` on a scratch disk, ``results/`` in the checkout), where a
    rename cannot, it is copied to a scratch name beside ``dst``, flushed to disk, renamed, and
    only then removed from ``src``."""
    import errno

    try:
        os.replace(src, dst)
        return
    except OSError as err:
        if err.errno != errno.EXDEV:
            raise
    with writing(dst), replacing(dst) as tmp:
        shutil.copyfile(src, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    _fsync_dir(Path(dst).parent)
    os.unlink(src)


def _fsync_dir(folder: Path) -> None:
    """Flush a folder's entries (a rename in it survives a crash)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, obj) -> None:
    """Atomic JSON write: a reader never sees half a file."""
    with writing(path), replacing(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=float) + "\n")


def write_tsv(rows: list[dict], path: Path, fields: list[str]) -> None:
    """A per-round / per-epoch log that `dvc plots show` reads (header even when empty)."""
    import csv

    with writing(path), replacing(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fields, delimiter="\t")
        writer.writeheader()
        writer.writerows(rows)


def torch_save(obj, path: Path) -> None:
    """``torch.save`` through a Python file, so a full disk or the file size limit surfaces
    as the ``OSError`` behind torch's own error (said in one line naming ``path``)."""
    import torch

    with writing(path), replacing(path) as tmp, open(tmp, "wb") as f:
        torch.save(obj, f)


# What a failed write means and what to do about it, by errno: one line naming the path.
_WRITE_ERRORS = {
    "ENOSPC": "no space left on the device: free some (or move artifacts/) and run again",
    "EDQUOT": "disk quota exceeded: free some space and run again",
    "EROFS": "the file system is read-only: make it writable and run again",
    "EACCES": "permission denied: make it writable for this user and run again",
    "EFBIG": "file too large for the file size limit (ulimit -f): raise it and run again",
}


def write_error(err: BaseException, path: Path | str | None = None) -> StageFailed | None:
    """A :class:`StageFailed` naming the path for an out-of-resources write error (no
    space, read-only, quota, file size limit), None for any other error. The ``OSError`` may
    be the cause of another error (torch's writer raises its own on a failed write)."""
    import errno

    while err is not None and not isinstance(err, OSError):
        err = err.__cause__ or (None if err.__suppress_context__ else err.__context__)
    name = errno.errorcode.get(getattr(err, "errno", None) or 0, "")
    if name not in _WRITE_ERRORS:
        return None
    return StageFailed(f"{err.filename or path}: cannot write it: {_WRITE_ERRORS[name]}")


@contextmanager
def writing(path: Path):
    """Turn a resource error while writing ``path`` into a one-line :class:`StageFailed`."""
    try:
        yield
    except (OSError, RuntimeError) as err:  # RuntimeError: torch's, over the OSError
        failed = write_error(err, path)
        if failed is None:
            raise
        raise failed from None


def load_checkpoint(
    path: Path, fingerprint: str, device: torch.device | str = "cpu"
) -> dict | None:
    """The resume checkpoint at ``path`` if it was written by this very configuration, else
    None (absent, or from other params or other compute settings: a ``fingerprint`` that
    differs, said in one line). Loaded with ``weights_only=True``: a file holding anything but
    tensors, numbers, strings and containers is refused with a message naming it, and no code
    in it runs; so is a file that is not a checkpoint at all (truncated, overwritten)."""
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
            f"unread (delete it to start afresh): {refusal(err)}"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise StageFailed(
            f"{path}: not a readable checkpoint (truncated or overwritten?): delete it to "
            f"start afresh: {str(err).splitlines()[0]}"
        ) from None
    theirs = ck.get("fingerprint") if isinstance(ck, dict) else None
    if theirs != fingerprint:
        print(f"{path.name}: {_why_not_resumed(str(theirs), fingerprint)}", flush=True)
        return None
    return ck


def refusal(err: BaseException) -> str:
    """What ``torch.load(weights_only=True)`` refused in a file (e.g. "Unsupported global:
    GLOBAL os.system"), without torch's advice to load it with ``weights_only=False``, which
    would run whatever the file holds."""
    _, found, rest = str(err).partition("WeightsUnpickler error: ")
    if not found:
        return "it holds more than tensors and plain values"
    return rest.splitlines()[0].split(" was not an allowed global")[0].rstrip(". ")


def resume_fingerprint(fingerprint: str, settings: dict) -> str:
    """What a checkpoint must match to be resumed: the stage's ``fingerprint`` (params, code,
    inputs) and the compute ``settings`` its numbers depend on (device, threads, precision),
    so a run is never continued under other settings than it started with."""
    return fingerprint + " (" + ", ".join(f"{k} {v}" for k, v in settings.items()) + ")"


def _why_not_resumed(theirs: str, ours: str) -> str:
    if theirs.split(" ")[0] != ours.split(" ")[0]:
        return "a checkpoint of other params, ignored"
    was, now = (f.partition(" ")[2] or "(unrecorded settings)" for f in (theirs, ours))
    return (
        f"a checkpoint written under other compute settings {was}, now {now}: starting "
        f"afresh (a resumed run would mix both; run with the old settings to resume it)"
    )


@contextmanager
def atomic_dir(final: Path):
    """Yield a scratch directory, this process's own, that replaces ``final`` only if the block
    succeeds, so a killed stage never leaves a plausible-looking output behind. Scratch folders
    of processes that died (killed stages) are removed."""
    final = Path(final)
    remove_dead_scratch(final)
    tmp = scratch_name(final, "partial")
    with writing(tmp):
        tmp.mkdir(parents=True)
    try:
        yield tmp
        if final.exists():
            shutil.rmtree(final) if final.is_dir() else final.unlink()
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_dead_scratch(final: Path) -> list[Path]:
    """Remove the scratch folders of ``final`` whose process is gone; returns them."""
    return remove_dead(Path(final).parent, f"{Path(final).name}.partial*")


def remove_dead(folder: Path, pattern: str) -> list[Path]:
    """Remove the scratch folders or files (``pattern``, named ``...-<pid>``) in ``folder``
    whose process is gone; returns them."""
    removed = []
    for old in Path(folder).glob(pattern):
        pid = old.name.rpartition("-")[2]
        if not (pid.isdigit() and _alive(int(pid))):
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
            removed.append(old)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


LOCKS_DIR = Path("artifacts/.locks")
RESUME_DIR = Path("artifacts/.resume")  # checkpoints of unfinished stages, outside all outputs


@contextmanager
def stage_lock(stage: str, locks: Path = LOCKS_DIR):
    """Hold ``stage``'s lock (an advisory ``flock`` that both front ends take through the stage
    runtime, released by the kernel when the process dies); a second run of the same stage
    while it is held is refused with one line naming who holds it."""
    import fcntl

    with writing(locks):
        locks.mkdir(parents=True, exist_ok=True)
    path = locks / f"{stage}.lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise StageFailed(
                f"{stage} is already running ({holder}; lock {path}): wait for it to finish "
                f"or stop it, then run again"
            ) from None
        f.truncate(0)
        f.write(f"process {os.getpid()} on {platform.node()}")
        f.flush()
        try:
            yield
        finally:
            f.truncate(0)


# ---------------------------------------------------------------------------- the run lock
# A run of either front end holds the project's run lock from its first job to its end, so the
# other front end runs no stage meanwhile: one never replaces an output the other's stage is
# reading. Snakemake takes it as its jobs start (the Snakefile's onstart) and hands its jobs
# the holder's token (RUN_ENV); DVC has no such hook, so its first stage takes it for the
# `dvc` process it runs under, which holds it until it exits. The lock file names the holder
# (front end, process, host, its start time); a holder that is gone holds nothing.
RUN_LOCK = LOCKS_DIR / "run.lock"
RUN_ENV = "FEDSSL_RUN"


@contextmanager
def _run_lock_file():
    """The run lock file, flocked for a read-and-write, with its holder (None: free)."""
    import fcntl

    with writing(LOCKS_DIR):
        LOCKS_DIR.mkdir(parents=True, exist_ok=True)
    with open(RUN_LOCK, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # held for a read and a write, no longer
        f.seek(0)
        try:
            holder = json.loads(f.read() or "null")
        except ValueError:
            holder = None
        yield f, (holder if holder and _holds(holder) else None)


def _holds(holder: dict) -> bool:
    """Whether the holder's process still runs (one on another host is taken to)."""
    if holder.get("host") != platform.node():
        return True
    return _alive(holder["pid"]) and _started(holder["pid"]) == holder.get("started")


def _started(pid: int) -> str | None:
    """When process ``pid`` started (a reused pid differs), or None where it cannot be told."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def run_holder() -> dict | None:
    """The run holding the run lock now (None: no front end is running)."""
    if not RUN_LOCK.exists():
        return None
    with _run_lock_file() as (_, holder):
        return holder


def hold_run(front_end: str, pid: int | None = None) -> str:
    """Take the run lock for ``front_end``'s run in process ``pid`` (this one by default), or
    refuse in one line naming the run that holds it; returns the holder's token."""
    pid = pid or os.getpid()
    token = f"{front_end}-{pid}-{platform.node()}-{_started(pid)}"
    with _run_lock_file() as (f, holder):
        if holder and holder["token"] != token:
            raise StageFailed(busy(holder))
        new = {"front_end": front_end, "pid": pid, "host": platform.node(), "token": token}
        f.truncate(0)
        f.write(json.dumps({**new, "started": _started(pid)}))
    return token


def release_run(token: str) -> None:
    """Free the run lock if the run of ``token`` holds it."""
    if RUN_LOCK.exists():
        with _run_lock_file() as (f, holder):
            if holder and holder["token"] == token:
                f.truncate(0)


def busy(holder: dict) -> str:
    return (
        f"a {holder['front_end']} run is in progress (process {holder['pid']} on "
        f"{holder['host']}; lock {RUN_LOCK}): it may be reading what this run would replace; "
        f"wait for it to finish or stop it, then run again"
    )


def join_run(stage: str) -> None:
    """Before a stage runs: it belongs to the run holding the run lock (a Snakemake job: it has
    the run's token, or on a cluster's node runs under Snakemake), or takes the lock for the
    `dvc` process it runs under; a run of the other front end in progress refuses it in one
    line. A stage run by hand runs unless a front end runs."""
    holder = run_holder()
    if holder and holder["token"] == os.environ.get(RUN_ENV):
        return
    front_end, pid = _front_end_ancestor()
    if holder and holder["front_end"] == front_end == "snakemake":
        return
    try:
        if front_end == "dvc":
            hold_run("dvc", pid)
        elif holder:
            raise StageFailed(busy(holder))
    except StageFailed as refused:
        raise StageFailed(f"{stage}: not run: {refused}") from None


FRONT_ENDS = ("dvc", "snakemake")


def _front_end_ancestor() -> tuple[str | None, int]:
    """The front end this process runs under (a stage of `dvc repro`, a Snakemake job) and
    its process: the nearest ancestor named dvc or snakemake (``dvc``, ``python .../dvc``,
    ``python -m dvc``); (None, 0) for none."""
    pid = os.getppid()
    while pid > 1:
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:3]
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        names = [Path(a.decode(errors="replace")).name for a in args[:2]]
        names += [args[2].decode(errors="replace")] if args[1:2] == [b"-m"] else []
        for name in FRONT_ENDS:
            if name in names:
                return name, pid
        pid = int(stat.rpartition(")")[2].split()[1])
    return None, 0


# ---------------------------------------------------------------------------- the machine
# What machine a number came from: the CPU's model and the vector extensions its float kernels
# can use (the part of a CPU that changes which kernels run, hence the last digits of a result).
# Read from /proc/cpuinfo, without importing torch, so light stages and benchmarks can say it.

# The flags that pick a different float kernel (x86: SSE -> AVX2 -> AVX-512 -> bf16/AMX; Arm:
# NEON -> SVE, bf16), strongest last, in /proc/cpuinfo's spelling.
VECTOR_FLAGS = (
    "sse4_2",
    "avx",
    "fma",
    "avx2",
    "avx_vnni",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "asimd",
    "sve",
    "sve2",
    "bf16",
)
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# Environment variables that cap the instruction sets torch's kernels use (ATen's dispatch,
# oneDNN's JIT, MKL's fp32 GEMM): an AVX-512 BF16 CPU capped at AVX2 computes as an AVX2 CPU
# does, bf16 emulated. The caps a CPU's bf16 survives (oneDNN's names, lower case, as prefixes):
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
BF16_ONEDNN_ISAS = ("avx512_core_bf16", "avx512_core_fp16", "avx512_core_amx", "avx10", "all")


def isa_cap() -> str:
    """The instruction-set caps set in the environment ('ATEN_CPU_CAPABILITY=avx2 ...'), or ''."""
    return " ".join(f"{k}={os.environ[k]}" for k in ISA_CAPS if os.environ.get(k))


def bf16_capped() -> bool:
    """Whether an instruction-set cap keeps torch's kernels off the CPU's bf16 instructions."""
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").lower()
    return bool(aten and not aten.startswith("avx512")) or bool(
        onednn and onednn != "default" and not onednn.startswith(BF16_ONEDNN_ISAS)
    )


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


@cache
def cpu() -> dict:
    """{"cpu_model", "cpu_vector_extensions", "cpu_native_bf16", "cpu_isa_cap"}: the CPU's name
    (with its family and model numbers where given: a virtual machine's name may say only "AMD
    EPYC"), which of :data:`VECTOR_FLAGS` it has, whether torch multiplies bf16 on it natively
    (not where :func:`isa_cap` caps the kernels below its bf16 instructions) and the cap."""
    info = _cpuinfo()
    model = info.get("model name") or info.get("Model") or platform.processor() or "unknown"
    if info.get("cpu family") and info.get("model"):
        model += f" (family {info['cpu family']}, model {info['model']})"
    flags = set((info.get("flags") or info.get("Features") or "").split())
    vector = [f for f in VECTOR_FLAGS if f in flags]
    return {
        "cpu_model": model,
        "cpu_vector_extensions": vector,
        "cpu_native_bf16": any(f in flags for f in NATIVE_BF16_FLAGS) and not bf16_capped(),
        "cpu_isa_cap": isa_cap(),
    }


def cpu_summary() -> str:
    """One line: 'AMD EPYC, 2 cores, avx2 avx512f avx512_bf16 (native bf16)'."""
    c = cpu()
    bf16 = "native bf16" if c["cpu_native_bf16"] else "no native bf16"
    if c["cpu_isa_cap"]:
        bf16 += f"; kernels capped: {c['cpu_isa_cap']}"
    return (
        f"{c['cpu_model']}, {os.cpu_count()} cores, "
        f"{' '.join(c['cpu_vector_extensions']) or 'no listed vector extensions'} ({bf16})"
    )


def computed_on(device=None) -> dict:
    """What a compute stage's numbers depend on besides its inputs and precision: the CPU (model,
    vector extensions), the threads, and the GPU where it ran on one. Not OpenMP's wait policy,
    which changes how idle threads wait, not what they compute (and differs between the front
    ends: the run record keeps it). Call after the thread count is set
    (:func:`fedssl.stage.base.set_threads`)."""
    import sys

    c = cpu()
    out = {"cpu": c["cpu_model"], "vector_extensions": c["cpu_vector_extensions"]}
    if c["cpu_isa_cap"]:
        out["isa_cap"] = c["cpu_isa_cap"]
    if "torch" in sys.modules:
        out["threads"] = sys.modules["torch"].get_num_threads()
    if device is not None and getattr(device, "type", None) == "cuda":
        import torch

        out["gpu"] = torch.cuda.get_device_name(device)
    return out


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
