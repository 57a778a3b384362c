"""Does a thread setting survive load? The default training step (FedSimCLR's CNN, 2 x 128
views, under the precision policy as a stage runs it) at each thread setting, with 0, 1, ...
busy loops (other jobs, one core each) running beside it.

    python benchmarks/threads.py [--threads 1 2] [--busy 0 1 2] [--repeats 3] [--seconds 4]
                                 [--precision auto|fp32|bf16]

Each setting is a process of its own, started once (OpenMP reads ``OMP_WAIT_POLICY`` when it
loads) and timed in turns with the others, setting after setting within each repeat, so the
machine's other load hits them alike. ``default`` is GNU OpenMP's own wait policy (idle threads
spin before they sleep), ``passive`` is ``OMP_WAIT_POLICY=PASSIVE`` (they sleep at once).
Prints img/s (medians over repeats) and each setting's ratio to one thread, per busy count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUSY_LOOP = "while True: pass"


def child(seconds: float, setting: str) -> None:
    """Build the step, warm it up, then on each line of stdin run it for ``seconds`` and print
    images per second."""
    import torch

    sys.path.insert(0, str(HERE))
    from step_limits import model_step, simclr_cnn

    from fedssl import precision
    from fedssl.stage.base import bound_kernel_cache, set_threads

    bound_kernel_cache()
    set_threads()
    with precision.policy(setting):
        step, images, _ = model_step(*simclr_cnn())
        step()
        print(f"ready {torch.get_num_threads()}", flush=True)
        for _ in sys.stdin:
            start, steps = time.perf_counter(), 0
            while time.perf_counter() - start < seconds:
                step()
                steps += 1
            print(steps * images / (time.perf_counter() - start), flush=True)


def settings(thread_counts: list[int]) -> dict[str, dict]:
    """label -> environment of a setting: each thread count, and past one both wait policies."""
    out = {}
    for n in thread_counts:
        policies = ("default", "passive") if n > 1 else ("default",)
        for wait in policies:
            env = {"FEDSSL_THREADS": str(n), "OMP_NUM_THREADS": str(n)}
            if wait == "passive":
                env["OMP_WAIT_POLICY"] = "PASSIVE"
            out[f"{n} thread{'s' if n > 1 else ''}, {wait}"] = env
    return out


def start(env: dict, seconds: float, setting: str) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", "--seconds", str(seconds), "--precision", setting],
        env={**base, **env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("ready"), line
    return proc


def time_once(proc: subprocess.Popen) -> float:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return float(proc.stdout.readline())


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0, help="timed seconds per measurement")
    ap.add_argument("--precision", default="auto", help="the step's precision setting")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.seconds, args.precision)
        return
    from fedssl.stage.runtime import cpu_summary

    print(f"{cpu_summary()}; precision {args.precision}; load average {load()}", flush=True)
    envs = settings(args.threads)
    procs = {label: start(env, args.seconds, args.precision) for label, env in envs.items()}
    table = {}
    try:
        for busy in args.busy:
            loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(busy)]
            try:
                runs = {label: [] for label in procs}
                for _ in range(args.repeats):
                    for label, proc in procs.items():
                        runs[label].append(time_once(proc))
            finally:
                for loop in loops:
                    loop.kill()
                    loop.wait()
            table[busy] = {label: statistics.median(v) for label, v in runs.items()}
            one = next(iter(table[busy].values()))
            cells = "; ".join(
                f"{lb} {v:.0f} img/s ({v / one:.2f}x)" for lb, v in table[busy].items()
            )
            print(f"{busy} busy loop(s), load average {load()}: {cells}", flush=True)
    finally:
        for proc in procs.values():
            proc.kill()


if __name__ == "__main__":
    main()
