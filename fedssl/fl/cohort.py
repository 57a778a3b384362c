"""Local training of a cohort of clients, each from its own starting state.

The clients' weights are stacked along a leading client axis and trained with one functional
step per local step: ``torch.func.vmap`` runs every active client's forward/backward at once when
the model keeps no BatchNorm running statistics; BN models run one client at a time through the
very same code (a cohort of one). Nothing is deep-copied or re-created per client or per round.
Only the ``trainable`` parameters get gradients and optimizer state; the others stay frozen
(no autograd graph is built through frozen leading layers). Losses see the batch's labels.
An ``after_step`` callback sees the client-stacked tensors after every optimizer step (a
momentum encoder's EMA update of frozen target weights, MoCo / BYOL).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedssl import compiled
from fedssl.layout import is_channels_last
from fedssl.models.norms import has_running_stats
from fedssl.precision import laid_out, under_policy
from fedssl.stage.progress import advance
from fedssl.stage.runtime import numpy_rng

Tensors = dict[str, torch.Tensor]
# make_views(images uint8 [n, C, H, W], generator) -> tuple of float tensors [n, ...]
ViewFn = Callable[[torch.Tensor, torch.Generator], tuple]


class Batch(NamedTuple):
    """One client's local batch: its views, labels and which rows are real (short batches are
    padded to the cohort's width)."""

    views: tuple
    labels: torch.Tensor
    valid: torch.Tensor


# loss(model, params, buffers, batch) -> scalar; called per client (under vmap when parallel)
LossFn = Callable[[nn.Module, Tensors, Tensors, Batch], torch.Tensor]


def forward(model: nn.Module, state, *args, **kwargs):
    """``model(*args, **kwargs)`` with the weights ``state`` (a dict, or (params, buffers)),
    under the precision policy on the device of ``args[0]`` (the batch): the forward of every
    local loss. Outputs as the model gives them (bf16 where the policy autocasts)."""
    tie = has_tied_tensors(model)
    return under_policy(args[0], functional_call, model, state, args, kwargs, tie_weights=tie)


_TIED: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


@compiled.constant_at_trace  # a compiled step asks once, at trace time
def has_tied_tensors(model: nn.Module) -> bool:
    """Whether a tensor of ``model`` sits under two names (shared weights), looked up once per
    model: ``functional_call`` walks every module on every call to untie them, a fixed cost of
    each local step (about 0.6 ms on the default CNN), needless where nothing is shared."""
    tied = _TIED.get(model)
    if tied is None:
        tied = _TIED[model] = any(
            len(list(named(remove_duplicate=False))) != len(list(named()))
            for named in (model.named_parameters, model.named_buffers)
        )
    return tied


def on_outputs(loss: Callable[[object, Batch], torch.Tensor], own_forward=None) -> LossFn:
    """The trainer's loss from a pure loss of the model's outputs: the batch's views go through
    the model together, under the precision policy, and ``loss(outputs, batch)`` sees the
    outputs in fp32 (a tensor, or a tuple of them, in the views' order along dim 0). With
    ``own_forward(model, (params, buffers), batch)`` (several branches of the model, a frozen
    one among them) that runs instead, in one precision region, and ``loss`` sees its outputs
    as computed."""

    def loss_fn(model, params, buffers, batch):
        if own_forward is not None:
            state = (params, buffers)
            return loss(under_policy(batch.views[0], own_forward, model, state, batch), batch)
        out = forward(model, (params, buffers), torch.cat(batch.views))
        out = tuple(o.float() for o in out) if isinstance(out, tuple) else out.float()
        return loss(out, batch)

    return loss_fn


class StepLoss(nn.Module):
    """A trainer loss as a module of one tensor, what the cost meters run: ``batch_of(x)``
    makes the local batch of it; the loss reads the model's parameters and copies of its
    buffers, so that measuring a step leaves the model as it was."""

    def __init__(self, model: nn.Module, loss: LossFn, batch_of: Callable[[torch.Tensor], Batch]):
        super().__init__()
        self.model, self.loss, self.batch_of = model, loss, batch_of

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.model
        buffers = {k: v.clone() for k, v in m.named_buffers()}
        return self.loss(m, dict(m.named_parameters()), buffers, self.batch_of(x))


@dataclass(frozen=True)
class OptimizerConfig:
    kind: str = "adam"  # adam | adamw (decoupled weight decay) | sgd
    weight_decay: float = 0.0
    momentum: float = 0.9  # sgd
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    clip_norm: float | None = None  # each client's gradient rescaled to this global L2 norm

    @classmethod
    def of(cls, settings) -> OptimizerConfig:
        """The optimizer a federation block names (``optimizer``, ``weight_decay``,
        ``momentum``)."""
        return cls(settings.optimizer, settings.weight_decay, settings.momentum)


def clip_grad_norm(grads: Tensors, max_norm: float) -> Tensors:
    """``torch.nn.utils.clip_grad_norm_`` per client row: every client's gradients scaled by
    min(1, max_norm / (‖g‖ + 1e-6)), ‖g‖ the L2 norm over all its tensors."""
    norm = torch.stack([g.flatten(1).float().pow(2).sum(1) for g in grads.values()]).sum(0).sqrt()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    return {k: g * scale.to(g.dtype).view(-1, *[1] * (g.dim() - 1)) for k, g in grads.items()}


class StackedOptimizer:
    """Adam / AdamW / SGD-momentum over dicts of client-stacked tensors; state starts fresh each
    round
    (each client begins its local training with an empty optimizer state)."""

    def __init__(self, cfg: OptimizerConfig):
        self.cfg = cfg

    def init(self, params: Tensors) -> dict:
        n = next(iter(params.values())).shape[0]
        device = next(iter(params.values())).device
        state = {"step": torch.zeros(n, device=device)}
        state["m"] = {k: torch.zeros_like(v) for k, v in params.items()}
        if self.cfg.kind in ("adam", "adamw"):
            state["v"] = {k: torch.zeros_like(v) for k, v in params.items()}
        return state

    @torch.no_grad()
    def reset(self, state: dict) -> None:
        """``state`` back to what :meth:`init` gives, in place (one call over its tensors)."""
        moments = [t for k in ("m", "v") for t in state.get(k, {}).values()]
        torch._foreach_zero_([state["step"], *moments])

    @torch.no_grad()
    def step(self, params: Tensors, grads: Tensors, state: dict, lr: float | torch.Tensor) -> None:
        """``lr``: one rate for all clients, or a tensor of one rate per client row. Each
        operation runs over the model's tensors at once (``torch._foreach_*``: on the CPU the
        very per-tensor kernels, in one call, so a tiny client's step pays no Python per tensor
        and operator)."""
        c = self.cfg
        state["step"] += 1
        if c.clip_norm is not None:
            grads = clip_grad_norm(grads, c.clip_norm)
        p, m = list(params.values()), [state["m"][k] for k in params]
        g = [grads[k] for k in params]
        rate = [lr.view(_rows(q)) for q in p] if torch.is_tensor(lr) else lr
        if c.weight_decay and c.kind != "adamw":  # L2 added to the gradient
            g = torch._foreach_add(g, torch._foreach_mul(p, c.weight_decay))
        elif c.weight_decay:  # AdamW: decay the weights themselves, before the Adam step
            decay = [1 - r * c.weight_decay for r in rate] if isinstance(rate, list) else None
            torch._foreach_mul_(p, decay if decay is not None else 1 - rate * c.weight_decay)
        if c.kind == "sgd":
            torch._foreach_mul_(m, c.momentum)
            torch._foreach_add_(m, g)
            torch._foreach_sub_(p, torch._foreach_mul(m, rate))
            return
        v = [state["v"][k] for k in params]
        b1, b2 = c.betas
        torch._foreach_mul_(m, b1)
        torch._foreach_add_(m, g, alpha=1 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, g, g, value=1 - b2)
        bc1, bc2 = (1 - beta ** state["step"] for beta in c.betas)  # once a step
        step = torch._foreach_div(m, [bc1.view(_rows(q)) for q in p])
        torch._foreach_mul_(step, rate)
        denom = torch._foreach_div(v, [bc2.view(_rows(q)) for q in p])
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, c.eps)
        torch._foreach_div_(step, denom)
        torch._foreach_sub_(p, step)


def _rows(t: torch.Tensor) -> tuple:
    """The shape that broadcasts one value per client row over ``t``."""
    return (-1,) + (1,) * (t.dim() - 1)


def stack(states: list[Tensors]) -> Tensors:
    """Per-client states -> one client-stacked state (a fresh copy), convolution weights in the
    precision policy's layout (aggregation returns them contiguous): every client's slice keeps
    the strides of its laid-out tensor, which ``torch.stack`` does not promise."""
    return {k: _stacked([laid_out(s[k].detach()) for s in states]) for k in states[0]}


def _stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    first = tensors[0]
    if not (first.is_contiguous() or is_channels_last(first)):
        return torch.stack(tensors)  # a view with gaps: its strides cannot lay out a row
    out = first.new_empty_strided((len(tensors), *first.shape), (first.numel(), *first.stride()))
    for row, t in zip(out, tensors):
        row.copy_(t)
    return out


@torch.no_grad()
def refill(row: Tensors, state: Tensors) -> None:
    """One client's ``state`` copied into the one-row stack ``row`` (its layout kept)."""
    dst, src = [v[0] for v in row.values()], [state.get(k) for k in row]
    if len(state) != len(row) or any(
        s is None or s.shape != d.shape or s.dtype != d.dtype for d, s in zip(dst, src)
    ):
        raise ValueError(
            "a client's starting state differs from the first client's in its names, "
            "shapes or dtypes"
        )
    torch._foreach_copy_(dst, src)


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
    """A client's local schedule: per epoch a seeded shuffle cut into K = ceil(n / B) batches of
    near-equal size (sizes differ by at most 1, none above B): 600 samples at B = 64 give 10
    batches of 60, not 9 of 64 and one of 24 as a DataLoader without ``drop_last`` cuts them.
    The step count K is the reference code's; only the batch sizes differ. Kept (every
    committed result was trained with it); tested in ``tests/fl/test_cohort_rules.py``."""
    batches = []
    for epoch in range(epochs):
        order = numpy_rng(*seed_parts, epoch).permutation(indices)
        batches += np.array_split(order, max(1, -(-len(order) // batch_size)))
    return batches


@dataclass
class LocalData:
    """A data split on the training device, and each client's indices into it."""

    images: torch.Tensor  # uint8 [N, C, H, W]
    labels: torch.Tensor  # int64 [N] (-1 for unlabelled samples)
    clients: list[np.ndarray]

    @property
    def device(self) -> torch.device:
        return self.images.device

    def sizes(self) -> list[int]:
        return [len(c) for c in self.clients]


def client_data(
    images: torch.Tensor, labels: np.ndarray | torch.Tensor, clients: list[np.ndarray]
) -> LocalData:
    """The training split on its device with the clients' index arrays."""
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.int64).to(images.device)
    return LocalData(images, labels, clients)


class CohortTrainer:
    """Runs the local epochs of several clients, each from its own starting state."""

    def __init__(
        self,
        model: nn.Module,
        make_views: ViewFn,
        loss_fn: LossFn,
        opt: OptimizerConfig,
        batch_size: int,
        local_epochs: int,
        parallel: bool = True,
        after_step: Callable[[Tensors, Tensors, Tensors], None] | None = None,
    ):
        """``after_step(trained, frozen, buffers)``: called after every optimizer step with the
        client-stacked tensors of the clients that stepped; changes it makes in place persist."""
        self.model, self.make_views, self.loss_fn = model, make_views, loss_fn
        self.after_step = after_step
        self.optimizer = StackedOptimizer(opt)
        self.batch_size, self.local_epochs = batch_size, local_epochs
        self.parallel = parallel and not has_running_stats(model)
        self.param_names = [k for k, _ in model.named_parameters()]
        self._grad = grad_and_value(self._loss)
        self._one_loss = compiled.step(model, self._loss)  # a cohort of one's, built once
        self._vgrad = vmap(self._grad)

    def _loss(self, trained, frozen, buffers, batch):
        return self.loss_fn(self.model, {**trained, **frozen}, buffers, batch)

    def train(
        self,
        starts: list[Tensors],
        data: LocalData,
        client_ids: list[int],
        lr: float,
        seed_parts: tuple,
        generator: torch.Generator,
        trainable: set[str] | None = None,
        finished: Callable[[int, Tensors], None] | None = None,
    ) -> tuple[Tensors | None, torch.Tensor]:
        """Train clients ``client_ids`` (rows of ``data.clients``), client i from ``starts[i]``
        (its parameters and buffers). Returns their client-stacked final states and mean
        losses. A client's batches depend only on (seed_parts, its id), so parallel and
        one-by-one training see the same data. With ``finished``, each client's final state
        goes to ``finished(i, state)`` as soon as it is trained, in order, and no stacked
        state is kept (returned as None): one at a time, a round holds one client's model."""
        schedules = [
            client_batches(data.clients[c], self.batch_size, self.local_epochs, *seed_parts, c)
            for c in client_ids
        ]
        names = set(self.param_names) if trainable is None else set(trainable)
        if self.parallel:
            state = stack(starts)
            groups = self._groups(state, names)
            losses = self._train_group(
                groups, self.optimizer.init(groups[0]), schedules, data, lr, generator
            )
            return _hand_over(state, len(client_ids), finished), losses
        return self._one_at_a_time(starts, schedules, data, lr, generator, names, finished)

    def _one_at_a_time(self, starts, schedules, data, lr, generator, names, finished):
        """Each client in turn, written into the stacked result as it finishes (or handed over:
        ``finished`` copies what it keeps): a round holds one copy of the cohort's models, not
        a list and their concatenation. One client's row of weights and optimizer state is
        laid out once and refilled for each client (a copy and a zeroing, one call each over
        the tensors), not rebuilt tensor by tensor."""
        row = stack(starts[:1])
        groups = self._groups(row, names)
        opt_state = self.optimizer.init(groups[0])
        out, losses = None, torch.empty(len(starts), device=data.device)
        for i, (s, sch) in enumerate(zip(starts, schedules)):
            if i:
                refill(row, s)
                self.optimizer.reset(opt_state)
            losses[i] = self._train_group(groups, opt_state, [sch], data, lr, generator)[0]
            if finished is not None:
                finished(i, {k: v[0] for k, v in row.items()})
                continue
            if out is None:
                out = {k: v.new_empty((len(starts), *v.shape[1:])) for k, v in row.items()}
            for k, v in row.items():
                out[k][i] = v[0]
        return out, losses

    def _groups(self, state: Tensors, names: set[str]) -> tuple[Tensors, Tensors, Tensors]:
        """``state``'s tensors as (trained, frozen, buffers)."""
        trained = {k: state[k] for k in self.param_names if k in names}
        frozen = {k: state[k] for k in self.param_names if k not in names}
        buffers = {k: v for k, v in state.items() if k not in trained and k not in frozen}
        return trained, frozen, buffers

    def _train_group(self, groups, opt_state, schedules, data: LocalData, lr, generator):
        """The local steps of the clients stacked in ``groups`` (trained, frozen, buffers),
        in place; their mean losses."""
        n = len(schedules)
        loss_sum = torch.zeros(n, device=data.device)
        for step in range(max(len(s) for s in schedules)):
            rows = [i for i, s in enumerate(schedules) if step < len(s)]
            batch = self._gather_batch([schedules[i][step] for i in rows], data, generator)
            losses = self._step(*groups, opt_state, rows, batch, lr).detach().float()
            if len(rows) == n:
                loss_sum += losses
            else:
                loss_sum[rows] += losses
            advance(sum(len(schedules[i][step]) for i in rows))
        steps = torch.tensor([len(s) for s in schedules], device=data.device)
        return loss_sum / steps

    def _gather_batch(self, batches: list[np.ndarray], data: LocalData, generator) -> Batch:
        """One index gather on the device; short batches are padded and flagged invalid."""
        width = max(len(b) for b in batches)
        idx = np.zeros((len(batches), width), dtype=np.int64)
        valid = np.zeros((len(batches), width), dtype=bool)
        for r, b in enumerate(batches):
            idx[r, : len(b)], valid[r, : len(b)] = b, True
        idx_t = torch.from_numpy(idx).to(data.device, non_blocking=True).flatten()
        images = data.images[idx_t]
        flat = self.make_views(images, generator)
        views = tuple(v.view(len(batches), width, *v.shape[1:]) for v in flat)
        return Batch(
            views,
            data.labels[idx_t].view(len(batches), width),
            torch.from_numpy(valid).to(data.device, non_blocking=True),
        )

    def _step(self, trained, frozen, buffers, opt_state, rows, batch: Batch, lr):
        n = next(iter(trained.values())).shape[0]
        if n == 1:  # a cohort of one: plain autograd (faster than torch.func on CPU)
            p = {k: v[0].detach().requires_grad_(True) for k, v in trained.items()}
            f = {k: v[0] for k, v in frozen.items()}
            b = {k: v[0] for k, v in buffers.items()}  # views: BN stats update the stack
            loss = self._one_loss(p, f, b, Batch(*(_row(x) for x in batch)))
            grads = torch.autograd.grad(loss, list(p.values()))
            self.optimizer.step(
                trained, {k: g.unsqueeze(0) for k, g in zip(p, grads)}, opt_state, lr
            )
            if self.after_step:
                self.after_step(trained, frozen, buffers)
            return loss.detach().unsqueeze(0)
        if len(rows) == n:
            grads, loss = self._vgrad(trained, frozen, buffers, batch)
            self.optimizer.step(trained, grads, opt_state, lr)
            if self.after_step:
                self.after_step(trained, frozen, buffers)
            return loss
        sel = torch.tensor(rows, device=batch.valid.device)  # clients with batches left
        t, f, b, s = (gather(x, sel) for x in (trained, frozen, buffers, opt_state))
        grads, loss = self._vgrad(t, f, b, batch)
        self.optimizer.step(t, grads, s, lr)
        if self.after_step:
            self.after_step(t, f, b)
            scatter(frozen, sel, f)
        scatter(trained, sel, t)
        scatter(opt_state, sel, s)
        return loss


def _hand_over(out: Tensors, n: int, finished) -> Tensors | None:
    """``out`` itself, or (with ``finished``) each of its n rows handed over in order."""
    if finished is None:
        return out
    for i in range(n):
        finished(i, {k: v[i] for k, v in out.items()})
    return None


def _row(x):
    """Row 0 of a client-stacked tensor, or of every tensor in a tuple of them."""
    return tuple(v[0] for v in x) if isinstance(x, tuple) else x[0]


def vectorise_clients(setting: str, device: torch.device) -> bool:
    """``parallel_clients``: on, off, or auto = on CUDA only (on the CPU the vectorised grouped
    convolutions run slower than one client at a time)."""
    return setting == "on" or (setting == "auto" and device.type == "cuda")
