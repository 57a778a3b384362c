"""MKL's Intel kernels on any x86 CPU, for the suite's kernel-variation checks.

MKL picks its kernels by vendor: on a CPU that is not Intel's it runs its generic ones whatever
the instruction set, and ignores ``MKL_ENABLE_INSTRUCTIONS``, so an AMD machine never computes
what an Intel user's does (the 15 bit-for-bit failures an Intel Xeon once showed came from MKL's
kernels there). MKL asks one function whether the CPU is Intel's; a one-line library preloaded
in its place makes any x86 CPU take MKL's Intel kernels for its instruction set."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import torch

SOURCE = "int mkl_serv_intel_cpu_true(void) { return 1; }\n"
MKL_AVX2 = 5  # MKL's instruction-set level for AVX2 (mkl_isa); AVX-512 is 7


def intel_dispatch_library(folder: Path) -> Path | None:
    """The preloadable library, compiled into ``folder``; None where no C compiler is found."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    source, library = folder / "mkl_intel_cpu.c", folder / "libmkl_intel_cpu.so"
    source.write_text(SOURCE)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def preloaded(env: dict[str, str], library: Path) -> dict[str, str]:
    """``env`` with ``library`` preloaded into the processes it starts."""
    before = env.get("LD_PRELOAD")
    return env | {"LD_PRELOAD": f"{library}:{before}" if before else str(library)}


def mkl_isa() -> int | None:
    """The instruction-set level MKL dispatches to in this process (0: its generic kernels;
    5: AVX2; 7: AVX-512), None where torch carries no MKL to ask."""
    path = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        detect = ctypes.CDLL(str(path)).mkl_serv_cpu_detect
    except (OSError, AttributeError):
        return None
    return int(detect())


def on_intel() -> bool:
    """Whether this CPU is Intel's (MKL dispatches by vendor)."""
    try:
        return "GenuineIntel" in Path("/proc/cpuinfo").read_text()
    except OSError:  # no /proc: not Linux, where the preload would not work anyway
        return True


if __name__ == "__main__":  # python -m tests.mkl_dispatch FOLDER (make test-mkl-intel)
    import sys

    built = intel_dispatch_library(Path(sys.argv[1]))
    if built is None:
        sys.exit("no C compiler (cc or gcc) to build MKL's Intel-kernel library with")
    print(built)
