"""What glibc's allocator costs a round: FedSimCLR's round at the default pipeline's scale
(``flower_peer.py``'s own side: 20,000 images, 10 clients, one thread), each run a fresh
process, in turns: with glibc's default policy (a freed block over its dynamic mmap threshold
goes back to the kernel, and the next step's same-sized activations fault their pages in
again, zero-filled) and with the policy every stage sets
(:func:`fedssl.stage.base.keep_freed_memory`: freed blocks stay in the heap for reuse). Per
run: seconds a round (wall, on a quiet machine; median after the first), the kernel's share
of the process's CPU, minor page faults a round, and the peak resident memory. Ratio: default
/ kept.

    python benchmarks/page_faults.py [--pairs 3] [--rounds 3] [--precision fp32_channels_last]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

from fedssl.stage.runtime import cpu_summary

SIDES = ("default", "kept")


def child(side: str, rounds: int, setting: str, clients: int, images: int) -> dict:
    from flower_peer import run_ours

    torch.set_num_threads(1)
    marks = []

    def usage():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime, r.ru_stime, r.ru_minflt

    marks.append(usage())
    result = run_ours(clients, images, rounds, setting, keep_memory=side == "kept")
    marks.append(usage())
    cpu, sys_s, faults = (b - a for a, b in zip(*marks))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    later = result["seconds"][1:] or result["seconds"]
    return {
        "side": side,
        "round_s": statistics.median(later),
        "kernel_share": sys_s / cpu,
        "faults_a_round": faults / rounds,
        "peak_mb": rss,
    }


def environment() -> dict[str, str]:
    """The children's: one thread, and no glibc variable of the user's (each side's policy is
    its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    return env | {"OMP_NUM_THREADS": "1"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--precision", default="fp32_channels_last")
    ap.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # the child
    args = ap.parse_args()
    if args.side:
        print(json.dumps(child(args.side, args.rounds, args.precision, args.clients, args.images)))
        return
    print(f"{cpu_summary()}; {args.clients} clients, {args.images} images, {args.rounds} rounds, "
          f"precision {args.precision}, one thread, {time.strftime('%Y-%m-%d %H:%M')}")  # fmt: skip
    print("| allocator | s a round (wall, one thread) | kernel share of CPU | page faults a round "
          "| peak MB |")  # fmt: skip
    print("|---|---|---|---|---|")
    rows: dict[str, list[dict]] = {s: [] for s in SIDES}
    for _ in range(args.pairs):
        for side in SIDES:
            out = subprocess.run(
                [sys.executable, __file__, "--side", side, "--rounds", str(args.rounds),
                 "--clients", str(args.clients), "--images", str(args.images),
                 "--precision", args.precision],
                capture_output=True, text=True, check=True, env=environment(),
            )  # fmt: skip
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows[side].append(r)
            print(f"| {side} | {r['round_s']:.2f} | {r['kernel_share']:.0%} | "
                  f"{r['faults_a_round']:,.0f} | {r['peak_mb']:.0f} |", flush=True)  # fmt: skip
    med = {s: statistics.median(r["round_s"] for r in rows[s]) for s in SIDES}
    ratio = med["default"] / med["kept"]
    print(f"default / kept (medians of {args.pairs}): a round {ratio:.2f}x "
          f"({med['default']:.1f} / {med['kept']:.1f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
