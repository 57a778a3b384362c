"""The peer side by side: FedSimCLR rounds on this project's engine against the same rounds as a
conventional Flower app (the shape of Flower's PyTorch quickstart: a ``ClientApp`` that loads
the global weights into a fresh model, trains one epoch over a ``DataLoader`` with torchvision's
PIL transforms and fresh Adam, and replies its weights; Flower's own ``FedAvg`` strategy on the
``ServerApp``) in Flower's simulation engine (Ray), at 10 / 100 / 1,000 clients over the same
20,000 Fashion-MNIST training images (a stratified subset split IID into equal clients).

Both sides: the default pipeline's FedSimCLR model, batch, optimizer, learning rate and
augmentation (``fmnist_fedsimclr``), every client every round, one thread (one Ray actor for
Flower: its clients in turn, as ours). Ours runs under the precision policy (``--precision``,
default ``auto``); Flower in fp32, as such an app does. Each (side, size) runs in a process of
its own while this script samples that process and every process below it (Ray's raylet, GCS
and workers) every 0.2 s: peak memory is the largest sum of their proportional set sizes (PSS,
so shared pages count once; RSS where the kernel has no PSS), CPU is the tree's user + system
seconds. A round's seconds: ours from the engine's round log, Flower's between the calls of the
strategy's ``evaluate_fn`` (before round 1 and after each round); the median over the rounds
after the first. Linux only (``/proc`` through psutil).

    python benchmarks/flower_peer.py [--clients 10 100 1000] [--images 20000] [--rounds 3]

needs ``pip install -e '.[flower]'``; prints a row per client count and the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import torch

HERE = Path(__file__).resolve().parent
PRESET = "fmnist_fedsimclr"


def clients_of(images: int, clients: int, seed: int = 0) -> tuple[np.ndarray, list]:
    """The training split's images and ``clients`` equal IID shares of a stratified subset."""
    from fedssl.data.partition import stratified_subset
    from fedssl.data.sources import load_dataset

    split = load_dataset("fashion_mnist")["train"]
    pool = stratified_subset(split.labels, images, seed)
    pool = np.random.default_rng(seed).permutation(pool)
    return split.images, np.array_split(pool, clients)


def method():
    from fedssl.presets import Presets

    return Presets().load("experiment", PRESET).method


# ----------------------------------------------------------------------------- ours
def run_ours(clients: int, images: int, rounds: int, setting: str) -> dict:
    from fedssl import precision
    from fedssl.fl.cohort import LocalData
    from fedssl.methods import federated
    from fedssl.models.encoders import seeded_contrastive_model

    p = method().model_copy(update={"rounds": rounds, "client_fraction": 1.0})
    data, shares = clients_of(images, clients)
    x = torch.from_numpy(np.array(data))
    with precision.policy(setting), tempfile.TemporaryDirectory() as tmp:
        model = seeded_contrastive_model(p.model, tuple(x.shape[1:]), p.seed, torch.device("cpu"))
        labels = torch.zeros(len(x), dtype=torch.int64)
        fed = federated.make_federation(
            p, model, LocalData(x, labels, list(shares)), Path(tmp) / "c.pt", "peer"
        )
        state = fed.run(fed.start(model))
        used = precision.resolved(torch.device("cpu"))
    return {"seconds": [r["seconds"] for r in state.log], "precision": used}


# ----------------------------------------------------------------------------- Flower
def run_flower(clients: int, images: int, rounds: int) -> dict:
    from federated_round import TwoViews, pil_transform, simclr_loss_eager
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation
    from torch.utils.data import DataLoader

    from fedssl.models.encoders import seeded_contrastive_model

    p = method()
    cache: dict = {}

    def local():  # built once per Ray actor, as a Flower app loads its data set once
        if not cache:
            data, shares = clients_of(images, clients)
            cache.update(images=data, shares=shares, loss=simclr_loss_eager(p.temperature))
            cache["transform"] = pil_transform(p.augment, data.shape[-1], data.shape[1])
        return cache

    def new_model():
        return seeded_contrastive_model(p.model, (1, 28, 28), p.seed, torch.device("cpu"))

    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        c = local()
        idx = c["shares"][int(context.node_config["partition-id"])]
        model = new_model()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        opt = torch.optim.Adam(model.parameters(), lr=float(msg.content["config"]["lr"]))
        loader = DataLoader(
            TwoViews(c["images"][idx], c["transform"]), batch_size=p.batch_size, shuffle=True
        )
        model.train()
        for _ in range(p.local_epochs):
            for v1, v2 in loader:
                loss = c["loss"](model, v1, v2)
                opt.zero_grad()
                loss.backward()
                opt.step()
        reply = {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"loss": loss.item(), "num-examples": len(idx)}),
        }
        return Message(RecordDict(reply), reply_to=msg)

    stamps: list[float] = []
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=clients)

        def stamp(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            stamps.append(time.perf_counter())
            return MetricRecord({})

        strategy.start(
            grid,
            ArrayRecord(new_model().state_dict()),
            num_rounds=rounds,
            train_config=ConfigRecord({"lr": p.lr}),
            evaluate_fn=stamp,
        )

    run_simulation(
        server,
        client,
        num_supernodes=clients,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 1, "include_dashboard": False},
        },
    )
    if len(stamps) != rounds + 1:
        raise RuntimeError(f"Flower ran {len(stamps) - 1} of {rounds} rounds (see its log above)")
    return {"seconds": np.diff(stamps).round(3).tolist(), "precision": "fp32"}


# ----------------------------------------------------------------------------- the parent
class TreeSampler(threading.Thread):
    """Peak PSS (MB) and CPU seconds of a process and everything below it."""

    def __init__(self, pid: int, every: float = 0.2):
        super().__init__(daemon=True)
        self.root, self.every = psutil.Process(pid), every
        self.peak_mb, self.cpu = 0.0, {}
        self.done = threading.Event()

    def sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        total = 0
        for proc in procs:
            try:
                mem = proc.memory_full_info()
                total += getattr(mem, "pss", mem.rss)
                t = proc.cpu_times()
                self.cpu[proc.pid] = t.user + t.system + t.children_user + t.children_system
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        self.peak_mb = max(self.peak_mb, total / 2**20)

    def run(self) -> None:
        while not self.done.wait(self.every):
            self.sample()


def measure(side: str, clients: int, args) -> dict:
    cmd = [sys.executable, __file__, "--side", side, "--clients", str(clients)]
    cmd += ["--images", str(args.images), "--rounds", str(args.rounds)]
    cmd += ["--precision", args.precision]
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True)
        sampler = TreeSampler(proc.pid)
        sampler.start()
        start = time.perf_counter()
        _, err = proc.communicate()
        wall = time.perf_counter() - start
        sampler.done.set()
        sampler.join()
        if proc.returncode:
            raise RuntimeError(f"{side} at {clients} clients failed:\n{err[-4000:]}")
        out.seek(0)
        result = json.loads(out.read().strip().splitlines()[-1])
    later = result["seconds"][1:] or result["seconds"]
    return {
        **result,
        "round_s": statistics.median(later),
        "img_s": args.images * method().local_epochs / statistics.median(later),
        "peak_mb": sampler.peak_mb,
        "cpu_s": sum(sampler.cpu.values()),
        "wall_s": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--precision", default="auto", help="our side's precision policy")
    ap.add_argument(
        "--sides",
        nargs="+",
        choices=["ours", "flower"],
        default=["ours", "flower"],
        help="which sides to run (ours alone: e.g. again in fp32 with --precision fp32)",
    )
    ap.add_argument("--side", choices=["ours", "flower"], help=argparse.SUPPRESS)  # the child
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.side:
        (n,) = args.clients
        if args.side == "ours":
            result = run_ours(n, args.images, args.rounds, args.precision)
        else:
            result = run_flower(n, args.images, args.rounds)
        print(json.dumps(result))
        return
    print(
        f"FedSimCLR ({PRESET}), {args.images} images, {args.rounds} rounds, one thread; median "
        "round after the first; peak = the process tree's PSS; CPU = the whole run's",
        flush=True,
    )
    print("| clients | side | precision | s/round | img/s | peak MB | CPU s | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.clients:
        runs = {side: measure(side, n, args) for side in args.sides}
        for side, r in runs.items():
            print(
                f"| {n} | {side.replace('flower', 'Flower')} | {r['precision']} | "
                f"{r['round_s']:.2f} | {r['img_s']:.0f} | "
                f"{r['peak_mb']:.0f} | {r['cpu_s']:.0f} | {r['wall_s']:.0f} |"
            )
        if len(runs) < 2:
            continue
        ours, flower = runs["ours"], runs["flower"]
        print(
            f"| {n} | Flower / ours | | {flower['round_s'] / ours['round_s']:.2f} | | "
            f"{flower['peak_mb'] / ours['peak_mb']:.2f} | {flower['cpu_s'] / ours['cpu_s']:.2f} "
            f"| {flower['wall_s'] / ours['wall_s']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
