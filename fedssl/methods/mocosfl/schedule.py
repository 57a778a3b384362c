"""When things happen in split federated MoCo: each sampled client's batches of a round (one
pass over its images, or the mean client's step count), when the cohort syncs and a step is
logged, and each client's learning rate. Every draw comes from (seed, round, client); the
counters live in the federation's memo, so a resumed run continues them exactly."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fedssl.fl.cohort import client_batches


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
class SflSchedule:
    """A split round's timing: ``batch_size`` (B_c) images per client and step, batches drawn
    from ``seed``; a sync every ``sync_every`` steps (and at a round's end where configured);
    a log row every ``log_every`` steps and at every sync."""

    batch_size: int
    seed: int
    sync_every: int
    sync_at_round_end: bool
    log_every: int = 1
    client_cosine: ClientCosine | None = None  # None: the clients step the round's rate
    equal_steps: bool = False  # every client takes the mean client's steps (round_steps equal)


def sync_due(since: int, sync_every: int, at_round_end: bool, round_end: bool) -> bool:
    """Whether the cohort syncs after a step, ``since`` steps after the last sync (counted
    across rounds): every ``sync_every`` steps, and at a round's last step where configured."""
    return since >= sync_every or (at_round_end and round_end)


def round_schedules(
    clients: list[np.ndarray], cfg: SflSchedule, round_: int, ids: list[int]
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


def client_rates(cfg: SflSchedule, memo: dict, clients: list[int], n_clients: int, lr, device):
    """A step's client learning rate: ``lr``, or under the client cosine one per client by its
    own step count; advances the ``clients``' step counts in ``memo``."""
    client_steps = memo.setdefault("client_steps", [0] * n_clients)
    rate = lr
    if cfg.client_cosine is not None:
        rate = cfg.client_cosine.rates([client_steps[c] for c in clients], device)
    for c in clients:
        client_steps[c] += 1
    return rate


def tick(cfg: SflSchedule, memo: dict, round_end: bool) -> tuple[int, bool, bool]:
    """Count a step in ``memo``: its global number, whether the cohort syncs after it (every
    ``sync_every`` steps since the last sync, counted across rounds, and at a round's end where
    configured), and whether it is logged (when it syncs, and every ``log_every`` steps)."""
    step = memo.get("step", 0) + 1
    memo["step"] = step
    since = memo.get("steps_since_sync", 0) + 1
    due = sync_due(since, cfg.sync_every, cfg.sync_at_round_end, round_end)
    memo["steps_since_sync"] = 0 if due else since
    return step, due, due or step % cfg.log_every == 0
