"""Does ``make run`` survive a loaded machine? The default pipeline from a fresh clone, timed
idle and with N busy loops (other jobs, one core each) beside it, in one run.

    python benchmarks/run_under_load.py [--busy 4] [--venv .venv]

Each condition clones this repository afresh (so every stage runs) and calls ``make run`` with
the given virtual environment (the install step then finds it made: the figures are the
pipeline's, not pip's). The busy loops start in one other session (another user's 4-thread
job) or each in a session of its own (4 users): Linux's autogroup scheduler shares the cores
between sessions, not processes, so the two loads give the pipeline's session 1/2 and 1/(N+1)
of the machine. Prints wall and CPU seconds of the pipeline's process tree, their ratios to
idle, and whether the run reproduced the committed results. The wall ratio measures the share
the scheduler gives; the CPU ratio measures waste (threads spinning on descheduled siblings
would inflate it).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUSY_LOOP = "while True: pass"
# A session leader that starts the loops and waits for SIGTERM (the loops share its session).
# It then kills and reaps them before it exits, so once the leader is waited on they are gone.
# SIGTERM stays blocked in the loops (the mask is inherited), hence SIGKILL.
ONE_SESSION = """
import signal, subprocess, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})
ps = [subprocess.Popen([sys.executable, "-c", {loop!r}]) for _ in range({n})]
signal.sigwait({{signal.SIGTERM}})
for p in ps:
    p.kill()
    p.wait()
"""


def start_load(busy: int, layout: str) -> list[subprocess.Popen]:
    """``busy`` loops in one new session (``one``) or each in its own (``own``)."""
    if busy == 0:
        return []
    if layout == "one":
        code = ONE_SESSION.format(loop=BUSY_LOOP, n=busy)
        return [subprocess.Popen([sys.executable, "-c", code], start_new_session=True)]
    return [
        subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True)
        for _ in range(busy)
    ]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        os.killpg(p.pid, 15)
        p.wait()


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def make_run(venv: Path) -> tuple[float, float, str]:
    """(wall s, CPU s, the recheck's verdict line) of ``make run`` in a fresh clone."""
    with tempfile.TemporaryDirectory(prefix="run_under_load_") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        # The clone's pyproject is newer than the venv's install stamp: age it so make reuses
        # the venv instead of reinstalling the clone into it.
        os.utime(clone / "pyproject.toml", (0, 0))
        cpu0, start = children_cpu(), time.perf_counter()
        out = subprocess.run(
            ["make", "run", f"VENV={venv}"], cwd=clone, capture_output=True, text=True
        )
        wall, cpu = time.perf_counter() - start, children_cpu() - cpu0
    if out.returncode:
        sys.exit(f"make run failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    verdict = re.search(r"^\d+ committed files: [^;]+", out.stdout, re.M)
    return wall, cpu, verdict.group(0) if verdict else "no recheck line"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=4)
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv")
    ap.add_argument("--layouts", nargs="+", default=["one", "own"], choices=["one", "own"])
    args = ap.parse_args()
    venv = args.venv.resolve()
    conditions = [("idle", 0, "one")] + [
        (
            f"{args.busy} busy loops, {'one session' if lay == 'one' else 'a session each'}",
            args.busy,
            lay,
        )
        for lay in args.layouts
    ]
    idle = None
    for label, busy, layout in conditions:
        load = start_load(busy, layout)
        try:
            time.sleep(5 if busy else 0)
            wall, cpu, verdict = make_run(venv)
        finally:
            stop_load(load)
        idle = idle or (wall, cpu)
        print(
            f"{label}: wall {wall:.0f} s ({wall / idle[0]:.2f}x idle), "
            f"CPU {cpu:.0f} s ({cpu / idle[1]:.2f}x idle), "
            f"load average {os.getloadavg()[0]:.1f}; {verdict}",
            flush=True,
        )


if __name__ == "__main__":
    main()
