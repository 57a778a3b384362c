"""Local training of a cohort of clients that all start from the same global weights.

The clients' weights are stacked along a leading client axis and trained with one functional
step per local step: ``torch.func.vmap`` runs every active client's forward/backward at once when
the model keeps no BatchNorm running statistics; BN models run one client at a time through the
very same code (a cohort of one). Nothing is deep-copied or re-created per client or per round.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.func import grad_and_value, vmap

from fedssl.models.norms import has_running_stats
from fedssl.runtime import numpy_rng

Tensors = dict[str, torch.Tensor]
# make_views(images uint8 [n, C, H, W], generator) -> tuple of float tensors [n, ...]
ViewFn = Callable[[torch.Tensor, torch.Generator], tuple]
# loss(model, params, buffers, views, valid [B] bool) -> scalar; called per client under vmap
LossFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class OptimizerConfig:
    kind: str = "adam"           # adam | sgd
    weight_decay: float = 0.0
    momentum: float = 0.9        # sgd
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


class StackedOptimizer:
    """Adam / SGD-momentum over dicts of client-stacked tensors; state starts fresh each round
    (each client begins its local training with an empty optimizer state)."""

    def __init__(self, cfg: OptimizerConfig):
        self.cfg = cfg

    def init(self, params: Tensors) -> dict:
        n = next(iter(params.values())).shape[0]
        device = next(iter(params.values())).device
        state = {"step": torch.zeros(n, device=device)}
        state["m"] = {k: torch.zeros_like(v) for k, v in params.items()}
        if self.cfg.kind == "adam":
            state["v"] = {k: torch.zeros_like(v) for k, v in params.items()}
        return state

    @torch.no_grad()
    def step(self, params: Tensors, grads: Tensors, state: dict, lr: float) -> None:
        c = self.cfg
        state["step"] += 1
        for k, p in params.items():
            g = grads[k]
            if c.weight_decay:
                g = g + c.weight_decay * p
            m = state["m"][k]
            if c.kind == "sgd":
                m.mul_(c.momentum).add_(g)
                p.sub_(lr * m)
                continue
            v = state["v"][k]
            m.mul_(c.betas[0]).add_(g, alpha=1 - c.betas[0])
            v.mul_(c.betas[1]).addcmul_(g, g, value=1 - c.betas[1])
            shape = (-1,) + (1,) * (p.dim() - 1)
            bc1 = (1 - c.betas[0] ** state["step"]).view(shape)
            bc2 = (1 - c.betas[1] ** state["step"]).view(shape)
            p.sub_(lr * (m / bc1) / ((v / bc2).sqrt() + c.eps))


def stack_state(tensors: Tensors, n: int) -> Tensors:
    return {k: v.detach().unsqueeze(0).repeat(n, *([1] * v.dim())) for k, v in tensors.items()}


def gather(tree, rows: torch.Tensor):
    if isinstance(tree, dict):
        return {k: gather(v, rows) for k, v in tree.items()}
    return tree.index_select(0, rows)


def scatter(tree, rows: torch.Tensor, new) -> None:
    if isinstance(tree, dict):
        for k in tree:
            scatter(tree[k], rows, new[k])
    else:
        tree.index_copy_(0, rows, new)


def client_batches(indices: np.ndarray, batch_size: int, epochs: int, *seed_parts) -> list:
    """A client's local schedule: per epoch a seeded shuffle cut into batches (last one short)."""
    batches = []
    for epoch in range(epochs):
        order = numpy_rng(*seed_parts, epoch).permutation(indices)
        batches += np.array_split(order, max(1, -(-len(order) // batch_size)))
    return batches


class CohortTrainer:
    """Runs the local epochs of several clients from one global state."""

    def __init__(self, model: nn.Module, make_views: ViewFn, loss_fn: LossFn,
                 opt: OptimizerConfig, batch_size: int, local_epochs: int, parallel: bool = True):
        self.model, self.make_views, self.loss_fn = model, make_views, loss_fn
        self.optimizer = StackedOptimizer(opt)
        self.batch_size, self.local_epochs = batch_size, local_epochs
        self.parallel = parallel and not has_running_stats(model)
        self._grad = grad_and_value(self._loss)
        self._vgrad = vmap(self._grad)

    def _loss(self, params, buffers, views, valid):
        return self.loss_fn(self.model, params, buffers, views, valid)

    def train(self, global_params: Tensors, global_buffers: Tensors, clients: list[np.ndarray],
              client_ids: list[int], images: torch.Tensor, lr: float, seed_parts: tuple,
              generator: torch.Generator):
        """Train ``clients`` (index arrays into ``images``) from the global state. Returns the
        client-stacked params and buffers and each client's mean loss. A client's batches depend
        only on (seed_parts, its id), so parallel and one-by-one training see the same data."""
        schedules = [client_batches(c, self.batch_size, self.local_epochs, *seed_parts, cid)
                     for c, cid in zip(clients, client_ids)]
        if self.parallel:
            return self._train_group(global_params, global_buffers, schedules, images, lr,
                                     generator)
        results = [self._train_group(global_params, global_buffers, [s], images, lr, generator)
                   for s in schedules]
        return tuple(_concat([r[j] for r in results]) for j in range(3))

    def _train_group(self, gp, gb, schedules, images, lr, generator):
        n = len(schedules)
        params, buffers = stack_state(gp, n), stack_state(gb, n)
        opt_state = self.optimizer.init(params)
        loss_sum = torch.zeros(n, device=images.device)
        for step in range(max(len(s) for s in schedules)):
            rows = [i for i, s in enumerate(schedules) if step < len(s)]
            batch, valid = self._gather_batch([schedules[i][step] for i in rows], images)
            flat = self.make_views(batch.flatten(0, 1), generator)
            views = tuple(v.view(len(rows), -1, *v.shape[1:]) for v in flat)
            losses = self._step(params, buffers, opt_state, rows, views, valid, lr)
            loss_sum[rows] += losses.detach().float()
        steps = torch.tensor([len(s) for s in schedules], device=images.device)
        return params, buffers, loss_sum / steps

    def _gather_batch(self, batches: list[np.ndarray], images: torch.Tensor):
        """One index gather on the device; short batches are padded and flagged invalid."""
        width = max(len(b) for b in batches)
        idx = np.zeros((len(batches), width), dtype=np.int64)
        valid = np.zeros((len(batches), width), dtype=bool)
        for r, b in enumerate(batches):
            idx[r, :len(b)], valid[r, :len(b)] = b, True
        idx_t = torch.from_numpy(idx).to(images.device, non_blocking=True)
        batch = images[idx_t.flatten()].view(len(batches), width, *images.shape[1:])
        return batch, torch.from_numpy(valid).to(images.device, non_blocking=True)

    def _step(self, params, buffers, opt_state, rows, views, valid, lr):
        n = next(iter(params.values())).shape[0]
        if n == 1:  # a cohort of one: plain autograd (faster than torch.func on CPU)
            p = {k: v[0].detach().requires_grad_(True) for k, v in params.items()}
            b = {k: v[0] for k, v in buffers.items()}  # views: BN stats update the stack
            loss = self._loss(p, b, tuple(v[0] for v in views), valid[0])
            grads = torch.autograd.grad(loss, list(p.values()))
            self.optimizer.step(params, {k: g.unsqueeze(0) for k, g in zip(p, grads)},
                                opt_state, lr)
            return loss.detach().unsqueeze(0)
        if len(rows) == n:
            grads, loss = self._vgrad(params, buffers, views, valid)
            self.optimizer.step(params, grads, opt_state, lr)
            return loss
        sel = torch.tensor(rows, device=valid.device)  # only the clients with batches left
        p, b, s = gather(params, sel), gather(buffers, sel), gather(opt_state, sel)
        grads, loss = self._vgrad(p, b, views, valid)
        self.optimizer.step(p, grads, s, lr)
        scatter(params, sel, p)
        scatter(opt_state, sel, s)
        return loss


def _concat(parts):
    if isinstance(parts[0], dict):
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    return torch.cat(parts)
