"""Seconds per federated round: FedSimCLR on this project's engine against the same rounds as a
Flower app in Flower's simulation engine (Ray, one SuperNode per client), side by side in one
process on the same clients, data, model and seeds; both end at the same global model, which
the script checks bit for bit.

A round's time is the engine's own (sampling to server step, from the round log): for Flower
it includes serialising the tensors into messages and the SuperNodes' work, but not starting
the simulation (Ray, actors), reported apart. The first Flower round also builds each
client's federation in its actor, so the per-round figure is the median over the rounds after
the first (for both).

    python benchmarks/flower_round.py [--clients 2] [--per-client 200] [--rounds 4]

needs ``pip install -e '.[flower]'``; prints
    engine <s> s/round, Flower simulation <s> s/round, ratio <R>; Flower start-up <s> s
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fedssl.fl.cohort import LocalData
from fedssl.flower.app import simulate
from fedssl.methods import federated
from fedssl.methods.fedsimclr import FedSimCLRParams
from fedssl.models.encoders import seeded_contrastive_model

SHAPE = (1, 28, 28)


class Build:
    """The federation every side builds (the server, the engine, each SuperNode)."""

    def __init__(self, clients: int, per_client: int, rounds: int, folder: str):
        self.clients, self.per_client, self.rounds, self.folder = (
            clients,
            per_client,
            rounds,
            folder,
        )

    def __call__(self, context=None, name: str = "client"):
        p = FedSimCLRParams.model_validate(
            {
                "model": {"arch": "small_cnn", "width": 8, "channels_per_group": 4},
                "federation": {
                    "rounds": self.rounds,
                    "batch_size": 32,
                    "parallel_clients": "off",  # clients one at a time, as a Flower client trains
                },
            }
        )
        g = torch.Generator().manual_seed(0)
        n = self.clients * self.per_client
        images = torch.randint(0, 256, (n, *SHAPE), dtype=torch.uint8, generator=g)
        clients = list(np.arange(n).reshape(self.clients, self.per_client))
        data = LocalData(images, torch.zeros(n, dtype=torch.int64), clients)
        model = seeded_contrastive_model(p.model, SHAPE, p.seed, torch.device("cpu"))
        ckpt = Path(self.folder) / f"{name}.pt"
        return model, federated.make_federation(p, model, data, ckpt, name)


def per_round(state) -> float:
    return statistics.median(r["seconds"] for r in state.log[1:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--per-client", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)  # as the SuperNodes' actors (one CPU each)
    with tempfile.TemporaryDirectory() as folder:
        build = Build(args.clients, args.per_client, args.rounds, folder)
        model, engine = build(name="engine")
        ours = engine.run(engine.start(model))
        model, server = build(name="server")
        runs = []

        def run(trainer):
            server.trainer = trainer
            runs.append(server.run(server.start(model)))

        t0 = time.perf_counter()
        simulate(run, build, args.clients)
        total = time.perf_counter() - t0
    flower = runs[0]
    same = all(torch.equal(flower.server["global"][k], v) for k, v in ours.server["global"].items())
    a, b = per_round(ours), per_round(flower)
    startup = total - sum(r["seconds"] for r in flower.log)
    print(
        f"{args.clients} clients x {args.per_client} images, {args.rounds} rounds: engine "
        f"{a:.3f} s/round, Flower simulation {b:.3f} s/round, ratio {b / a:.2f}; Flower "
        f"start-up {startup:.1f} s; same global model: {same}"
    )


if __name__ == "__main__":
    main()
