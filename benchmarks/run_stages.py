"""Run one pipeline's stages in order, without Snakemake or DVC, under a wall-clock budget.

For a machine lent for minutes that has torch but neither front end nor a package registry (the
GPU board subset, ``board_gpu``): the stages run upstream first, exactly the commands the front
ends run, each stage's wall time and exit status written to a TSV as it ends. A stage still
running at the deadline is stopped (its checkpoint lets a later run resume); a stage whose
upstream failed or was stopped is skipped.

    python benchmarks/run_stages.py board_gpu --budget 480 --log stages.tsv
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedssl.plan.dag import Dag  # noqa: E402


def run_stage(cmd: str, log: Path, seconds_left: float) -> tuple[str, float]:
    """Run one stage's command (its output to ``log``); ("ok" | "failed" | "stopped", seconds)."""
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, shell=True, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=max(seconds_left, 1.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            return "stopped", time.perf_counter() - start
    return ("ok" if code == 0 else "failed"), time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pipeline")
    ap.add_argument("--budget", type=float, default=600.0, help="wall seconds for all stages")
    ap.add_argument("--log", type=Path, default=Path("stages.tsv"), help="per-stage TSV")
    ap.add_argument("--logs", type=Path, default=Path("artifacts/logs"), help="stage logs")
    args = ap.parse_args(argv)

    deadline = time.perf_counter() + args.budget
    dag = Dag(args.pipeline)
    args.logs.mkdir(parents=True, exist_ok=True)
    args.log.write_text("stage\tstatus\twall_seconds\n")
    not_done: set[str] = set()
    for name, stage in dag.stages.items():
        left = deadline - time.perf_counter()
        if left <= 0 or not_done.intersection(stage.upstream):
            status, wall = "skipped", 0.0
        else:
            status, wall = run_stage(stage.cmd, args.logs / f"{name}.log", left)
        if status != "ok":
            not_done.add(name)
        with args.log.open("a") as f:
            f.write(f"{name}\t{status}\t{wall:.1f}\n")
        print(f"{name:<48} {status:<8} {wall:8.1f} s", flush=True)
    return 1 if not_done else 0


if __name__ == "__main__":
    sys.exit(main())
