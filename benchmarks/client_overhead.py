"""What a client costs a round: the default pipeline's FedSimCLR round (``round_memory.py``'s,
every client taking part) at 10 and at 1,000 clients over the same images, each size in a fresh
process, one thread, in turns; the medians of the process CPU seconds of the round, the ratio
1,000 / 10 and the per-client overhead (the difference over the 990 extra clients), split by
part of the round (timed in the child around each engine function, CPU seconds):

    python benchmarks/client_overhead.py [--clients 10 1000] [--images 2000 20000] [--turns 3]
        [--baseline DIR]

``--baseline DIR``: a checkout of the code before a change (its ``fedssl`` imported first),
run in turns with this one (each size, baseline then this checkout), both tables printed.

A BatchNorm model trains its clients one at a time, one local step each where a client has
fewer images than a batch: the ``step`` part (forward, backward, optimizer) is the fixed cost
of a step on a tiny batch, which only vectorised clients remove; the rest is bookkeeping.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# part -> (module, owner or None, attribute): the functions the child times (cumulative)
PARTS = {
    "sample": ("fedssl.strategies.base", "Strategy", "sample"),
    "download": ("fedssl.rounds.loop", None, "client_starts"),
    "stack": ("fedssl.fl.cohort", None, "stack"),
    "refill": ("fedssl.fl.cohort", None, "refill"),
    "opt_init": ("fedssl.fl.cohort", "StackedOptimizer", "init"),
    "opt_reset": ("fedssl.fl.cohort", "StackedOptimizer", "reset"),
    "schedule": ("fedssl.fl.cohort", None, "client_batches"),
    "gather": ("fedssl.fl.cohort", "CohortTrainer", "_gather_batch"),
    "step": ("fedssl.fl.cohort", "CohortTrainer", "_step"),
    "upload": ("fedssl.rounds.loop", "ClientReturns", "__call__"),
    "aggregate": ("fedssl.strategies.base", "Strategy", "aggregate"),
    "checkpoint": ("fedssl.rounds.loop", None, "torch_save"),
}


def timed(parts: dict) -> None:
    """Wrap each part's function with a CPU-time accumulator (outermost call only); a part
    the measured checkout lacks (a baseline's older code) stays at zero (the test
    ``test_the_client_overhead_benchmark_times_functions_the_engine_has`` holds this
    checkout's parts to exist)."""
    import importlib

    for name, (mod, owner, attr) in PARTS.items():
        m = importlib.import_module(mod)
        holder = getattr(m, owner) if owner else m
        parts[name] = 0.0
        if attr in vars(holder):
            setattr(holder, attr, _accumulate(getattr(holder, attr), parts, name))


def _accumulate(fn, parts: dict, name: str):
    def wrapper(*args, **kwargs):
        t0 = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            parts[name] += time.process_time() - t0

    return wrapper


def child(clients: int, images: int) -> dict:
    sys.path.insert(0, str(HERE))
    from round_memory import one_round

    parts: dict[str, float] = {}
    timed(parts)
    out = one_round(clients, images)
    return {**out, "parts": parts}


def run(clients: int, images: int, checkout: str | None = None) -> dict:
    """One round in a fresh process, importing ``fedssl`` from ``checkout`` (None: this one)."""
    cmd = [sys.executable, __file__, "--one", str(clients), "--images", str(images)]
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join([checkout, env.get("PYTHONPATH", "")])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def report(images: int, rows: dict[int, list[dict]], label: str = "") -> None:
    med = {n: _median_row(r) for n, r in rows.items()}
    lo, hi = min(med), max(med)
    extra = hi - lo
    print(f"== {label}{images} images; CPU-s of the round, median of {len(rows[lo])} turn(s)")
    print(f"{'part':>12}" + "".join(f"{n:>11} cl" for n in med) + "   ms / extra client")
    for part in [*PARTS, "other", "round"]:
        vals = [m[part] for m in med.values()]
        per = (med[hi][part] - med[lo][part]) / extra * 1e3
        print(f"{part:>12}" + "".join(f"{v:>14.3f}" for v in vals) + f"{per:>18.3f}")
    peaks = ", ".join(f"{n}: {m['peak_mb']:.0f}" for n, m in med.items())
    for n in [n for n in med if n != lo]:
        print(f"round at {n} / at {lo} clients: {med[n]['round'] / med[lo]['round']:.2f}x")
    turns = "; ".join(f"{n}: {[round(r['cpu_s'], 2) for r in rows[n]]}" for n in rows)
    print(f"turns {turns}; peak MB {peaks}", flush=True)


def _median_row(turns: list[dict]) -> dict:
    """Each part's median over the turns; 'other' the round less its timed parts."""
    out = {p: statistics.median(t["parts"][p] for t in turns) for p in PARTS}
    out["round"] = statistics.median(t["cpu_s"] for t in turns)
    out["other"] = out["round"] - sum(out[p] for p in PARTS)
    out["peak_mb"] = statistics.median(t["peak_mb"] for t in turns)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 1000])
    ap.add_argument("--images", type=int, nargs="+", default=[2000, 20000])
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="a checkout to run in turns with this one")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # the child's size
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(child(args.one, args.images[0])))
        return
    from fedssl.stage.runtime import cpu_summary

    print(f"# {cpu_summary()}, one thread a process; load average {os.getloadavg()}")
    checkouts = {"baseline": args.baseline, "this": None} if args.baseline else {"": None}
    for images in args.images:
        rows = {c: {n: [] for n in args.clients} for c in checkouts}
        for _ in range(args.turns):
            for n in args.clients:
                for c, path in checkouts.items():
                    rows[c][n].append(run(n, images, path))
        for c in checkouts:
            report(images, rows[c], f"{c} checkout, " if c else "")
        print(f"== load average {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
