"""Clients per second of one split-learning step (MocoSFL / MonAcoSFL): the conventional
one-client-at-a-time loop against ours, side by side in one process on the same clients,
images, model and cut; the same work (every client's online forward, EMA update and momentum
forward, one server MoCo step on the concatenated batch, every client's backward from its
returned activation gradients and SGD step).

Conventional: each client its own ``nn.Module`` pair (online, momentum; deep copies) and its own
``torch.optim.SGD``; per step a Python loop over the clients for their forwards, the server
step, then a loop for the clients' backward passes and optimizer steps. Ours:
:class:`fedssl.methods.mocosfl.trainer.SplitMocoTrainer` with the clients' weights stacked and run
as one ``torch.func.vmap`` call (``vmap``), and the same trainer with its per-client loop
(``loop``, what ``parallel_clients: off`` runs).

    python benchmarks/split_step.py [--device cuda] [--steps 10]

prints one line per scenario:
    <scenario>: conventional <N> clients/s, ours (vmap) <M> clients/s, ratio <R>; ours (loop) ...
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fedssl.data.augment import to_float
from fedssl.fl.cohort import LocalData
from fedssl.losses import moco_queue_loss
from fedssl.methods.mocosfl import MocoSflParams
from fedssl.methods.mocosfl.nets import build_nets
from fedssl.methods.mocosfl.train import recipe
from fedssl.methods.mocosfl.trainer import RoundTensors, ServerTensors, SplitRound, StepBatch
from fedssl.models.momentum import FeatureQueue
from fedssl.rounds.recipe import build_federation


def params(clients_batch: int, cut: int, width: int) -> MocoSflParams:
    return MocoSflParams.model_validate(
        dict(
            name="mocosfl",
            variant="monacosfl",
            cut=cut,
            backbone=dict(arch="resnet18", width=width, proj_hidden=256, proj_dim=128),
            moco=dict(queue_size=1024, symmetric=False),
            federation=dict(
                rounds=1,
                batch_size=clients_batch,
                sync_every=10**6,
                sync_at_round_end=False,
                momentum=0.9,
                weight_decay=5e-4,
            ),
        )
    )


def views(images: torch.Tensor, generator):
    x = to_float(images)  # fixed views: the benchmark times the step, not the augmentation
    return x, x.flip(-1)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- conventional
class Conventional:
    """Per-client module copies and optimizers, clients one after another."""

    def __init__(self, nets, n: int, p, device):
        self.clients = [copy.deepcopy(nets.client) for _ in range(n)]
        self.momentum = [copy.deepcopy(nets.client) for _ in range(n)]
        for m in self.momentum:
            m.requires_grad_(False)
        t = p.federation
        self.opts = [
            torch.optim.SGD(
                c.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay
            )
            for c in self.clients
        ]
        self.top = copy.deepcopy(nets.top)
        self.top_m = copy.deepcopy(nets.top).requires_grad_(False)
        self.top_opt = torch.optim.SGD(
            self.top.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay
        )
        self.queue = FeatureQueue(p.moco.queue_size, p.backbone.proj_dim, 0, device)
        self.m, self.tau = p.moco.momentum, p.moco.temperature

    @torch.no_grad()
    def ema(self, target, online):
        for t, o in zip(target.parameters(), online.parameters()):
            t.lerp_(o, 1 - self.m)

    def step(self, x1: list[torch.Tensor], x2: list[torch.Tensor]):
        hq, hk = [], []
        for i, (a, b) in enumerate(zip(x1, x2)):
            hq.append(self.clients[i](a))
            self.ema(self.momentum[i], self.clients[i])
            with torch.no_grad():
                hk.append(self.momentum[i](b))
        sent = [h.detach().requires_grad_(True) for h in hq]
        self.ema(self.top_m, self.top)
        q = self.top(torch.cat(sent))
        with torch.no_grad():
            k = self.top_m(torch.cat(hk))
        loss = moco_queue_loss(q, k, self.queue.keys, self.tau)
        self.top_opt.zero_grad()
        loss.backward()
        self.top_opt.step()
        self.queue.push(k)
        for i, h in enumerate(hq):
            self.opts[i].zero_grad()
            h.backward(sent[i].grad)
            self.opts[i].step()


# ----------------------------------------------------------------------------- ours
def ours(nets, p, data, parallel: bool):
    tmp = tempfile.mkdtemp()
    p = p.model_copy(update={"parallel_clients": "on" if parallel else "off"})
    fed = build_federation(recipe(p), nets, data, Path(tmp) / "ck.pt", "bench")
    fed.trainer.make_views = views
    state = fed.start(None)
    n = len(data.clients)
    from fedssl.fl.cohort import stack

    init = state.server["client_init"]
    online, momentum = stack([init] * n), stack([init] * n)
    opt = {
        "step": torch.zeros(n, device=data.device),
        "m": {k: torch.zeros_like(v) for k, v in online.items()},
    }
    server = ServerTensors.start(state.server, data.device)
    clients = list(range(n))
    run = SplitRound(state, data, RoundTensors(clients, online, momentum, opt, server), None)
    idx = np.stack([c for c in data.clients])
    batch = StepBatch(clients, clients, idx, np.ones_like(idx, dtype=bool), 0.06)

    def step():
        fed.trainer.step(run, batch)

    return step


def timed(steps_by_name: dict, steps: int, device) -> dict[str, float]:
    """Seconds per step of each contender: one warm-up step each (allocations, kernel
    selection, vmap tracing), then ``steps`` timed steps taken in turns (one of each, again
    and again), so load from elsewhere hits all alike; the minimum over the turns is kept."""
    for step in steps_by_name.values():
        step()
    best = {name: float("inf") for name in steps_by_name}
    for _ in range(steps):
        for name, step in steps_by_name.items():
            sync(device)
            start = time.perf_counter()
            step()
            sync(device)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def scenario(name, n, batch, cut, width, steps, device):
    p = params(batch, cut, width)
    shape = (1, 28, 28)
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n * batch, *shape), dtype=torch.uint8, generator=g)
    data = LocalData(
        images.to(device),
        torch.zeros(n * batch, dtype=torch.int64, device=device),
        [np.arange(i * batch, (i + 1) * batch) for i in range(n)],
    )
    x = to_float(data.images)
    x1 = list(x.split(batch))
    x2 = [v.flip(-1) for v in x1]
    conv = Conventional(build_nets(p, shape, device), n, p, device)
    t = timed(
        {
            "conv": lambda: conv.step(x1, x2),
            "vmap": ours(build_nets(p, shape, device), p, data, True),
            "loop": ours(build_nets(p, shape, device), p, data, False),
        },
        steps,
        device,
    )
    t_conv, t_vmap, t_loop = t["conv"], t["vmap"], t["loop"]
    print(
        f"{name}: conventional {n / t_conv:.0f} clients/s, ours (vmap) {n / t_vmap:.0f} "
        f"clients/s, ratio {t_conv / t_vmap:.2f}; ours (loop) {n / t_loop:.0f} clients/s, "
        f"ratio {t_conv / t_loop:.2f}",
        flush=True,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="timed turns (default 3 on CPU, 20 on CUDA); the fastest is kept",
    )
    ap.add_argument(
        "--width", type=int, default=None, help="ResNet-18 width (default 8 on CPU, 64 on CUDA)"
    )
    # One thread by default, as step_limits.py: with torch 2.14.1 on this AVX-512 CPU the loop
    # path at 20 clients x B_c=5, cut 4 corrupts the heap inside oneDNN's AVX-512 convolution
    # kernels at 2 threads (not at 1, nor with ONEDNN_MAX_CPU_ISA=AVX2); see README, Speed.
    ap.add_argument("--threads", type=int, default=1, help="torch threads on CPU (default 1)")
    args = ap.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if not cuda:
        torch.set_num_threads(args.threads)
    steps = args.steps or (20 if cuda else 3)
    width = args.width or (64 if cuda else 8)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(
        f"device {device} ({name}), {torch.get_num_threads()} threads, GN+WS ResNet-18 width "
        f"{width}, 28x28 images, server batch 100, best of {steps} timed steps each",
        flush=True,
    )
    for n, batch in ((5, 20), (20, 5), (100, 1)):
        for cut in (1, 4, 7):
            scenario(
                f"{n} clients x B_c={batch}, cut {cut} (L{2 * cut - 1})",
                n,
                batch,
                cut,
                width,
                steps,
                device,
            )


if __name__ == "__main__":
    main()
