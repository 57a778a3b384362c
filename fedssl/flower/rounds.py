"""A round of the engine split between a server and its clients, with no Flower in it.

:class:`RemoteRounds` is a trainer for :class:`fedssl.rounds.loop.Federation` (the same
``train_round`` as :class:`~fedssl.rounds.loop.LocalTraining`): the server runs the strategy's
``download`` and ``group``, hands each client what it received through an ``exchange``
function, and counts both directions on the ledger from the tensors that really crossed.
Aggregation, the server step, the log and the checkpoint stay the engine's.

:meth:`Client.round` is what a client runs with what it received: the method's own
``LocalTraining`` (its phases, seeds, ``local_start``, ``upload``, ``keep``) over the round's
cohort, in which only this client trains. The engine draws every client's augmentations from
one stream per round, one client after another; a client here replays the draws of the
others (their batch sizes only, never their images), so it sees exactly the augmentations it
sees in the engine. This holds against the engine training one client at a time (the CPU's
``parallel_clients: auto`` and any BatchNorm model); a vectorised cohort draws its clients'
batches together, which one device alone cannot reproduce.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import torch

from fedssl.fl.cohort import CohortTrainer, LocalData, Tensors, client_batches
from fedssl.fl.state import FedState, Ledger, RoundUpdates
from fedssl.rounds.loop import Federation, LocalTraining, record
from fedssl.strategies.base import Strategy


@dataclass
class Task:
    """What the server sends a client for one round."""

    client: int
    cohort: list[int]  # the round's clients, in the engine's order
    round: int
    lr: float
    received: Tensors


@dataclass
class Result:
    """What a client sends back: its upload, its mean local loss, the samples it processed, and
    a copy of what it keeps (``Strategy.keep``) for the server's records: the engine's state
    holds every client's kept tensors (personalised evaluation, the saved per-client models,
    the checkpoint), so the server mirrors them. The copy is bookkeeping, not training
    traffic: it is off the ledger, as in the engine."""

    upload: Tensors
    loss: float
    images: int
    kept: Tensors | None = None


@dataclass
class ClientMemory:
    """What a client carries from round to round on its own device: its kept tensors
    (``Strategy.keep``) and its records in the strategy's memo (a divergence, a scaler)."""

    kept: Tensors | None = None
    memo: dict = field(default_factory=dict)


class RemoteRounds:
    """The server's side of a round whose clients train elsewhere; ``exchange(tasks)`` returns
    their :class:`Result` s in the same order."""

    def __init__(self, exchange):
        self.exchange = exchange

    def train_round(
        self, fed: Federation, state: FedState, chosen: list[int], round_: int, lr: float
    ) -> RoundUpdates:
        s, ledger = fed.strategy, state.ledger
        tasks, groups = [], []
        for c in chosen:
            received = s.download(state, c)
            record(ledger.received, c, received, s.traffic)
            tasks.append(Task(c, list(chosen), round_, lr, received))
            groups.append(s.group(state, c))
        results = self.exchange(tasks)
        device = fed.data.device
        for c, r in zip(chosen, results):
            record(ledger.sent, c, r.upload, s.traffic)
            if r.kept is not None:
                state.clients[c] = {k: v.to(device) for k, v in r.kept.items()}
        sizes = torch.tensor([len(fed.data.clients[c]) for c in chosen], dtype=torch.float64)
        return RoundUpdates(
            list(chosen),
            [{k: v.to(device) for k, v in r.upload.items()} for r in results],
            sizes.to(device),
            groups,
            torch.tensor([r.loss for r in results], dtype=torch.float32, device=device),
            sum(r.images for r in results),
        )


class Client:
    """One client's side of a federation: the method's ``model`` and ``fed`` built on the
    client's device from the same params and partition. Of the server's state it knows what it
    is told each round and the initial state (the same seeded model), which is what the
    strategy's client hooks read of parts the server never changes (a personal layer's
    initial weights)."""

    def __init__(self, model, fed: Federation):
        self.fed = fed
        self.server = fed.strategy.init_server(model)

    def round(self, task: Task, memory: ClientMemory) -> tuple[Result, ClientMemory]:
        """This client's part of the round: the method's local training as the engine runs
        it, for this client alone. Returns its result and what it keeps for later rounds."""
        fed, me = self.fed, task.client
        state = FedState(
            task.round,
            self.server,
            {} if memory.kept is None else {me: memory.kept},
            Ledger.empty(fed.data.sizes()),
            memo=memory.memo,
        )
        strategy = OnlyMe(fed.strategy, me)
        strategy.received = {k: v.to(fed.data.device) for k, v in task.received.items()}
        alone = SimpleNamespace(strategy=strategy, data=fed.data, cfg=fed.cfg)
        trainer = solo(fed.trainer, me)
        updates = trainer.train_round(alone, state, task.cohort, task.round, task.lr)
        mine = task.cohort.index(me)
        kept = state.clients.get(me)
        epochs = sum(p.cohort.local_epochs for p in trainer.phases_of(state))
        result = Result(
            cpu(updates.uploads[mine]),
            float(updates.losses[mine]),
            epochs * len(fed.data.clients[me]),
            None if kept is None else cpu(kept),
        )
        return result, ClientMemory(kept, state.memo)


def cpu(tensors: Tensors) -> Tensors:
    return {k: v.detach().cpu() for k, v in tensors.items()}


class OnlyMe(Strategy):
    """The method's strategy as one client of the cohort sees it: its own hooks run for itself;
    the other clients start from its start (their rows are never trained) and send nothing."""

    def __init__(self, inner: Strategy, me: int):
        self.inner, self.me = inner, me
        self.received: Tensors = {}
        self._start: Tensors | None = None

    def needs_uploads(self) -> bool:
        return True  # the client's own upload goes back to the server as it is

    def download(self, state, client):
        return self.received

    def local_start(self, state, client, received):
        if self._start is None:
            self._start = self.inner.local_start(state, self.me, received)
        return self._start

    def group(self, state, client):
        return 0  # the server's decision; the trainer does not read it

    def trainable(self, state):
        return self.inner.trainable(state)

    def upload(self, state, client, trained):
        return self.inner.upload(state, client, trained) if client == self.me else {}

    def traffic(self, tensors):
        return self.inner.traffic(tensors)

    def keep(self, state, client, trained):
        return self.inner.keep(state, client, trained) if client == self.me else None


def solo(trainer: LocalTraining, me: int) -> LocalTraining:
    """``trainer`` with every phase's cohort replaced by :class:`SoloCohort` for ``me``."""
    if not isinstance(trainer, LocalTraining):
        raise TypeError(
            f"a client trains alone only with the engine's LocalTraining, not "
            f"{type(trainer).__name__} (split learning steps with the server every batch)"
        )

    def alone(phases):
        return [replace(p, cohort=SoloCohort(p.cohort, me)) for p in phases]

    if trainer.schedule is not None:
        return LocalTraining(phases=lambda state: alone(trainer.schedule(state)))
    return LocalTraining(phases=alone(trainer.phases))


class SoloCohort:
    """A cohort trainer in which only client ``me`` trains; every other client of the cohort
    only advances the augmentation stream as far as its batches would (same shapes, zeros)."""

    def __init__(self, cohort: CohortTrainer, me: int):
        self.cohort, self.me = cohort, me

    @property
    def local_epochs(self) -> int:
        return self.cohort.local_epochs

    def train(
        self,
        starts: list[Tensors],
        data: LocalData,
        client_ids: list[int],
        lr: float,
        seed_parts: tuple,
        generator: torch.Generator,
        trainable: set[str] | None = None,
    ) -> tuple[Tensors, torch.Tensor]:
        mine = None
        for c, start in zip(client_ids, starts):
            if c == self.me:
                mine = self.cohort.train([start], data, [c], lr, seed_parts, generator, trainable)
            else:
                self.skip_draws(data, c, seed_parts, generator)
        trained, loss = mine
        n = len(client_ids)
        return {k: v.expand(n, *v.shape[1:]) for k, v in trained.items()}, loss.expand(n)

    def skip_draws(self, data: LocalData, client: int, seed_parts: tuple, generator) -> None:
        """Draw what client ``client``'s local epochs would draw, and throw it away."""
        c = self.cohort
        shape = data.images.shape[1:]
        for b in client_batches(
            data.clients[client], c.batch_size, c.local_epochs, *seed_parts, client
        ):
            c.make_views(data.images.new_zeros((len(b), *shape)), generator)
