"""``make bench``: the speed benchmarks one after another, each line as it comes, on any CPU.

    python benchmarks/bench.py [--budget 900] [--only step_limits twin_norm ...]

It first says what machine the figures come from (CPU model, vector extensions, whether it
multiplies bf16 natively, threads, load), so a committed output names its CPU. A CPU without
native bf16 runs the policy's fp32 (``precision: auto``) and skips the emulated bf16 peak; every
script is stopped after ``--budget`` seconds with a line that says so, so the run ends.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from fedssl.stage.runtime import cpu_summary

HERE = Path(__file__).resolve().parent
# script -> its arguments (split_step at one thread: README "Speed", Known problem)
SCRIPTS = {
    "step_limits": [],
    "federated_round": [],
    "twin_norm": [],
    "split_step": [],
    "threads": ["--repeats", "2", "--seconds", "3"],
}


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=900, help="seconds per script at most")
    ap.add_argument("--only", nargs="*", choices=list(SCRIPTS), default=None)
    args = ap.parse_args()
    print(
        f"# make bench, {time.strftime('%Y-%m-%d')}: {cpu_summary()}; torch {torch.__version__}; "
        f"load average {load()}",
        flush=True,
    )
    failed = 0
    for name in args.only or SCRIPTS:
        cmd = [sys.executable, str(HERE / f"{name}.py"), *SCRIPTS[name]]
        print(f"$ python benchmarks/{name}.py {' '.join(SCRIPTS[name])}".rstrip(), flush=True)
        start = time.time()
        proc = subprocess.Popen(cmd, start_new_session=True)  # its scenario processes too
        try:
            failed += proc.wait(timeout=args.budget) != 0
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            print(f"{name}: stopped after {args.budget:.0f} s (--budget)", flush=True)
        print(f"  ({time.time() - start:.0f} s, load average {load()})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
