"""What Snakemake adds to one stage: the CPU seconds (user + system, the whole process tree) of
a forced rerun of one stage through ``snakemake`` against its command run directly, and of
``snakemake -n`` (planning alone), in turns, for each project given (e.g. a checkout before and
after a change, each with its pipeline run once).

    python benchmarks/stage_overhead.py PROJECT [PROJECT ...] [--stage NAME] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import yaml


def cpu_seconds(cmd: list[str], cwd: Path) -> float:
    """CPU seconds of ``cmd`` and everything it started (waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the project's own code
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def stage_command(project: Path, stage: str) -> list[str]:
    cmd = yaml.safe_load((project / "dvc.yaml").read_text())["stages"][stage]["cmd"]
    return ["env", "FEDSSL_THREADS=1", *shlex.split(cmd)]


def ways(project: Path, stage: str) -> dict[str, list[str]]:
    snake = ["--cores", "1", "--resources", "gpu=1"]
    return {
        "direct": stage_command(project, stage),
        "snakemake": ["snakemake", stage, "--forcerun", stage, *snake],
        "snakemake -n": ["snakemake", "-n", *snake],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("projects", nargs="+", type=Path)
    ap.add_argument("--stage", default=None, help="default: the project's first partition stage")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    stages = yaml.safe_load((args.projects[0] / "dvc.yaml").read_text())["stages"]
    stage = args.stage or next(s for s in stages if s.startswith("partition__"))
    print(f"stage {stage}; CPU seconds, medians of {args.repeats} turns; load {os.getloadavg()}")
    seconds = {(p, w): [] for p in args.projects for w in ways(p, stage)}
    for _ in range(args.repeats):
        for p in args.projects:
            for way, cmd in ways(p, stage).items():
                seconds[p, way].append(cpu_seconds(cmd, p))
    for p in args.projects:
        m = {w: statistics.median(seconds[p, w]) for w in ways(p, stage)}
        print(
            f"{p}: direct {m['direct']:.2f}, through snakemake {m['snakemake']:.2f} "
            f"(+{m['snakemake'] - m['direct']:.2f}), snakemake -n {m['snakemake -n']:.2f}"
        )
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
