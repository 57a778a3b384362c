"""Federated rounds as a loop with hooks, in the spirit of Flower's Strategy.

Each round the :class:`Federation` asks its :class:`Strategy` which clients take part, lets its
trainer run the round, then asks the strategy to aggregate and to take a server step:

* ``sample``        which clients train this round;
* ``download``      what the server sends each client (a global model, a whole model pool,
                    the blocks a layer-wise client needs): bytes are counted from these tensors;
* ``local_start``   the client's starting state, from what it received and the state it keeps
                    across rounds (a personal head); may choose a model of a pool (``group``);
* ``trainable``     which parameters train this round (layer-wise training, frozen encoders);
* ``upload``        what a client sends back (a subset, plus extras such as class centres);
* ``traffic``       what kind each sent tensor is, for the ledger (encoder blocks, heads, ...);
* ``keep``          what a client keeps for later rounds (``FedState.clients``);
* ``aggregate``     the server's new state from the uploads, grouped by cluster;
* ``server_step``   work with server-side data after aggregation (calibration, pretraining).

The defaults are FedAvg of the whole model, weighted by client data size. The trainer is
:class:`LocalTraining` (clients train locally, then upload; optionally in :class:`Phase` s, e.g.
FedRep's head epochs, then body epochs, each with its own loss and trainable subset) or any
object with the same
``train_round`` method, e.g. a split-learning trainer where clients and the server step together
on every batch. :class:`FedState` holds everything that persists (server tensors, per-client
state, the byte ledger, the log); the checkpoint is that state, saved after every round as plain
tensors and numbers (loaded with ``weights_only=True``), so a killed run resumes exactly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedssl.fl.cohort import CohortTrainer, LocalData, LossFn, Tensors
from fedssl.runtime import (
    check_finite,
    load_checkpoint,
    numpy_rng,
    torch_generator,
    torch_save,
    write_tsv,
)
from fedssl.strategies.aggregation import RunningMean, fedavg, stacked  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from fedssl.params import FederationSettings

LOG_FIELDS = ["round", "clients", "loss", "lr", "bytes_up", "bytes_down"]
TIMING_FIELDS = ("seconds", "images_per_s")  # in the log's rows, kept out of the committed TSV


@dataclass
class FederationConfig:
    rounds: int
    client_fraction: float
    lr: float
    lr_schedule: str = "constant"  # constant | cosine (over rounds)
    seed: int = 0
    monitor_every: int = 0  # rounds between k-NN monitor evaluations (0: off)


def federation_config(
    settings: FederationSettings, seed: int, lr_schedule: str = "constant"
) -> FederationConfig:
    """The engine's configuration from a method's federation settings (any block that
    inherits :class:`fedssl.params.FederationSettings`)."""
    return FederationConfig(
        rounds=settings.rounds,
        client_fraction=settings.client_fraction,
        lr=settings.lr,
        lr_schedule=lr_schedule,
        seed=seed,
        monitor_every=settings.monitor_every,
    )


def nbytes(tensors: Tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


@dataclass
class Ledger:
    """What each client actually sent and received, by kind, from the exchanged tensors."""

    up: list[dict[str, int]]
    down: list[dict[str, int]]
    rounds: list[int]
    samples: list[int]

    @classmethod
    def empty(cls, sizes: list[int]) -> Ledger:
        n = len(sizes)
        return cls([{} for _ in range(n)], [{} for _ in range(n)], [0] * n, list(sizes))

    def sent(self, client: int, tensors: Tensors, kind: str = "model") -> int:
        """Client -> server; returns the bytes."""
        return self._add(self.up[client], kind, nbytes(tensors))

    def received(self, client: int, tensors: Tensors, kind: str = "model") -> int:
        """Server -> client; returns the bytes."""
        return self._add(self.down[client], kind, nbytes(tensors))

    @staticmethod
    def _add(counter: dict, kind: str, size: int) -> int:
        counter[kind] = counter.get(kind, 0) + size
        return size

    def summary(self) -> dict:
        rows = [
            {
                "client": i,
                "bytes_up": sum(u.values()),
                "bytes_down": sum(d.values()),
                "up_by_kind": u,
                "down_by_kind": d,
                "rounds": r,
                "samples": s,
            }
            for i, (u, d, r, s) in enumerate(zip(self.up, self.down, self.rounds, self.samples))
        ]
        return {
            "per_client": rows,
            "total_bytes_up": sum(r["bytes_up"] for r in rows),
            "total_bytes_down": sum(r["bytes_down"] for r in rows),
        }


@dataclass
class FedState:
    """Everything a federation carries from round to round (and its checkpoint holds)."""

    round: int
    server: dict[str, Tensors]  # "global" = the model's params and buffers; pools, momentum...
    clients: dict[int, Tensors]  # what each client keeps across rounds (personal heads, ...)
    ledger: Ledger
    log: list[dict] = field(default_factory=list)
    memo: dict = field(default_factory=dict)  # numbers and strings: assignments, traces, ...

    def to_checkpoint(self) -> dict:
        return {
            "round": self.round,
            "server": self.server,
            "clients": self.clients,
            "ledger": vars(self.ledger),
            "log": self.log,
            "memo": self.memo,
        }

    @classmethod
    def from_checkpoint(cls, ck: dict) -> FedState:
        return cls(
            ck["round"], ck["server"], ck["clients"], Ledger(**ck["ledger"]), ck["log"], ck["memo"]
        )


@dataclass
class RoundUpdates:
    """What the clients of a round sent back, for the strategy's ``aggregate``."""

    clients: list[int]
    uploads: list[Tensors]
    weights: torch.Tensor  # data sizes, float64 [n]
    groups: list[int]  # the cluster / pool model each client trained
    losses: torch.Tensor  # mean local loss per client [n]
    images: int  # samples processed (for the throughput log)
    mean: Tensors | None = None  # FedAvg of the uploads, summed as they came (uploads empty)


def sample_clients(num_clients: int, fraction: float, seed: int, round_: int) -> list[int]:
    k = max(1, round(fraction * num_clients))
    return sorted(numpy_rng(seed, "sample", round_).choice(num_clients, k, replace=False).tolist())


def cosine_lr(lr: float, round_: int, rounds: int) -> float:
    return lr * 0.5 * (1 + math.cos(math.pi * round_ / max(1, rounds)))


def model_state(model: nn.Module) -> Tensors:
    """A model's parameters and buffers as plain (detached, copied) tensors."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class Strategy:
    """The hooks of a federation. The defaults: all or a seeded fraction of the clients, the
    global model down and the whole trained model up, data-size weighted FedAvg."""

    def __init__(self, cfg: FederationConfig):
        self.cfg = cfg
        self.fed: Federation | None = None  # set by the Federation it drives

    def init_server(self, model: nn.Module) -> dict[str, Tensors]:
        return {"global": model_state(model)}

    def local_objective(self, loss: LossFn, model: nn.Module) -> LossFn:
        """The clients' objective around the method's ``loss`` on ``model`` (FedProx adds its
        proximal term); a method builds its cohort trainer with it. Default: ``loss``."""
        return loss

    def sample(self, state: FedState, round_: int) -> list[int]:
        return sample_clients(
            len(self.fed.data.clients), self.cfg.client_fraction, self.cfg.seed, round_
        )

    def lr(self, round_: int) -> float:
        if self.cfg.lr_schedule == "cosine":
            return cosine_lr(self.cfg.lr, round_, self.cfg.rounds)
        return self.cfg.lr

    def download(self, state: FedState, client: int) -> Tensors:
        return state.server["global"]

    def local_start(self, state: FedState, client: int, received: Tensors) -> Tensors:
        return {**received, **state.clients.get(client, {})}

    def group(self, state: FedState, client: int) -> int:
        return 0

    def trainable(self, state: FedState) -> set[str] | None:
        return None  # every parameter

    def upload(self, state: FedState, client: int, trained: Tensors) -> Tensors:
        return trained

    def traffic(self, tensors: Tensors) -> dict[str, Tensors]:
        """What a download or upload holds, by kind: the ledger counts each kind apart (e.g.
        encoder blocks and heads). Default: one kind, ``model``."""
        return {"model": tensors}

    def keep(self, state: FedState, client: int, trained: Tensors) -> Tensors | None:
        return None  # nothing persists on the client

    def needs_uploads(self) -> bool:
        """Whether ``aggregate`` reads each client's upload. If not (FedAvg: only their
        data-size weighted mean), the trainer sums the uploads as the clients finish
        (``RoundUpdates.mean``) and a round holds one model's worth of sums, not one model per
        client. Any strategy that overrides ``aggregate`` (in a subclass, or on the instance)
        gets every upload (the stacked path), unless it says otherwise here."""
        return getattr(self.aggregate, "__func__", None) is not Strategy.aggregate

    def aggregate(self, state: FedState, updates: RoundUpdates) -> None:
        state.server["global"] = self.mean(updates)

    @staticmethod
    def mean(updates: RoundUpdates) -> Tensors:
        """The uploads' data-size weighted mean (FedAvg): as the round summed them when it
        streamed (a strategy whose ``needs_uploads`` is False), else from every upload."""
        if updates.mean is not None:
            return updates.mean
        return fedavg(stacked(updates.uploads), updates.weights)

    def server_step(self, state: FedState, round_: int) -> None:
        pass

    def evaluate(self, state: FedState, round_: int) -> dict | None:
        """Metrics of the round just finished for the round log (e.g. the clients' mean
        personalised accuracy); per-client records go into ``state.memo``."""
        return None

    def final_model(self, state: FedState) -> Tensors:
        """The state to load into the model at the end (for methods with one global model)."""
        return state.server["global"]


@dataclass
class Phase:
    """One stage of a client's local schedule: a cohort trainer (its loss, epochs, optimizer)
    and which parameters it trains, ``trainable(state)`` (None: the strategy's ``trainable``).
    A phase of 0 epochs is skipped. ``seed_tag`` names its batch draws after (seed, "local",
    round) (None: its position, nothing for the first phase, then 1, 2, ...). With a
    ``loss_weight`` on its phases the round's loss is their weighted mean (e.g. by epochs),
    otherwise the last phase's."""

    cohort: CohortTrainer
    trainable: Callable[[FedState], set[str] | None] | None = None
    seed_tag: tuple | None = None
    loss_weight: int | None = None


class LocalTraining:
    """The usual round: each sampled client downloads, trains locally (a cohort, vectorised
    where the model allows), and uploads what the strategy says. With ``phases`` the local
    schedule is several passes, each from where the previous one ended (FedRep, MpFedcon: the
    personal head first, then the shared body). ``phases`` may also be a function of the
    federation's state that picks the round's schedule (CP-CFL: one pass while the strategy
    restricts training, else encoder epochs then head epochs)."""

    def __init__(
        self,
        cohort: CohortTrainer | None = None,
        phases: list[Phase] | Callable[[FedState], list[Phase]] | None = None,
    ):
        if (cohort is None) == (phases is None):
            raise ValueError("give either one cohort or a list of phases")
        self.schedule = phases if callable(phases) else None
        if phases is None:
            phases = [Phase(cohort)]
        self.phases = [] if self.schedule else phases  # a fixed schedule
        self.cohort = self.phases[0].cohort if self.phases else None

    def phases_of(self, state: FedState) -> list[Phase]:
        """This round's phases that train (a phase of 0 epochs is skipped)."""
        phases = self.schedule(state) if self.schedule else self.phases
        return [p for p in phases if p.cohort.local_epochs > 0]

    @property
    def local_epochs(self) -> int:
        """The epochs of a fixed schedule's round."""
        return sum(ph.cohort.local_epochs for ph in self.phases)

    def train_round(
        self, fed: Federation, state: FedState, chosen: list[int], round_: int, lr: float
    ) -> RoundUpdates:
        s = fed.strategy
        starts, groups = client_starts(s, state, chosen)
        sizes = torch.tensor([len(fed.data.clients[c]) for c in chosen], dtype=torch.float64)
        sizes = sizes.to(fed.data.device)
        running = None if s.needs_uploads() else RunningMean(sizes)
        returns = ClientReturns(s, state, chosen, running)
        gen = torch_generator(fed.data.device, fed.cfg.seed, "augment", round_)
        phases = self.phases_of(state)
        trained, losses, streamed = self._train_phases(
            phases, fed, state, chosen, starts, lr, round_, gen, returns
        )
        epochs = sum(p.cohort.local_epochs for p in phases)
        if not streamed:
            if trained is None:  # no phase trains: the clients send back what they started from
                trained = {k: torch.stack([st[k] for st in starts]) for k in starts[0]}
            for i in range(len(chosen)):
                returns(i, {k: v[i] for k, v in trained.items()})
        return RoundUpdates(
            chosen,
            returns.uploads,
            sizes,
            groups,
            losses,
            epochs * int(sizes.sum()),
            running.result() if running is not None else None,
        )

    def _train_phases(self, phases, fed, state, chosen, starts, lr, round_, gen, returns):
        """Train the round's phases one after another, each from where the last left the
        clients: their models stacked, their losses (weighted over the phases where the phases
        say so), and whether the last phase handed each client to ``returns`` as it finished."""
        s = fed.strategy
        trained, losses = None, torch.zeros(len(chosen), device=fed.data.device)
        weighted, streamed = 0.0, False
        for i, phase in enumerate(phases):
            if trained is not None:
                starts = [{k: v[j] for k, v in trained.items()} for j in range(len(chosen))]
            # phase 0 keeps the single-cohort seeds, later phases draw their own batches
            tag = phase.seed_tag if phase.seed_tag is not None else ((i,) if i else ())
            names = phase.trainable(state) if phase.trainable else s.trainable(state)
            # the last phase hands each client over as it finishes when only the mean is read
            streamed = returns.running is not None and i == len(phases) - 1
            trained, losses = phase.cohort.train(
                starts,
                fed.data,
                chosen,
                lr,
                (fed.cfg.seed, "local", round_, *tag),
                gen,
                names,
                **({"finished": returns} if streamed else {}),
            )
            if phase.loss_weight is not None:
                weighted = weighted + losses * phase.loss_weight
        if phases and phases[-1].loss_weight is not None:
            losses = weighted / sum(p.loss_weight for p in phases)
        return trained, losses, streamed


def client_starts(s: Strategy, state: FedState, chosen: list[int]) -> tuple[list, list]:
    """What each chosen client downloads (counted on the ledger) and starts its round from,
    and the group it belongs to."""
    starts, groups = [], []
    for c in chosen:
        received = s.download(state, c)
        record(state.ledger.received, c, received, s.traffic)
        starts.append(s.local_start(state, c, received))
        groups.append(s.group(state, c))
    return starts, groups


class ClientReturns:
    """The round's clients as they finish, in client order: each one's upload (counted on the
    ledger) goes to the uploads or, where only their mean is read, into the ``running`` mean;
    what it keeps stays on the client."""

    def __init__(self, s: Strategy, state: FedState, chosen: list[int], running):
        self.s, self.state, self.chosen, self.running = s, state, chosen, running
        self.uploads: list[Tensors] = []

    def __call__(self, i: int, row: Tensors) -> None:
        """Client ``chosen[i]`` is done: its upload, what it keeps."""
        s, state, c = self.s, self.state, self.chosen[i]
        upload = s.upload(state, c, row)
        record(state.ledger.sent, c, upload, s.traffic)
        kept = s.keep(state, c, row)
        if kept is not None:
            state.clients[c] = {k: v.clone() for k, v in kept.items()}
        if self.running is None:
            self.uploads.append(upload)
        else:
            self.running.add(upload)


def record(count, client: int, tensors: Tensors, traffic) -> None:
    """Count ``tensors`` on the ledger (``count`` = its ``sent`` or ``received``) per kind, as
    the strategy's ``traffic`` splits them; an empty exchange still counts as a transfer."""
    for kind, part in (traffic(tensors) if tensors else {"model": {}}).items():
        count(client, part, kind)


class Federation:
    """Drives rounds of a trainer over fixed client data; resumable from ``ckpt_path`` (a
    checkpoint of another configuration, i.e. another ``fingerprint``, is ignored)."""

    def __init__(
        self,
        strategy: Strategy,
        trainer,
        data: LocalData,
        cfg: FederationConfig,
        ckpt_path: Path,
        fingerprint: str,
        server_data: LocalData | None = None,
    ):
        self.strategy, self.trainer, self.data, self.cfg = strategy, trainer, data, cfg
        self.server_data = server_data
        self.ckpt_path, self.fingerprint = Path(ckpt_path), fingerprint
        strategy.fed = self
        # A hook that only logs: (federation, state, round index) -> columns for the round's
        # row (the k-NN monitor, fedssl.fl.monitor); it must not draw from the training's
        # random streams. None: nothing is logged beyond the strategy's own metrics.
        self.monitor: Callable[[Federation, FedState, int], dict] | None = None

    def start(self, model: nn.Module) -> FedState:
        """The last checkpoint of this very configuration, or round 0 from ``model``."""
        ck = load_checkpoint(self.ckpt_path, self.fingerprint, self.data.device)
        if ck is not None:
            return FedState.from_checkpoint(ck["state"])
        return FedState(0, self.strategy.init_server(model), {}, Ledger.empty(self.data.sizes()))

    def run(self, state: FedState, on_round=None) -> FedState:
        while state.round < self.cfg.rounds:
            self.run_round(state)
            check_finite(
                state.log[-1]["loss"],
                f"round {state.round}",
                f"the checkpoint of round {state.round - 1} is kept",
            )
            torch_save(
                {"fingerprint": self.fingerprint, "state": state.to_checkpoint()}, self.ckpt_path
            )
            if on_round:
                on_round(state)
        return state

    def run_round(self, state: FedState) -> None:
        r, s = state.round, self.strategy
        chosen = s.sample(state, r)
        lr = s.lr(r)
        t0 = time.perf_counter()
        bytes_before = _ledger_totals(state.ledger)
        updates = self.trainer.train_round(self, state, chosen, r, lr)
        s.aggregate(state, updates)
        s.server_step(state, r)
        if self.data.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        extra = s.evaluate(state, r) or {}
        if self.monitor is not None:  # outside the round's timing
            extra.update(self.monitor(self, state, r))
        for c in chosen:
            state.ledger.rounds[c] += 1
        up, down = (a - b for a, b in zip(_ledger_totals(state.ledger), bytes_before))
        w = updates.weights
        state.log.append(
            {
                "round": r + 1,
                "clients": len(chosen),
                "loss": float((updates.losses.double() * w).sum() / w.sum()),
                "lr": lr,
                "bytes_up": up,
                "bytes_down": down,
                "seconds": round(seconds, 3),
                "images_per_s": round(updates.images / seconds, 1),
                **extra,
            }
        )
        state.round = r + 1


def _ledger_totals(ledger: Ledger) -> tuple[int, int]:
    return (sum(sum(u.values()) for u in ledger.up), sum(sum(d.values()) for d in ledger.down))


def write_round_log(rows: list[dict], path: Path) -> None:
    """The per-round TSV (committed, plotted): the engine's columns, then any a strategy added;
    timings stay in the stage's run record, so an identical rerun writes an identical file."""
    extra = [k for row in rows for k in row if k not in LOG_FIELDS and k not in TIMING_FIELDS]
    fields = LOG_FIELDS + list(dict.fromkeys(extra))
    write_tsv([{k: r.get(k, "") for k in fields} for r in rows], path, fields)


def client_data(
    images: torch.Tensor, labels: np.ndarray | torch.Tensor, clients: list[np.ndarray]
) -> LocalData:
    """The training split on its device with the clients' index arrays."""
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.int64).to(images.device)
    return LocalData(images, labels, clients)
