"""Whether BatchNorm clients could share their local step on the CPU: the default pipeline's
BN model (``fmnist_fedsimclr``), one local step (forward, backward) for each of N clients of
R rows, three ways, each the process CPU seconds of the N clients, one thread, in turns:

* ``loop``: one client at a time, plain autograd (what a BN cohort runs, ``CohortTrainer``);
* ``stacked``: ``torch.func.vmap`` over client-stacked weights and per-client BN buffers (what
  a non-BN cohort runs with ``parallel_clients: on``): convolutions become grouped ones;
* ``shared``: vmap over the clients' batches and buffers with one shared copy of the weights
  (every client's first step from the downloaded model): plain convolutions forward, per-client
  weight gradients backward.

    python benchmarks/stacked_bn_step.py [--clients 100] [--rows 40] [--turns 2]
    [--precision fp32 bf16]

A row of ``bf16`` that fails names the error (autocast under vmap).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.func import functional_call, grad_and_value, vmap

from fedssl import precision
from fedssl.models.encoders import seeded_contrastive_model
from fedssl.presets import Presets
from fedssl.stage.runtime import cpu_summary


def ways(clients: int, rows: int) -> dict:
    p = Presets().load("experiment", "fmnist_fedsimclr").method
    model = seeded_contrastive_model(p.model, (1, 28, 28), 0, torch.device("cpu"))
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = dict(model.named_buffers())
    x = torch.randn(clients, rows, 1, 28, 28, generator=torch.Generator().manual_seed(0))

    def loss(w, b, xb):
        out = precision.under_policy(xb, functional_call, model, (w, b), (xb,))
        return out.float().pow(2).mean()

    def rows_of(tree):
        return {k: v.expand(clients, *v.shape).clone() for k, v in tree.items()}

    def loop():
        for c in range(clients):
            w = {k: v.clone().requires_grad_(True) for k, v in params.items()}
            b = {k: v.clone() for k, v in buffers.items()}
            torch.autograd.grad(loss(w, b, x[c]), list(w.values()))

    step = grad_and_value(loss)
    stacked_w, stacked_b = rows_of(params), rows_of(buffers)
    return {
        "loop": loop,
        "stacked": lambda: vmap(step)(stacked_w, rows_of(buffers), x),
        "shared": lambda: vmap(step, in_dims=(None, 0, 0))(params, stacked_b, x),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rows", type=int, default=40, help="rows a client's step (views x images)")
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--precision", nargs="+", default=["fp32", "bf16"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# {cpu_summary()}, one thread; load average {os.getloadavg()}")
    print(f"# {args.clients} clients x {args.rows} rows, one step each; CPU-s, turns")
    for setting in args.precision:
        with precision.policy(setting):
            fns = ways(args.clients, args.rows)
            seconds: dict[str, list | str] = {name: [] for name in fns}
            for _ in range(args.turns):  # the ways in turns
                for name, fn in fns.items():
                    if isinstance(seconds[name], list):
                        seconds[name] = _timed(fn, seconds[name])
        for name, s in seconds.items():
            print(f"{setting:>5} {name:>8}: {s}", flush=True)


def _timed(fn, so_far: list) -> list | str:
    """``so_far`` with fn's CPU seconds appended, or the error that stopped it."""
    t0 = time.process_time()
    try:
        fn()
    except RuntimeError as e:
        return f"fails: {str(e).splitlines()[0]}"
    return [*so_far, round(time.process_time() - t0, 3)]


if __name__ == "__main__":
    main()
