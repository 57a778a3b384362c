"""Federated rounds: the loop that drives a :class:`~fedssl.strategies.base.Strategy`.

Each round the :class:`Federation` asks its strategy which clients take part, lets its trainer
run the round, then asks the strategy to aggregate and to take a server step. The trainer is
:class:`LocalTraining` (clients train locally, then upload; optionally in :class:`Phase` s, e.g.
FedRep's head epochs, then body epochs, each with its own loss and trainable subset) or any
object with the same
``train_round`` method, e.g. a split-learning trainer where clients and the server step together
on every batch. :class:`~fedssl.fl.state.FedState` holds everything that persists (server
tensors, per-client state, the byte ledger, the log); the checkpoint is that state, saved after
every round as plain tensors and numbers (loaded with ``weights_only=True``), so a killed run
resumes exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedssl.fl.cohort import CohortTrainer, LocalData, Tensors
from fedssl.fl.state import FederationConfig, FedState, Ledger, RoundUpdates
from fedssl.stage.runtime import check_finite, load_checkpoint, torch_generator, torch_save
from fedssl.strategies.aggregation import RunningMean
from fedssl.strategies.base import Strategy

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

# (federation, state, round index) -> the round log's columns (:attr:`Federation.monitor`)
RoundMonitor = Callable[["Federation", FedState, int], dict]
# what builds a run's monitor: (stage context, model, the clients' device) -> one, or None
MonitorOf = Callable[["StepContext", nn.Module, torch.device], RoundMonitor | None]


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
    ):
        self.strategy, self.trainer, self.data, self.cfg = strategy, trainer, data, cfg
        self.ckpt_path, self.fingerprint = Path(ckpt_path), fingerprint
        if strategy.data is not None and strategy.data is not data:
            raise ValueError("the strategy was built on other client data than the federation's")
        # A hook that only logs: (federation, state, round index) -> columns for the round's
        # row (the k-NN monitor, fedssl.eval.monitor); it must not draw from the training's
        # random streams. None: nothing is logged beyond the strategy's own metrics.
        self.monitor: RoundMonitor | None = None

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
