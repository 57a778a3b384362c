"""The split trainer of MocoSFL / MonAcoSFL, behind the engine's trainer interface.

One round (:meth:`SplitMocoTrainer.train_round`) = one pass over the sampled clients' data in
steps of ``B_c`` images per client (:mod:`~fedssl.methods.mocosfl.schedule`). A step
(:meth:`SplitMocoTrainer.step`, handed the round's :class:`SplitRound` and its
:class:`StepBatch`): the clients upload their cut-layer activations (online model on x', momentum
model on x''), the server takes its MoCo v2 step on them and sends each client the gradient of its
activations, the clients step their SGD. All clients of a step go through as one batched
operation: their weights are stacked along a leading client axis and run with
``torch.func.vmap`` (GN + WS has no running statistics), or one after another with
``parallel=False`` (same numbers). The strategy (:class:`~fedssl.methods.mocosfl.sync.SflSync`)
syncs the clients when the schedule says so.

``state.memo`` holds the global step, each client's step count and the per-step log (loss;
misalignment as Eq. 2 has it, absolute and after the step's sync, and as the authors' code logs
it, squared and before the sync). Every random draw comes from (seed, round): client batches,
augmentations; the queue starts from a seeded generator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.func import functional_call, vmap

from fedssl.fl.cohort import (
    LocalData,
    OptimizerConfig,
    StackedOptimizer,
    forward,
    gather,
    scatter,
    stack,
)
from fedssl.fl.state import FedState, RoundUpdates
from fedssl.losses import moco_queue_loss
from fedssl.methods.mocosfl.comm import ACT_KEY, ACT_QUERY, GRADIENTS
from fedssl.methods.mocosfl.nets import SplitNets, Tensors
from fedssl.methods.mocosfl.schedule import (
    SflSchedule,
    client_rates,
    padded_batch,
    round_schedules,
    tick,
)
from fedssl.methods.mocosfl.sync import SflSync
from fedssl.models.momentum import FeatureQueue, ema_update, misalignment
from fedssl.precision import under_policy
from fedssl.rounds.loop import Federation
from fedssl.stage.runtime import torch_generator

Views = Callable[[torch.Tensor, torch.Generator | None], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class SflConfig:
    """The split trainer's settings: MoCo v2 on the server (``temperature``; the EMA
    ``momentum`` of every momentum model; the ``symmetric`` loss), SGD on both sides, and the
    round's timing."""

    temperature: float
    momentum: float
    symmetric: bool
    sgd: OptimizerConfig
    schedule: SflSchedule


@dataclass
class ServerTensors:
    """The server's side of a round: its top model (stacked [1, ...] for the stacked
    optimizer), the top's momentum copy, the optimizer state and the queue of negatives."""

    top: Tensors
    momentum: Tensors
    opt: dict
    queue: FeatureQueue

    @classmethod
    def start(cls, server: dict, device) -> ServerTensors:
        """Copies of the server's kept state (``FedState.server``) to train in a round."""
        top = {k: v.unsqueeze(0).clone() for k, v in server["server"].items()}
        momentum = {k: v.clone() for k, v in server["server_momentum"].items()}
        opt = {
            "step": torch.zeros(1, device=device),
            "m": {k: v.unsqueeze(0).clone() for k, v in server["server_opt"].items()},
        }
        keys = server["queue"]["keys"]
        queue = FeatureQueue(keys.shape[0], keys.shape[1], 0, device)
        queue.load_state_dict({"keys": keys, "ptr": int(server["queue"]["ptr"])})
        return cls(top, momentum, opt, queue)

    def keep(self, server: dict) -> None:
        """The round's end: the server keeps what it trained."""
        server["server"] = {k: v[0].clone() for k, v in self.top.items()}
        server["server_momentum"] = self.momentum
        server["server_opt"] = {k: v[0].clone() for k, v in self.opt["m"].items()}
        server["queue"] = {
            "keys": self.queue.keys.clone(),
            "ptr": torch.tensor(self.queue.ptr, dtype=torch.int64),
        }


@dataclass
class RoundTensors:
    """What a round trains: its clients' online and momentum models and optimizer state,
    stacked [a, ...] (row i: client ``clients[i]``), and the server's side."""

    clients: list[int]
    online: Tensors
    momentum: Tensors
    opt: dict
    server: ServerTensors

    @classmethod
    def start(cls, state: FedState, clients: list[int], starts: list[dict], device):
        """The round's tensors from its ``clients``' starts and the server's state (copies)."""
        online = stack([s["online"] for s in starts])
        momentum = stack([s["momentum"] for s in starts])
        opt = {
            "step": torch.zeros(len(starts), device=device),
            "m": stack([s["opt"] for s in starts]),
        }
        return cls(clients, online, momentum, opt, ServerTensors.start(state.server, device))

    def keep(self, state: FedState, strategy: SflSync) -> None:
        """The round's end: each client keeps its models and optimizer state, the server its."""
        for i, c in enumerate(self.clients):
            strategy.keep_client(
                state,
                c,
                {k: v[i].clone() for k, v in self.online.items()},
                {k: v[i].clone() for k, v in self.momentum.items()},
                {k: v[i].clone() for k, v in self.opt["m"].items()},
            )
        self.server.keep(state.server)


@dataclass
class SplitRound:
    """What the steps of a round share: the federation's state (its ledger counts what is
    exchanged), the clients' data, the tensors trained in place, the views' generator."""

    state: FedState
    data: LocalData
    tensors: RoundTensors
    gen: torch.Generator | None


@dataclass(frozen=True)
class StepBatch:
    """One step's inputs: the ``clients`` (federation ids) stepping, their ``rows`` in the
    round's stacked tensors, their image indices ``idx`` [a, B_c] and which are real
    (``valid``, short batches are padded), the server's rate ``lr`` and the clients' (one rate,
    or one per row; None = ``lr``)."""

    clients: list[int]
    rows: list[int]
    idx: np.ndarray
    valid: np.ndarray
    lr: float
    client_lr: float | torch.Tensor | None = None


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

    def __init__(self, nets: SplitNets, cfg: SflConfig, make_views: Views, parallel: bool = True):
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
        self, fed: Federation, state: FedState, chosen: list[int], round_: int, lr: float
    ) -> RoundUpdates:
        data, sched = fed.data, self.cfg.schedule
        device = data.device
        starts = [fed.strategy.client_start(state, c) for c in chosen]
        tensors = RoundTensors.start(state, chosen, starts, device)
        sizes = torch.tensor(
            [len(data.clients[c]) for c in chosen], dtype=torch.float64, device=device
        )
        schedules = round_schedules([data.clients[c] for c in chosen], sched, round_, chosen)
        run = SplitRound(
            state, data, tensors, torch_generator(device, sched.seed, "sfl-augment", round_)
        )
        n_steps = max(len(s) for s in schedules)
        loss_sum = torch.zeros(len(chosen), dtype=torch.float64)
        steps_taken = torch.zeros(len(chosen), dtype=torch.float64)
        state.memo.setdefault("steps", [])
        images = 0
        for s in range(n_steps):
            batch = self._batch(run, schedules, s, lr)
            loss = self.step(run, batch)
            images += int(batch.valid.sum())
            counters = state.memo.setdefault("images", [0] * len(data.clients))
            for c, b in zip(batch.clients, batch.valid.sum(1).tolist()):
                counters[c] += int(b)
            loss_sum[batch.rows] += loss
            steps_taken[batch.rows] += 1
            self._sync_and_log(fed.strategy, run, sizes, round_, loss, s + 1 == n_steps)
        tensors.keep(state, fed.strategy)
        losses = (loss_sum / steps_taken.clamp(min=1)).float()
        return RoundUpdates(chosen, [{} for _ in chosen], sizes, [0] * len(chosen), losses, images)

    def _batch(self, run: SplitRound, schedules, s: int, lr: float) -> StepBatch:
        """Step ``s`` of the round's ``schedules``, of the clients that still have a batch, at
        the server's rate ``lr`` and the clients' (which counts their steps)."""
        sched = self.cfg.schedule
        rows = [i for i, batches in enumerate(schedules) if s < len(batches)]
        clients = [run.tensors.clients[i] for i in rows]
        idx, valid = padded_batch([schedules[i][s] for i in rows], sched.batch_size)
        n_clients = len(run.data.clients)
        client_lr = client_rates(sched, run.state.memo, clients, n_clients, lr, run.data.device)
        return StepBatch(clients, rows, idx, valid, lr, client_lr)

    def _sync_and_log(self, strategy: SflSync, run: SplitRound, sizes, round_, loss, end):
        """Count the step; sync the round's client models when due (every ``sync_every`` steps,
        and at the round's end where configured); log the step when it syncs and every
        ``log_every`` steps, its models' misalignment before and after the sync."""
        step, due, logged = tick(self.cfg.schedule, run.state.memo, end)
        online, momentum = run.tensors.online, run.tensors.momentum
        entry = pre_sync_entry(step, round_, loss, due, online, momentum) if logged else None
        if due:
            strategy.sync(run.state, run.tensors.clients, online, momentum, sizes)
        if entry is not None:
            entry["misalignment"] = float(misalignment([online], [momentum]))
            entry["misalignment_sq"] = float(misalignment([online], [momentum], squared=True))
            run.state.memo["steps"].append(entry)

    # ------------------------------------------------------------------ a step
    def step(self, run: SplitRound, batch: StepBatch) -> float:
        """One split-learning step of ``batch``'s clients (rows of the round's stacked
        tensors): uploads, the server's MoCo step (rate ``batch.lr``), the gradients down, the
        clients' SGD (``batch.client_lr``). Returns the server's loss."""
        ledger, t = run.state.ledger, run.tensors
        subset = len(batch.rows) < next(iter(t.online.values())).shape[0]
        sel = torch.tensor(batch.rows, device=run.data.device)
        on, mom, op = ((gather(x, sel) if subset else x) for x in (t.online, t.momentum, t.opt))
        x1, x2, valid_t = self._views(batch, run)
        counts = valid_t.sum(1).tolist()
        params = {k: v.detach().requires_grad_(True) for k, v in on.items()}
        h_q, h_k = self._client_forwards(params, on, mom, x1, x2)
        for j, c in enumerate(batch.clients):  # what each client uploads (its real rows)
            ledger.sent(c, {"h": h_q[j, : counts[j]]}, ACT_QUERY)
            ledger.sent(c, {"h": h_k[j, : counts[j]]}, ACT_KEY)

        loss, g_act = self._server_step(h_q, h_k, valid_t, t.server, batch.lr)
        for j, c in enumerate(batch.clients):
            ledger.received(c, {"g": g_act[j, : counts[j]]}, GRADIENTS)

        # clients: backward of the returned activation gradients, SGD
        client_grads = torch.autograd.grad(h_q, list(params.values()), g_act)
        client_lr = batch.lr if batch.client_lr is None else batch.client_lr
        self.optimizer.step(on, dict(zip(params, client_grads)), op, client_lr)
        if subset:
            scatter(t.online, sel, on)
            scatter(t.momentum, sel, mom)
            scatter(t.opt, sel, op)
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

    def _views(self, batch: StepBatch, run: SplitRound):
        """The step's two views, client-stacked [a, R, C, H, W]: x' for the online client
        models, x'' for the momentum ones; and which of their rows are real [a, R]."""
        a, width = batch.idx.shape
        device = run.data.device
        flat = torch.from_numpy(batch.idx).to(device).flatten()
        v1, v2 = self.make_views(run.data.images[flat], run.gen)
        v1, v2 = (v.view(a, width, *v.shape[1:]) for v in (v1, v2))
        return v1, v2, torch.from_numpy(batch.valid).to(device)

    def _server_step(self, h_q, h_k, valid_t, server: ServerTensors, lr: float):
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
        sp = {k: v[0].detach().requires_grad_(True) for k, v in server.top.items()}
        ema_update(server.momentum, {k: v[0] for k, v in server.top.items()}, cfg.momentum)
        q, k = under_policy(hq, self._server_forward, sp, server.momentum, queried, keyed)
        rows = hq.shape[0]
        loss = sum(
            moco_queue_loss(
                q[i : i + rows], k[i : i + rows], server.queue.keys, cfg.temperature, rows_valid
            )
            for i in range(0, q.shape[0], rows)
        )
        grads = torch.autograd.grad(loss, [*sp.values(), hq])
        self.optimizer.step(
            server.top, {n: g.unsqueeze(0) for n, g in zip(sp, grads[:-1])}, server.opt, lr
        )
        server.queue.push(k, rows_valid.repeat(q.shape[0] // rows))
        return loss, grads[-1].view_as(h_q)
