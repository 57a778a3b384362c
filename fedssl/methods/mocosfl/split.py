"""Split federated MoCo v2 behind the engine's trainer interface (MocoSFL / MonAcoSFL).

* :class:`SplitNets`: the backbone cut into the client part and the server's top (remaining
  units, pooling, projector); the modules are templates, weights live in dicts of tensors.
* :class:`SflSync` (the strategy): the server's state at round 0, each client's starting state
  (its kept online / momentum / SGD state, or the latest synced models it has missed), the
  synchronisation (data-size-weighted FedAvg of the participating clients' online models, and
  for MonAcoSFL of their momentum models, broadcast to every client) and the k-NN monitor.
* :class:`SplitMocoTrainer`: one round = one pass over the sampled clients' data in steps of
  ``B_c`` images per client. All clients of a step go through as one batched operation: their
  weights are stacked along a leading client axis and run with ``torch.func.vmap`` (GN + WS has
  no running statistics), or one after another with ``parallel=False`` (same numbers).

Where things live (all in :class:`~fedssl.fl.state.FedState`, so the checkpoint is exact):
``state.server``: ``server`` / ``server_momentum`` / ``server_opt`` (top + projector, its EMA,
its SGD momentum), ``queue`` (keys and write pointer), ``sync`` (the latest synced client
models and how many syncs happened), ``client_init`` (the common initial client model);
``state.clients[c]``: client c's online and momentum models, SGD momentum and the sync it last
saw; ``state.memo``: the global step, each client's step count and the per-step log (loss;
misalignment as Eq. 2 has it, absolute and after the step's sync, and as the authors' code logs
it, squared and before the sync). Every random draw comes from (seed, round): client
batches, augmentations; the queue starts from a seeded generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from fedssl.fl.cohort import (
    OptimizerConfig,
    StackedOptimizer,
    client_batches,
    forward,
    gather,
    scatter,
    stack,
)
from fedssl.fl.state import FedState, RoundUpdates
from fedssl.losses import moco_queue_loss
from fedssl.models.heads import ProjectionHead
from fedssl.models.momentum import FeatureQueue, ema_update, misalignment
from fedssl.models.split import ServerPart, SplitMobileNetV2, SplittableNet, split_resnet18
from fedssl.precision import under_policy
from fedssl.stage.runtime import derive_seed, torch_generator
from fedssl.strategies.aggregation import fedavg
from fedssl.strategies.base import Strategy

Tensors = dict[str, torch.Tensor]

# Ledger kinds (bytes per client and direction, from the tensors exchanged)
ACT_QUERY, ACT_KEY, GRADIENTS = "activations_query", "activations_key", "gradients"
SYNC_ONLINE, SYNC_MOMENTUM = "sync_online", "sync_momentum"


# ============================================================================ networks
class ServerTop(nn.Module):
    """The server's side: the remaining units + pooling (``backbone``), then the projector."""

    def __init__(self, backbone: ServerPart, proj_hidden: int, proj_dim: int):
        super().__init__()
        self.backbone = backbone
        self.projector = ProjectionHead(backbone.out_dim, proj_hidden, proj_dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.projector(self.backbone(h))


def build_backbone(b, in_channels: int) -> SplittableNet:
    """The GN + WS network of params ``b`` (:class:`SflBackbone`)."""
    if b.arch == "resnet18":
        return split_resnet18(
            b.width or 64,
            in_channels=in_channels,
            channels_per_group=b.channels_per_group,
            stem=b.stem,
        )
    return SplitMobileNetV2(
        b.width_mult or 1.0,
        in_channels=in_channels,
        channels_per_group=b.channels_per_group,
        stem=b.stem,
    )


@dataclass
class SplitNets:
    """Template modules for functional calls, and the seeded initial weights."""

    net: SplittableNet
    client: nn.Sequential
    top: ServerTop
    cut: int

    def client_state(self) -> Tensors:
        return {k: v.detach().clone() for k, v in self.client.named_parameters()}

    def top_state(self) -> Tensors:
        return {k: v.detach().clone() for k, v in self.top.named_parameters()}

    def activation_shape(self, image_shape) -> tuple[int, int, int]:
        return self.net.cut_activation_shape(self.cut, image_shape)

    def client_numel(self) -> int:
        return sum(p.numel() for p in self.client.parameters())

    @torch.no_grad()
    def features(
        self, client: Tensors, server: Tensors, x: torch.Tensor, projection: bool = False
    ) -> torch.Tensor:
        """Pooled backbone features (or projections) of float images ``x``."""
        h = functional_call(self.client, client, (x,))
        if projection:
            return functional_call(self.top, server, (h,))
        backbone = {
            k[len("backbone.") :]: v for k, v in server.items() if k.startswith("backbone.")
        }
        return functional_call(self.top.backbone, backbone, (h,))


def build_nets(p, image_shape, device) -> SplitNets:
    """The seeded initial network of MocoSFL params ``p``, cut at ``p.cut``."""
    torch.manual_seed(derive_seed(p.seed, "init", "mocosfl"))
    net = build_backbone(p.backbone, image_shape[0])
    client, server = net.split(p.cut)
    top = ServerTop(server, p.backbone.proj_hidden, p.backbone.proj_dim)
    for module in (client, top):
        module.to(device)
        if any(True for _ in module.buffers()):
            raise ValueError("split learning here needs models without buffers (GN + WS)")
    return SplitNets(net, client, top, p.cut)


class SplitEncoder(nn.Module):
    """The deployed model for the probes: client part + server backbone (+ projector)."""

    def __init__(self, nets: SplitNets, client: Tensors, server: Tensors, projection: bool = False):
        super().__init__()
        nets.client.load_state_dict(client)
        nets.top.load_state_dict(server)
        self.client, self.top, self.projection = nets.client, nets.top, projection

    def forward(self, x):
        h = self.top.backbone(self.client(x))
        return self.top.projector(h) if self.projection else h


# ============================================================================ strategy
def prefixed(tensors: Tensors, prefix: str) -> Tensors:
    return {f"{prefix}.{k}": v for k, v in tensors.items()}


def unprefixed(tensors: Tensors, prefix: str) -> Tensors:
    n = len(prefix) + 1
    return {k[n:]: v for k, v in tensors.items() if k.startswith(prefix + ".")}


def _count(state: FedState, what: str, client: int) -> None:
    """Per-client event counters in the memo (for the analytic communication check)."""
    counts = state.memo.setdefault(what, [0] * len(state.ledger.samples))
    counts[client] += 1


class SflSync(Strategy):
    """Client starts, synchronisation and the k-NN monitor of MocoSFL (``align=False``) and
    MonAcoSFL (``align=True``: the clients' momentum models are averaged too)."""

    def __init__(self, cfg, nets: SplitNets, align: bool, queue_size: int, seed: int, monitor=None):
        super().__init__(cfg)
        self.nets, self.align, self.queue_size, self.seed = nets, align, queue_size, seed
        self.monitor = monitor

    def init_server(self, model=None) -> dict:
        client, top = self.nets.client_state(), self.nets.top_state()
        queue = FeatureQueue(
            self.queue_size,
            self.nets.top.projector.out_dim,
            derive_seed(self.seed, "queue"),
            next(iter(top.values())).device,
        )
        sync = {**prefixed(client, "online"), "count": torch.zeros((), dtype=torch.int64)}
        if self.align:
            sync.update(prefixed(client, "momentum"))
        return {
            "client_init": client,
            "server": top,
            "server_momentum": {k: v.clone() for k, v in top.items()},
            "server_opt": {k: torch.zeros_like(v) for k, v in top.items()},
            "queue": {"keys": queue.keys, "ptr": torch.zeros((), dtype=torch.int64)},
            "sync": sync,
        }

    def client_start(self, state: FedState, client: int) -> dict[str, Tensors]:
        """Client ``client``'s online, momentum and SGD state at the start of its round. A sync
        reaches every client: one that missed syncs downloads the latest synced model(s) now
        (counted once, however many it missed); a client that never trained starts from the
        common initialisation (and, for MocoSFL, a momentum model that is that initialisation)."""
        sync, kept = state.server["sync"], state.clients.get(client)
        count = int(sync["count"])
        init = state.server["client_init"]
        if kept is not None:
            online, momentum = unprefixed(kept, "online"), unprefixed(kept, "momentum")
            opt = unprefixed(kept, "opt")
            missed = int(kept["sync_id"]) < count
        else:
            online, momentum = init, init
            opt = {k: torch.zeros_like(v) for k, v in init.items()}
            missed = count > 0
        if missed:
            _count(state, "catch_ups", client)
            online = unprefixed(sync, "online")
            state.ledger.received(client, online, SYNC_ONLINE)
            if self.align:
                momentum = unprefixed(sync, "momentum")
                state.ledger.received(client, momentum, SYNC_MOMENTUM)
        return {"online": online, "momentum": momentum, "opt": opt}

    def keep(
        self, state: FedState, client: int, online: Tensors, momentum: Tensors, opt: Tensors
    ) -> None:
        state.clients[client] = {
            **prefixed(online, "online"),
            **prefixed(momentum, "momentum"),
            **prefixed(opt, "opt"),
            "sync_id": state.server["sync"]["count"].clone(),
        }

    @torch.no_grad()
    def sync(
        self,
        state: FedState,
        clients: list[int],
        online: Tensors,
        momentum: Tensors,
        weights: torch.Tensor,
    ) -> None:
        """Data-size-weighted FedAvg of the participating clients' (client-stacked) online
        models, written back into every row; MonAcoSFL does the same with the momentum models.
        Each participant uploads its model(s) and downloads the average(s)."""
        ledger = state.ledger
        mean = fedavg(online, weights)
        for i, c in enumerate(clients):
            _count(state, "syncs", c)
            ledger.sent(c, {k: v[i] for k, v in online.items()}, SYNC_ONLINE)
            ledger.received(c, mean, SYNC_ONLINE)
        for k, v in online.items():
            v.copy_(mean[k].expand_as(v))
        sync = state.server["sync"]
        sync.update(prefixed({k: v.clone() for k, v in mean.items()}, "online"))
        if self.align:
            mean_m = fedavg(momentum, weights)
            for i, c in enumerate(clients):
                ledger.sent(c, {k: v[i] for k, v in momentum.items()}, SYNC_MOMENTUM)
                ledger.received(c, mean_m, SYNC_MOMENTUM)
            for k, v in momentum.items():
                v.copy_(mean_m[k].expand_as(v))
            sync.update(prefixed({k: v.clone() for k, v in mean_m.items()}, "momentum"))
        sync["count"] += 1

    def aggregate(self, state, updates) -> None:
        pass  # the trainer synchronises during the round

    def evaluate(self, state: FedState, round_: int) -> dict | None:
        out = {}
        steps = state.memo.get("steps") or []
        if steps:
            out["misalignment"] = steps[-1]["misalignment"]
        if self.monitor is not None and self.monitor.due(round_, self.cfg.rounds):
            out["knn_monitor"] = self.monitor(
                self.nets, unprefixed(state.server["sync"], "online"), state.server["server"]
            )
        return out

    def final_model(self, state: FedState) -> dict:
        return {
            "client": unprefixed(state.server["sync"], "online"),
            "server": state.server["server"],
        }


# ============================================================================ k-NN monitor
class KnnMonitor:
    """Weighted k-NN accuracy of the current model (latest synced client part + server
    backbone) on fixed query images, against a fixed labelled bank; logged, never selected on."""

    def __init__(
        self,
        bank: torch.Tensor,
        bank_labels: np.ndarray,
        queries: torch.Tensor,
        query_labels: np.ndarray,
        k: int,
        temperature: float,
        every: int,
        batch_size: int = 512,
    ):
        self.bank, self.bank_labels = bank, np.asarray(bank_labels)
        self.queries, self.query_labels = queries, np.asarray(query_labels)
        self.k, self.temperature, self.every, self.batch_size = k, temperature, every, batch_size

    def due(self, round_: int, rounds: int) -> bool:
        return self.every > 0 and ((round_ + 1) % self.every == 0 or round_ + 1 == rounds)

    def _features(self, nets, client, server, images) -> np.ndarray:
        from fedssl.data.augment import to_float

        out = [
            nets.features(client, server, to_float(images[i : i + self.batch_size]))
            for i in range(0, len(images), self.batch_size)
        ]
        return torch.cat(out).float().cpu().numpy()

    def __call__(self, nets: SplitNets, client: Tensors, server: Tensors) -> float:
        from fedssl.eval.probes import knn_accuracy
        from fedssl.params import KnnParams

        bank = self._features(nets, client, server, self.bank)
        queries = self._features(nets, client, server, self.queries)
        acc = knn_accuracy(
            bank,
            self.bank_labels,
            queries,
            self.query_labels,
            KnnParams(k=self.k, temperature=self.temperature),
            self.bank.device,
        )
        return round(acc["knn_top1"], 2)


# ============================================================================ trainer
@dataclass(frozen=True)
class ClientCosine:
    """[code] Each client's own learning rate: ``lr (1 + cos(pi s / period)) / 2`` at its step s
    (counted over all its rounds), PyTorch's CosineAnnealingLR stepped after every client step,
    which keeps oscillating past ``period``."""

    lr: float
    period: int

    def rates(self, steps: list[int], device) -> torch.Tensor:
        """One rate per client row, for clients that have taken ``steps`` steps so far."""
        return torch.tensor(
            [self.lr * (1 + math.cos(math.pi * s / self.period)) / 2 for s in steps],
            dtype=torch.float32,
            device=device,
        )


@dataclass(frozen=True)
class SflConfig:
    batch_size: int
    temperature: float
    momentum: float
    symmetric: bool
    sync_every: int
    sync_at_round_end: bool
    sgd: OptimizerConfig
    seed: int
    log_every: int = 1
    client_cosine: ClientCosine | None = None  # None: the clients step the round's rate
    equal_steps: bool = False  # every client takes the mean client's steps (round_steps equal)


def sync_due(since: int, sync_every: int, at_round_end: bool, round_end: bool) -> bool:
    """Whether the cohort syncs after a step, ``since`` steps after the last sync (counted
    across rounds): every ``sync_every`` steps, and at a round's last step where configured."""
    return since >= sync_every or (at_round_end and round_end)


def round_schedules(
    clients: list[np.ndarray], cfg: SflConfig, round_: int, ids: list[int]
) -> list[list[np.ndarray]]:
    """Each sampled client's batches of a round: one pass over its images, or with
    ``equal_steps`` the mean client's step count, passes over its images cut to that length
    (a client's first pass is the same either way)."""
    b = cfg.batch_size
    mean_steps = max(1, math.ceil(sum(len(i) for i in clients) / len(clients) / b))

    def schedule(idx: np.ndarray, client: int) -> list[np.ndarray]:
        if not cfg.equal_steps:
            return client_batches(idx, b, 1, cfg.seed, "sfl", round_, client)
        passes = math.ceil(mean_steps / max(1, math.ceil(len(idx) / b)))  # a pass: ceil(n / B)
        return client_batches(idx, b, passes, cfg.seed, "sfl", round_, client)[:mean_steps]

    return [schedule(idx, c) for idx, c in zip(clients, ids)]


def padded_batch(batches: list[np.ndarray], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of indices [a, width] (short batches padded with their first index) and the
    valid mask."""
    idx = np.zeros((len(batches), width), dtype=np.int64)
    valid = np.zeros((len(batches), width), dtype=bool)
    for r, b in enumerate(batches):
        idx[r, : len(b)], idx[r, len(b) :], valid[r, : len(b)] = b, b[0], True
    return idx, valid


@dataclass
class RoundTensors:
    """What a round trains: its clients' online and momentum models and optimizer state,
    stacked [a, ...], and the server's top model, its momentum copy, optimizer state and queue."""

    online: Tensors
    momentum: Tensors
    opt: dict
    server: Tensors
    server_m: Tensors
    server_opt: dict
    queue: FeatureQueue

    @classmethod
    def start(cls, state: FedState, starts: list[dict], device) -> RoundTensors:
        """The round's tensors from its clients' starts and the server's state (copies)."""
        online = stack([s["online"] for s in starts])
        momentum = stack([s["momentum"] for s in starts])
        opt = {
            "step": torch.zeros(len(starts), device=device),
            "m": stack([s["opt"] for s in starts]),
        }
        server = {k: v.unsqueeze(0).clone() for k, v in state.server["server"].items()}
        server_m = {k: v.clone() for k, v in state.server["server_momentum"].items()}
        server_opt = {
            "step": torch.zeros(1, device=device),
            "m": {k: v.unsqueeze(0).clone() for k, v in state.server["server_opt"].items()},
        }
        keys = state.server["queue"]["keys"]
        queue = FeatureQueue(keys.shape[0], keys.shape[1], 0, device)
        queue.load_state_dict({"keys": keys, "ptr": int(state.server["queue"]["ptr"])})
        return cls(online, momentum, opt, server, server_m, server_opt, queue)

    def stepped(self) -> tuple:
        """The arguments :meth:`SplitMocoTrainer.step` trains, in its order."""
        return (
            self.online,
            self.momentum,
            self.opt,
            self.server,
            self.server_m,
            self.server_opt,
            self.queue,
        )

    def keep(self, state: FedState, strategy, chosen: list[int]) -> None:
        """The round's end: each client keeps its models and optimizer state, the server its."""
        for i, c in enumerate(chosen):
            strategy.keep(
                state,
                c,
                {k: v[i].clone() for k, v in self.online.items()},
                {k: v[i].clone() for k, v in self.momentum.items()},
                {k: v[i].clone() for k, v in self.opt["m"].items()},
            )
        state.server["server"] = {k: v[0].clone() for k, v in self.server.items()}
        state.server["server_momentum"] = self.server_m
        state.server["server_opt"] = {k: v[0].clone() for k, v in self.server_opt["m"].items()}
        state.server["queue"] = {
            "keys": self.queue.keys.clone(),
            "ptr": torch.tensor(self.queue.ptr, dtype=torch.int64),
        }


def pre_sync_entry(step: int, round_: int, loss: float, due: bool, online, momentum) -> dict:
    """A logged step's row before its sync (the authors' log: the squared misalignment of this
    round's clients; the plain one too when the step syncs)."""
    entry = {
        "step": step,
        "round": round_ + 1,
        "loss": round(loss, 5),
        "sync": int(due),
        "misalignment_pre_sync": "",
        "misalignment_sq_pre_sync": float(misalignment([online], [momentum], squared=True)),
    }
    if due:
        entry["misalignment_pre_sync"] = float(misalignment([online], [momentum]))
    return entry


class SplitMocoTrainer:
    """One round of split federated MoCo (see the module docstring); the engine's trainer."""

    local_epochs = 1

    def __init__(self, nets: SplitNets, cfg: SflConfig, make_views, parallel: bool = True):
        self.nets, self.cfg, self.make_views = nets, cfg, make_views
        self.parallel = parallel
        self.optimizer = StackedOptimizer(cfg.sgd)
        self._vclient = vmap(self._client_one)

    # ------------------------------------------------------------------ client forward
    def _client_one(self, params: Tensors, x: torch.Tensor) -> torch.Tensor:
        # activations travel in float32 whatever the compute precision (the ledger checks their
        # bytes against the protocol formula)
        return forward(self.nets.client, params, x).float()

    def client_forward(self, params: Tensors, x: torch.Tensor) -> torch.Tensor:
        """Client-stacked params [a, ...] on client-stacked images [a, R, C, H, W] ->
        activations [a, R, c, h, w]: one vmapped call, or one client after another."""
        if self.parallel and x.shape[0] > 1:
            return self._vclient(params, x)
        return torch.stack(
            [
                self._client_one({k: v[i] for k, v in params.items()}, x[i])
                for i in range(x.shape[0])
            ]
        )

    def _server_forward(self, online: Tensors, momentum: Tensors, hq, hk):
        """The server's queries (online weights) and keys (momentum weights, no gradient,
        fp32), in one precision region."""
        q = functional_call(self.nets.top, online, (hq,))
        with torch.no_grad():
            k = functional_call(self.nets.top, momentum, (hk,)).float()
        return q, k

    # ------------------------------------------------------------------ a round
    def train_round(
        self, fed, state: FedState, chosen: list[int], round_: int, lr: float
    ) -> RoundUpdates:
        cfg, data = self.cfg, fed.data
        device = data.device
        tensors = RoundTensors.start(
            state, [fed.strategy.client_start(state, c) for c in chosen], device
        )
        sizes = torch.tensor(
            [len(data.clients[c]) for c in chosen], dtype=torch.float64, device=device
        )
        schedules = round_schedules([data.clients[c] for c in chosen], cfg, round_, chosen)
        gen = torch_generator(device, cfg.seed, "sfl-augment", round_)
        n_steps = max(len(s) for s in schedules)
        loss_sum = torch.zeros(len(chosen), dtype=torch.float64)
        steps_taken = torch.zeros(len(chosen), dtype=torch.float64)
        log = state.memo.setdefault("steps", [])
        images = 0
        for s in range(n_steps):
            rows = [i for i, sched in enumerate(schedules) if s < len(sched)]
            idx, valid = padded_batch([schedules[i][s] for i in rows], cfg.batch_size)
            clients = [chosen[i] for i in rows]
            client_lr = self._client_rates(state, clients, len(data.clients), lr, device)
            loss = self.step(
                state, clients, rows, idx, valid, data, *tensors.stepped(), gen, lr, client_lr
            )
            images += int(valid.sum())
            counters = state.memo.setdefault("images", [0] * len(data.clients))
            for c, b in zip(clients, valid.sum(1).tolist()):
                counters[c] += int(b)
            loss_sum[rows] += loss
            steps_taken[rows] += 1
            round_end = s + 1 == n_steps
            self._sync_and_log(
                fed.strategy, state, chosen, tensors, sizes, log, round_, loss, round_end
            )
        tensors.keep(state, fed.strategy, chosen)
        losses = (loss_sum / steps_taken.clamp(min=1)).float()
        return RoundUpdates(chosen, [{} for _ in chosen], sizes, [0] * len(chosen), losses, images)

    def _client_rates(self, state, clients: list[int], n_clients: int, lr: float, device):
        """This step's client learning rate: ``lr``, or under the client cosine one per client
        by its own step count, which the step advances."""
        client_steps = state.memo.setdefault("client_steps", [0] * n_clients)
        client_lr = lr
        if self.cfg.client_cosine is not None:
            client_lr = self.cfg.client_cosine.rates([client_steps[c] for c in clients], device)
        for c in clients:
            client_steps[c] += 1
        return client_lr

    def _sync_and_log(self, strategy, state, chosen, tensors, sizes, log, round_, loss, round_end):
        """Count the step; sync the round's client models when due (every ``sync_every`` steps,
        and at the round's end where configured); log the step when it syncs and every
        ``log_every`` steps, its models' misalignment before and after the sync."""
        cfg = self.cfg
        step = state.memo.get("step", 0) + 1
        state.memo["step"] = step
        since = state.memo.get("steps_since_sync", 0) + 1
        due = sync_due(since, cfg.sync_every, cfg.sync_at_round_end, round_end)
        state.memo["steps_since_sync"] = 0 if due else since
        entry = None
        if due or step % cfg.log_every == 0:
            entry = pre_sync_entry(step, round_, loss, due, tensors.online, tensors.momentum)
        if due:
            strategy.sync(state, chosen, tensors.online, tensors.momentum, sizes)
        if entry is not None:
            entry["misalignment"] = float(misalignment([tensors.online], [tensors.momentum]))
            entry["misalignment_sq"] = float(
                misalignment([tensors.online], [tensors.momentum], squared=True)
            )
            log.append(entry)

    # ------------------------------------------------------------------ a step
    def step(
        self,
        state,
        clients: list[int],
        rows: list[int],
        idx: np.ndarray,
        valid: np.ndarray,
        data,
        online: Tensors,
        momentum: Tensors,
        opt: dict,
        server: Tensors,
        server_m: Tensors,
        server_opt: dict,
        queue: FeatureQueue,
        gen: torch.Generator,
        lr: float,
        client_lr: float | torch.Tensor | None = None,
    ) -> float:
        """One split-learning step of the clients ``rows`` (rows of the stacked states):
        uploads, the server's MoCo step (rate ``lr``), the gradients down, the clients' SGD
        (``client_lr``: one rate, or one per row; None = ``lr``). Returns the server's loss."""
        ledger, device = state.ledger, data.device
        subset = len(rows) < next(iter(online.values())).shape[0]
        sel = torch.tensor(rows, device=device)
        on, mom, op = ((gather(x, sel) if subset else x) for x in (online, momentum, opt))
        x1, x2, valid_t = self._views(idx, valid, data, gen)
        counts = valid_t.sum(1).tolist()
        params = {k: v.detach().requires_grad_(True) for k, v in on.items()}
        h_q, h_k = self._client_forwards(params, on, mom, x1, x2)
        for j, c in enumerate(clients):  # what each client uploads (its real rows)
            ledger.sent(c, {"h": h_q[j, : counts[j]]}, ACT_QUERY)
            ledger.sent(c, {"h": h_k[j, : counts[j]]}, ACT_KEY)

        loss, g_act = self._server_step(h_q, h_k, valid_t, server, server_m, server_opt, queue, lr)
        for j, c in enumerate(clients):
            ledger.received(c, {"g": g_act[j, : counts[j]]}, GRADIENTS)

        # clients: backward of the returned activation gradients, SGD
        client_grads = torch.autograd.grad(h_q, list(params.values()), g_act)
        self.optimizer.step(
            on, dict(zip(params, client_grads)), op, lr if client_lr is None else client_lr
        )
        if subset:
            scatter(online, sel, on)
            scatter(momentum, sel, mom)
            scatter(opt, sel, op)
        return float(loss.detach())

    def _client_forwards(self, params: Tensors, on: Tensors, mom: Tensors, x1, x2):
        """The clients' uploads: the queries of their online weights ``params`` (kept for the
        backward), and the keys of their momentum weights after this step's EMA."""
        cfg = self.cfg
        h_q = self.client_forward(params, x1)
        ema_update(mom, on, cfg.momentum)
        with torch.no_grad():
            h_k = self.client_forward(mom, x2)
        return h_q, h_k

    def _views(self, idx: np.ndarray, valid: np.ndarray, data, gen):
        """The step's two views, client-stacked [a, R, C, H, W]: x' for the online client
        models, x'' for the momentum ones; and which of their rows are real [a, R]."""
        a, width = idx.shape
        flat = torch.from_numpy(idx).to(data.device).flatten()
        v1, v2 = self.make_views(data.images[flat], gen)
        v1, v2 = (v.view(a, width, *v.shape[1:]) for v in (v1, v2))
        return v1, v2, torch.from_numpy(valid).to(data.device)

    def _server_step(self, h_q, h_k, valid_t, server, server_m, server_opt, queue, lr):
        """The server's MoCo v2 step on the concatenated uploads: its loss and the gradients
        of the online activations, which go back to the clients.

        One-way: the online activations query, the momentum ones key. Symmetric ([code] V2's
        ``compute``): also the reverse pair, the momentum activations queried by the server's
        online top and the online ones keyed by its momentum top; the loss is the sum of both
        directions, the server learns from both, the clients' gradient comes from the first only
        (their activations enter the second as keys, without gradient), and every key of the
        step enters the queue, those of the online activations first."""
        cfg = self.cfg
        rows_valid = valid_t.flatten()
        hq = h_q.detach().flatten(0, 1).requires_grad_(True)
        hk = h_k.flatten(0, 1)
        queried, keyed = (torch.cat([hk, hq]), torch.cat([hq, hk])) if cfg.symmetric else (hq, hk)
        sp = {k: v[0].detach().requires_grad_(True) for k, v in server.items()}
        ema_update(server_m, {k: v[0] for k, v in server.items()}, cfg.momentum)
        q, k = under_policy(hq, self._server_forward, sp, server_m, queried, keyed)
        rows = hq.shape[0]
        loss = sum(
            moco_queue_loss(
                q[i : i + rows], k[i : i + rows], queue.keys, cfg.temperature, rows_valid
            )
            for i in range(0, q.shape[0], rows)
        )
        grads = torch.autograd.grad(loss, [*sp.values(), hq])
        self.optimizer.step(
            server, {n: g.unsqueeze(0) for n, g in zip(sp, grads[:-1])}, server_opt, lr
        )
        queue.push(k, rows_valid.repeat(q.shape[0] // rows))
        return loss, grads[-1].view_as(h_q)
