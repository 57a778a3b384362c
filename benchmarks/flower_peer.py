"""The peer side by side: FedSimCLR rounds on this project's engine against the same rounds as a
conventional Flower app, through both of Flower's simulation paths: ``start_simulation`` (a
``NumPyClient`` per call, the legacy ``FedAvg``) and ``run_simulation`` (a ``ClientApp`` /
``ServerApp`` pair, Flower's own ``FedAvg`` on the message API). The client is the shape of
Flower's PyTorch quickstart: it loads the global weights into a fresh model, trains one epoch
over a ``DataLoader`` with torchvision's PIL transforms and fresh Adam, and replies its weights.
Its data set is loaded once per Ray worker process (:func:`local_data`, cached in this module,
which the workers import by name) as a Flower app loads it, never shipped with a message.
Clients: 10 / 100 / 1,000 equal IID shares of the same Fashion-MNIST training images.

Both sides: the default pipeline's FedSimCLR model, batch, optimizer, learning rate and
augmentation (``fmnist_fedsimclr``), every client every round, one thread, one core (the
measured process tree is pinned to one CPU, Ray's one actor included, the sampler to another
where there is one, and its own CPU time is printed). Ours runs under the precision policy
(``--precision``, default ``auto``) and compile setting (``--compile``, default ``off``; a
compiled step compiles in round 1, which the per-round median leaves out and the whole run's CPU
counts); Flower in fp32, as such an app does, or (``--peer-precision bf16``) with its client's
forward and loss under bf16 autocast. Each run is a process
of its own; the sides of a client count run in turns, ``--pairs`` times. Per run: CPU seconds a
round (the tree's CPU read at each round's end, median of the rounds after the first), the whole
run's CPU seconds, and the peak memory: the largest sum of the tree's proportional set sizes
(PSS, so shared pages count once), sampled every 0.5 s. Linux only (``/proc`` through psutil).

    python benchmarks/flower_peer.py [--clients 10 100 1000] [--images 20000] [--rounds 3]
                                     [--pairs 3] [--sides ours start_simulation run_simulation]

needs ``pip install -e '.[flower]'``; prints a row per run and the medians' ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import cache
from pathlib import Path

import numpy as np
import psutil
import torch

from fedssl.stage.runtime import cpu_summary

HERE = Path(__file__).resolve().parent
PRESET = "fmnist_fedsimclr"


def clients_of(images: int, clients: int, seed: int = 0) -> tuple[np.ndarray, list]:
    """The training split's images and ``clients`` equal IID shares of a stratified subset."""
    from fedssl.data.catalog import load_dataset
    from fedssl.data.partition import stratified_subset

    split = load_dataset("fashion_mnist")["train"]
    pool = stratified_subset(split.labels, images, seed)
    pool = np.random.default_rng(seed).permutation(pool)
    return split.images, np.array_split(pool, clients)


def method():
    from fedssl.presets import Presets

    return Presets().load("experiment", PRESET).method


# ----------------------------------------------------------------------------- ours
def run_ours(
    clients: int,
    images: int,
    rounds: int,
    setting: str,
    compile_: str = "off",
    keep_memory: bool = True,
) -> dict:
    """Our rounds as a stage runs them (``keep_memory``: its allocator setting, on in every
    stage; off only for ``page_faults.py``'s side by side)."""
    from fedssl import compiled, precision
    from fedssl.fl.cohort import LocalData
    from fedssl.methods import federated
    from fedssl.models.encoders import seeded_contrastive_model
    from fedssl.stage.base import keep_freed_memory

    if keep_memory:
        keep_freed_memory()
    p = method()
    block = p.federation.model_copy(update={"rounds": rounds, "client_fraction": 1.0})
    p = p.model_copy(update={"federation": block})
    data, shares = clients_of(images, clients)
    x = torch.from_numpy(np.array(data))
    choices: dict[str, str] = {}
    with (
        precision.policy(setting),
        compiled.policy(compile_, choices),
        tempfile.TemporaryDirectory() as tmp,
    ):
        model = seeded_contrastive_model(p.model, tuple(x.shape[1:]), p.seed, torch.device("cpu"))
        labels = torch.zeros(len(x), dtype=torch.int64)
        fed = federated.make_federation(
            p, model, LocalData(x, labels, list(shares)), Path(tmp) / "c.pt", "peer"
        )
        stamps = [time.time()]
        state = fed.run(fed.start(model), on_round=lambda _: stamps.append(time.time()))
        used = precision.resolved(torch.device("cpu"))
    if "on" in choices.values():  # the step compiled in round 1, outside the per-round median
        used += " compiled"
    return {"seconds": [r["seconds"] for r in state.log], "stamps": stamps, "precision": used}


# ----------------------------------------------------------------------------- Flower
@cache
def local_data(images: int, clients: int) -> dict:
    """A Flower client's data set, built once per process: every client call in a Ray worker
    reuses it (a Flower app loads its data set once per worker, never per message)."""
    if str(HERE) not in sys.path:  # the sibling benchmark, imported by a test too
        sys.path.insert(0, str(HERE))
    from federated_round import pil_transform, simclr_loss_eager

    data, shares = clients_of(images, clients)
    p = method()
    return {
        "images": data,
        "shares": shares,
        "loss": simclr_loss_eager(p.temperature),
        "transform": pil_transform(p.augment, data.shape[-1], data.shape[1]),
    }


def new_model():
    """The quickstart's model: the same seeded network, in PyTorch's default (contiguous)
    layout, as a conventional app builds it (our factory lays it out channels-last unless the
    policy is fp32)."""
    from fedssl import precision
    from fedssl.models.encoders import seeded_contrastive_model

    p = method()
    with precision.policy("fp32"):
        return seeded_contrastive_model(p.model, (1, 28, 28), p.seed, torch.device("cpu"))


def train_client(weights: dict, client: int, lr: float, images: int, clients: int, bf16: bool):
    """The quickstart's client: a fresh model with the global weights, one epoch over its
    DataLoader with fresh Adam (the forward and loss under bf16 autocast where ``bf16``, as
    PyTorch's mixed-precision recipe does it). Returns (weights, images, last loss)."""
    from federated_round import TwoViews
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    c, p = local_data(images, clients), method()
    idx = c["shares"][client]
    model = new_model()
    model.load_state_dict(weights)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loader = DataLoader(
        TwoViews(c["images"][idx], c["transform"]), batch_size=p.federation.batch_size, shuffle=True
    )
    model.train()
    for _ in range(p.federation.local_epochs):
        for v1, v2 in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = c["loss"](model, v1, v2)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.state_dict(), len(idx), loss.item()


def this_module():
    """This file as an imported module (not ``__main__``), in a Ray worker too: its cache
    lives as long as the worker, where functions pickled by value would start empty."""
    import flower_peer

    return flower_peer


RAY = {"num_cpus": 1, "include_dashboard": False}


def run_flower_legacy(clients: int, images: int, rounds: int, bf16: bool) -> dict:
    """``start_simulation``: a NumPyClient per call, the legacy FedAvg."""
    from flwr.client import NumPyClient
    from flwr.common import ndarrays_to_parameters
    from flwr.server import ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import start_simulation

    keys = list(new_model().state_dict())
    lr = method().federation.lr

    class Client(NumPyClient):
        def __init__(self, pid: int):
            self.pid = pid

        def fit(self, parameters, config):
            peer = this_module()
            weights = {k: torch.from_numpy(v) for k, v in zip(keys, parameters)}
            out, n, loss = peer.train_client(weights, self.pid, lr, images, clients, bf16)
            return [v.numpy() for v in out.values()], n, {"loss": loss}

    def client_fn(context):
        return Client(int(context.node_config["partition-id"])).to_client()

    stamps: list[float] = []

    def stamp(server_round, parameters, config):
        stamps.append(time.time())
        return None

    strategy = FedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=clients,
        min_available_clients=clients,
        evaluate_fn=stamp,
        initial_parameters=ndarrays_to_parameters(
            [v.numpy() for v in new_model().state_dict().values()]
        ),
    )
    start_simulation(
        client_fn=client_fn,
        num_clients=clients,
        config=ServerConfig(num_rounds=rounds),
        strategy=strategy,
        client_resources={"num_cpus": 1, "num_gpus": 0.0},
        ray_init_args=RAY,
    )
    return flower_result(stamps, rounds, bf16)


def run_flower(clients: int, images: int, rounds: int, bf16: bool) -> dict:
    """``run_simulation``: a ClientApp / ServerApp pair, Flower's FedAvg on the message API."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        peer = this_module()  # imports torch, which to_torch_state_dict needs loaded
        weights = msg.content["arrays"].to_torch_state_dict()
        pid, config = int(context.node_config["partition-id"]), msg.content["config"]
        out, n, loss = peer.train_client(
            weights, pid, float(config["lr"]), images, clients, bool(config["bf16"])
        )
        reply = {
            "arrays": ArrayRecord(out),
            "metrics": MetricRecord({"loss": loss, "num-examples": n}),
        }
        return Message(RecordDict(reply), reply_to=msg)

    stamps: list[float] = []
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=clients)

        def stamp(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            stamps.append(time.time())
            return MetricRecord({})

        strategy.start(
            grid,
            ArrayRecord(new_model().state_dict()),
            num_rounds=rounds,
            train_config=ConfigRecord({"lr": method().federation.lr, "bf16": bf16}),
            evaluate_fn=stamp,
        )

    run_simulation(
        server,
        client,
        num_supernodes=clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": RAY},
    )
    return flower_result(stamps, rounds, bf16)


def flower_result(stamps: list[float], rounds: int, bf16: bool) -> dict:
    """The rounds' ends (and the start of the first): the sampler reads the CPU at each."""
    if len(stamps) != rounds + 1:
        raise RuntimeError(f"Flower ran {len(stamps) - 1} of {rounds} rounds (see its log above)")
    return {"stamps": stamps, "precision": "bf16" if bf16 else "fp32"}


SIDES = {"ours": None, "start_simulation": run_flower_legacy, "run_simulation": run_flower}


# ----------------------------------------------------------------------------- the parent
class TreeSampler(threading.Thread):
    """Peak PSS (MB) and CPU seconds of a process and everything below it."""

    def __init__(self, pid: int, every: float = 0.2):
        super().__init__(daemon=True)
        self.root, self.every = psutil.Process(pid), every
        self.peak_mb, self.cpu = 0.0, {}
        self.series: list[tuple[float, float]] = []  # (time, the tree's CPU seconds so far)
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
        self.series.append((time.time(), sum(self.cpu.values())))

    def cpu_at(self, t: float) -> float:
        """The tree's CPU seconds at time ``t``, between the samples around it."""
        times, cpus = zip(*self.series)
        return float(np.interp(t, times, cpus))

    def run(self) -> None:
        while not self.done.wait(self.every):
            self.sample()


def pin(cpus: set[int]) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def measured_cpu() -> int | None:
    """The CPU the runs are pinned to: the last this process may use when it starts (it then
    moves itself to the others, so asking again later would name one of those)."""
    return max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def measure(side: str, clients: int, args) -> dict:
    """One run in a process tree of its own, pinned to ``args.cpu`` (None: not pinned); this
    process (the sampler) stays on the others."""
    cmd = [sys.executable, __file__, "--side", side, "--clients", str(clients)]
    cmd += ["--images", str(args.images), "--rounds", str(args.rounds)]
    cmd += ["--precision", args.precision, "--compile", args.compile]
    cmd += ["--peer-precision", args.peer_precision]
    measured = set() if args.cpu is None else {args.cpu}
    path = os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "FEDSSL_THREADS": "1"}
    with tempfile.TemporaryFile("w+") as out:
        own = time.process_time()
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=(lambda: pin(measured)) if measured else None,
        )
        sampler = TreeSampler(proc.pid, every=0.5)
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
    round_cpu = np.diff([sampler.cpu_at(t) for t in result["stamps"]])
    later = round_cpu[1:] if len(round_cpu) > 1 else round_cpu
    return {
        **result,
        "cpu_round": float(statistics.median(later)),
        "peak_mb": sampler.peak_mb,
        "cpu_s": sum(sampler.cpu.values()),
        "wall_s": wall,
        "sampler_cpu_s": time.process_time() - own,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=3, help="runs of each side, in turns")
    ap.add_argument("--precision", default="auto", help="our side's precision policy")
    ap.add_argument(
        "--peer-precision", default="fp32", choices=["fp32", "bf16"], help="Flower's client's"
    )
    ap.add_argument(
        "--compile", default="off", choices=["off", "on", "auto"], help="our side's compile setting"
    )
    ap.add_argument("--sides", nargs="+", choices=list(SIDES), default=list(SIDES))
    ap.add_argument("--side", choices=list(SIDES), help=argparse.SUPPRESS)  # the child
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.side:
        (n,) = args.clients
        if args.side == "ours":
            result = run_ours(n, args.images, args.rounds, args.precision, args.compile)
        else:
            result = SIDES[args.side](n, args.images, args.rounds, args.peer_precision == "bf16")
        result["cpus"] = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        print(json.dumps(result))
        return
    measured = args.cpu = measured_cpu()
    if measured is not None and len(os.sched_getaffinity(0)) > 1:
        pin(os.sched_getaffinity(0) - {measured})
    print(
        f"FedSimCLR ({PRESET}), {args.images} images, {args.rounds} rounds, one thread, the "
        f"measured tree on CPU {measured}; CPU s/round: median after the first; peak = the "
        f"tree's PSS; {cpu_summary()}; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    print("| clients | side | precision | CPU s/round | CPU s run | peak MB | wall s | sampler s |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.clients:
        runs = {side: [] for side in args.sides}
        for _ in range(args.pairs):
            for side in args.sides:
                r = measure(side, n, args)
                runs[side].append(r)
                print(
                    f"| {n} | {side} | {r['precision']} | {r['cpu_round']:.2f} | "
                    f"{r['cpu_s']:.0f} | {r['peak_mb']:.0f} | {r['wall_s']:.0f} | "
                    f"{r['sampler_cpu_s']:.1f} |",
                    flush=True,
                )
        med = {
            side: {k: statistics.median(r[k] for r in rs) for k in ("cpu_round", "peak_mb")}
            for side, rs in runs.items()
        }
        for side in [s for s in args.sides if s != "ours" and "ours" in med]:
            print(
                f"{n} clients, {side} / ours (medians of {args.pairs}): CPU a round "
                f"{med[side]['cpu_round'] / med['ours']['cpu_round']:.2f}x "
                f"({med[side]['cpu_round']:.1f} / {med['ours']['cpu_round']:.1f} s), peak memory "
                f"{med[side]['peak_mb']:.0f} / {med['ours']['peak_mb']:.0f} MB; load average "
                f"{os.getloadavg()[0]:.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
