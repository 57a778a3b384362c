"""Federated rounds: client sampling, local training (a CohortTrainer), data-size-weighted FedAvg
over parameters and buffers, per-client byte accounting, per-round log and checkpoint/resume."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from fedssl.fl.cohort import CohortTrainer, Tensors
from fedssl.runtime import numpy_rng, torch_generator, torch_save, write_tsv

# aggregate(client-stacked state, data-size weights, client ids, round) -> the global state
Aggregate = Callable[[Tensors, torch.Tensor, list[int], int], Tensors]
LOG_FIELDS = ["round", "clients", "loss", "lr", "bytes_up", "bytes_down", "seconds",
              "images_per_s"]


@dataclass
class FederationConfig:
    rounds: int
    client_fraction: float
    lr: float
    lr_schedule: str = "constant"  # constant | cosine (over rounds)
    seed: int = 0


@dataclass
class ClientLedger:
    """What each client actually sent and received, from the exchanged tensors."""
    bytes_up: list[int]
    bytes_down: list[int]
    rounds: list[int]
    samples: list[int]

    @classmethod
    def empty(cls, sizes: list[int]):
        n = len(sizes)
        return cls([0] * n, [0] * n, [0] * n, list(sizes))

    def summary(self) -> dict:
        return {"per_client": [{"client": i, "bytes_up": u, "bytes_down": d, "rounds": r,
                                "samples": s}
                               for i, (u, d, r, s) in enumerate(zip(
                                   self.bytes_up, self.bytes_down, self.rounds, self.samples))],
                "total_bytes_up": sum(self.bytes_up), "total_bytes_down": sum(self.bytes_down)}


@dataclass
class FederationState:
    round: int
    params: Tensors
    buffers: Tensors
    ledger: ClientLedger
    log: list[dict] = field(default_factory=list)


def nbytes(tensors: Tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def sample_clients(num_clients: int, fraction: float, seed: int, round_: int) -> list[int]:
    k = max(1, round(fraction * num_clients))
    return sorted(numpy_rng(seed, "sample", round_).choice(num_clients, k, replace=False).tolist())


def round_lr(cfg: FederationConfig, round_: int) -> float:
    if cfg.lr_schedule == "cosine":
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * round_ / max(1, cfg.rounds)))
    return cfg.lr


def fedavg(stacked: Tensors, weights: torch.Tensor) -> Tensors:
    """Weighted mean over the client axis; integer buffers (BN batch counters) take the max."""
    w = weights / weights.sum()
    out = {}
    for k, v in stacked.items():
        if v.is_floating_point():
            out[k] = torch.tensordot(w.to(v.dtype), v, dims=1)
        else:
            out[k] = v.max(0).values
    return out


def plain_fedavg(stacked: Tensors, weights: torch.Tensor, client_ids: list[int],
                 round_: int) -> Tensors:
    return fedavg(stacked, weights)


def split_state(model: nn.Module) -> tuple[Tensors, Tensors]:
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    return params, buffers


class Federation:
    """Drives rounds of a CohortTrainer over fixed client data; resumable from ``ckpt_path``.
    ``aggregate`` turns the clients' states into the global one (FedAvg unless told otherwise,
    e.g. secure aggregation)."""

    def __init__(self, trainer: CohortTrainer, clients: list[np.ndarray], images: torch.Tensor,
                 cfg: FederationConfig, ckpt_path: Path, fingerprint: str,
                 aggregate: Aggregate = plain_fedavg):
        self.trainer, self.clients, self.images, self.cfg = trainer, clients, images, cfg
        self.aggregate = aggregate
        self.ckpt_path, self.fingerprint = Path(ckpt_path), fingerprint
        self.sizes = torch.tensor([len(c) for c in clients], dtype=torch.float64)

    def start(self, model: nn.Module) -> FederationState:
        """The last checkpoint of this very configuration, or round 0 from ``model``."""
        if self.ckpt_path.exists():
            ck = torch.load(self.ckpt_path, map_location=self.images.device, weights_only=False)
            if ck.get("fingerprint") == self.fingerprint:
                return ck["state"]
        params, buffers = split_state(model)
        return FederationState(0, params, buffers,
                               ClientLedger.empty([len(c) for c in self.clients]))

    def run(self, state: FederationState, on_round=None) -> FederationState:
        while state.round < self.cfg.rounds:
            state = self.run_round(state)
            torch_save({"fingerprint": self.fingerprint, "state": state}, self.ckpt_path)
            if on_round:
                on_round(state)
        return state

    def run_round(self, s: FederationState) -> FederationState:
        r, cfg = s.round, self.cfg
        chosen = sample_clients(len(self.clients), cfg.client_fraction, cfg.seed, r)
        lr = round_lr(cfg, r)
        gen = torch_generator(self.images.device, cfg.seed, "augment", r)
        t0 = time.perf_counter()
        params, buffers, losses = self.trainer.train(
            s.params, s.buffers, [self.clients[c] for c in chosen], chosen, self.images, lr,
            (cfg.seed, "local", r), gen)
        down = nbytes(s.params) + nbytes(s.buffers)  # the global state each client downloads
        up = down                                      # each client returns a state of that shape
        weights = self.sizes[chosen].to(params[next(iter(params))].device)
        merged = self.aggregate({**params, **buffers}, weights, chosen, r)
        new_params = {k: merged[k] for k in params}
        new_buffers = {k: merged[k] for k in buffers}
        if self.images.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        for c in chosen:
            s.ledger.bytes_up[c] += up
            s.ledger.bytes_down[c] += down
            s.ledger.rounds[c] += 1
        images = self.trainer.local_epochs * sum(len(self.clients[c]) for c in chosen)
        row = {"round": r + 1, "clients": len(chosen),
               "loss": float((losses.double() * weights).sum() / weights.sum()), "lr": lr,
               "bytes_up": up * len(chosen), "bytes_down": down * len(chosen),
               "seconds": round(seconds, 3), "images_per_s": round(images / seconds, 1)}
        return FederationState(r + 1, new_params, new_buffers, s.ledger, s.log + [row])


def write_round_log(rows: list[dict], path: Path) -> None:
    write_tsv(rows, path, LOG_FIELDS)
