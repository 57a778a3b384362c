"""Peak memory of one FedSimCLR round against the client count: memory O(model), not
O(clients).

The default pipeline's FedSimCLR (its model, augmentation, batch, optimizer, precision policy)
trains one round over the same 20,000 Fashion-MNIST training images split IID into 10, 100 or
1,000 clients, every client taking part, each size in a fresh process with oneDNN's kernel
cache capped and the threads set as in every stage (one unless ``FEDSSL_THREADS`` says).
Prints per size the process's peak resident memory (``ru_maxrss``) and its resident memory
before the round (data and model loaded). FedAvg sums each client's upload as it finishes
(``RunningMean``); ``--stacked`` makes the strategy read every upload instead (the path of
strategies that need each client's model, and FedAvg's before the running sum), to compare
the two in one session:

    python benchmarks/round_memory.py [--clients 10 100 1000] [--images 20000] [--stacked]

    clients   before MB   peak MB   round's own MB
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

PRESET = "fmnist_fedsimclr"


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_round(clients: int, images: int, stacked: bool = False, seed: int = 0) -> dict:
    """One round in this process (a fresh one: ``ru_maxrss`` never goes down)."""
    from fedssl import precision
    from fedssl.data.catalog import load_dataset
    from fedssl.data.partition import stratified_subset
    from fedssl.fl.cohort import LocalData
    from fedssl.methods import federated
    from fedssl.models.encoders import seeded_contrastive_model
    from fedssl.presets import Presets
    from fedssl.stage.base import bound_kernel_cache, keep_freed_memory, set_threads

    bound_kernel_cache()  # as every stage does
    keep_freed_memory()
    set_threads()
    p = Presets().load("experiment", PRESET).method
    block = p.federation.model_copy(update={"rounds": 1, "client_fraction": 1.0})
    p = p.model_copy(update={"federation": block})
    split = load_dataset("fashion_mnist")["train"]
    pool = np.random.default_rng(seed).permutation(stratified_subset(split.labels, images, seed))
    x = torch.from_numpy(np.array(split.images))
    labels = torch.zeros(len(x), dtype=torch.int64)
    data = LocalData(x, labels, list(np.array_split(pool, clients)))
    with precision.policy("auto"), tempfile.TemporaryDirectory() as tmp:
        model = seeded_contrastive_model(p.model, tuple(x.shape[1:]), p.seed, torch.device("cpu"))
        fed = federated.make_federation(p, model, data, Path(tmp) / "c.pt", "memory")
        if stacked:  # every upload kept until aggregation, as a strategy that reads them all
            fed.strategy.needs_uploads = lambda: True
        assert fed.strategy.needs_uploads() == stacked
        before = rss_mb()
        t0 = time.process_time()
        state = fed.run(fed.start(model))
        cpu_s = time.process_time() - t0
        used = precision.resolved(torch.device("cpu"))
    return {
        "before_mb": before,
        "peak_mb": rss_mb(),
        "cpu_s": cpu_s,  # the round and its checkpoint, process CPU seconds
        "loss": state.log[-1]["loss"],
        "precision": used,
        "threads": torch.get_num_threads(),
        "parameters": sum(q.numel() for q in model.parameters()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--stacked", action="store_true", help="keep every upload (no running sum)")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # the child's size
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one_round(args.one, args.images, args.stacked)))
        return
    rows = []
    for n in args.clients:
        child = [sys.executable, __file__, "--one", str(n), "--images", str(args.images)]
        child += ["--stacked"] * args.stacked
        out = subprocess.run(child, check=True, capture_output=True, text=True).stdout
        rows.append({"clients": n, **json.loads(out.strip().splitlines()[-1])})
        r = rows[-1]
        print(
            f"{n:>7} clients: before {r['before_mb']:.0f} MB, peak {r['peak_mb']:.0f} MB, "
            f"round's own {r['peak_mb'] - r['before_mb']:.0f} MB ({r['precision']}, "
            f"{r['threads']} thread(s), "
            f"{r['parameters']:,} parameters, loss {r['loss']:.6f})",
            flush=True,
        )
    first = rows[0]["peak_mb"]
    for r in rows[1:]:
        print(
            f"peak at {r['clients']} clients / at {rows[0]['clients']}: {r['peak_mb'] / first:.3f}"
        )


if __name__ == "__main__":
    main()
