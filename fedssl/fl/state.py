"""What a federation carries from round to round, and what it is configured by: the
:class:`FederationConfig`, the byte :class:`Ledger`, the :class:`FedState` its checkpoint holds,
what a round's clients send back (:class:`RoundUpdates`), the seeded client sampling, the
learning-rate schedule and the per-round log. The strategies (:mod:`fedssl.strategies`) read and
write this state; the round loop (:mod:`fedssl.rounds`) drives both."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedssl.fl.cohort import Tensors
from fedssl.stage.runtime import numpy_rng, write_tsv

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

    @property
    def num_clients(self) -> int:
        """The federation's clients, every one of them (the ledger has a row for each)."""
        return len(self.ledger.samples)

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


def write_round_log(rows: list[dict], path: Path) -> None:
    """The per-round TSV (committed, plotted): the engine's columns, then any a strategy added;
    timings stay in the stage's run record, so an identical rerun writes an identical file."""
    extra = [k for row in rows for k in row if k not in LOG_FIELDS and k not in TIMING_FIELDS]
    fields = LOG_FIELDS + list(dict.fromkeys(extra))
    write_tsv([{k: r.get(k, "") for k in fields} for r in rows], path, fields)
