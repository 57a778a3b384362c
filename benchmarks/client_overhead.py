"""What a client costs a round: the default pipeline's FedSimCLR round (``round_memory.py``'s,
every client taking part) at 10 and at 1,000 clients over the same images, each size in a fresh
process, one thread, in turns; the medians of the process CPU seconds of the round, the ratio
1,000 / 10 and the per-client overhead (the difference over the 990 extra clients), split by
part of the round (timed in the child around each engine function, CPU seconds):

    python benchmarks/client_overhead.py [--clients 10 1000] [--images 2000 20000] [--turns 3]

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
    "opt_init": ("fedssl.fl.cohort", "StackedOptimizer", "init"),
    "schedule": ("fedssl.fl.cohort", None, "client_batches"),
    "gather": ("fedssl.fl.cohort", "CohortTrainer", "_gather_batch"),
    "step": ("fedssl.fl.cohort", "CohortTrainer", "_step"),
    "upload": ("fedssl.rounds.loop", "ClientReturns", "__call__"),
    "aggregate": ("fedssl.strategies.base", "Strategy", "aggregate"),
    "checkpoint": ("fedssl.rounds.loop", None, "torch_save"),
}


def timed(parts: dict) -> None:
    """Wrap each part's function with a CPU-time accumulator (outermost call only)."""
    import importlib

    for name, (mod, owner, attr) in PARTS.items():
        m = importlib.import_module(mod)
        holder = getattr(m, owner) if owner else m
        parts[name] = 0.0
        holder.__dict__[attr]  # noqa: B018 -- fail early where a part moved
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


def run(clients: int, images: int) -> dict:
    cmd = [sys.executable, __file__, "--one", str(clients), "--images", str(images)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def report(images: int, rows: dict[int, list[dict]]) -> None:
    med = {n: _median_row(r) for n, r in rows.items()}
    lo, hi = min(med), max(med)
    extra = hi - lo
    print(f"== {images} images; CPU-s of the round, median of {len(rows[lo])} turn(s)")
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
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # the child's size
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(child(args.one, args.images[0])))
        return
    from fedssl.stage.runtime import cpu_summary

    print(f"# {cpu_summary()}, one thread a process; load average {os.getloadavg()}")
    for images in args.images:
        rows: dict[int, list[dict]] = {n: [] for n in args.clients}
        for _ in range(args.turns):
            for n in args.clients:
                rows[n].append(run(n, images))
        report(images, rows)


if __name__ == "__main__":
    main()
