"""Pure aggregation functions: tensors in, tensors out (no engine, no strategy).

:func:`fedavg` reduces uploads stacked along a client axis; :class:`RunningMean` is the same
reduction taken as the clients finish, so a round holds one model's worth of sums instead of
every client's model (memory O(model), not O(clients)).
"""

from __future__ import annotations

import torch

Tensors = dict[str, torch.Tensor]


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


def fedavg_by_group(
    uploads: list[Tensors], weights: torch.Tensor, groups: list[int], keys=None
) -> dict[int, Tensors]:
    """:func:`fedavg` within each group of clients (a model of a pool, a cluster), for the
    groups that have a member, in increasing order (IFCA's pool, FeatARC's clusters)."""
    out = {}
    for g in sorted(set(groups)):
        rows = [i for i, h in enumerate(groups) if h == g]
        out[g] = fedavg(stacked([uploads[i] for i in rows], keys), weights[rows])
    return out


def stacked(uploads: list[Tensors], keys=None) -> Tensors:
    """The uploads client-stacked. Where they are the rows of the cohort's output in order
    (uploaded whole, as FedAvg's clients do), that tensor itself: stacking it again would hold
    a second copy of every client's model, and a round's peak memory would grow by the
    model's size per client."""
    keys = uploads[0].keys() if keys is None else keys
    out = {}
    for k in keys:
        rows = [u[k] for u in uploads]
        whole = _rows_of_one(rows)
        out[k] = torch.stack(rows) if whole is None else whole
    return out


def _rows_of_one(rows: list[torch.Tensor]) -> torch.Tensor | None:
    """The contiguous tensor whose rows 0, 1, ... are ``rows`` (views of it), else None."""
    base = rows[0]._base
    if base is None or not base.is_contiguous() or base.shape[0] != len(rows):
        return None
    row_shape, step = base.shape[1:], base.stride(0)
    for i, r in enumerate(rows):
        if r._base is not base or r.shape != row_shape or not r.is_contiguous():
            return None
        if r.storage_offset() != base.storage_offset() + i * step:
            return None
    return base


class RunningMean:
    """:func:`fedavg` of uploads added one at a time, in client order, each dropped once added.

    A float32 tensor of two or more elements is summed from zero as 0 + w_0 v_0 + w_1 v_1 + ...
    (each product rounded, then added): the order in which BLAS's matrix-vector product inside
    :func:`fedavg`'s ``tensordot`` sums the clients (MKL on x86, checked bit for bit by
    ``tests/strategies/test_fedavg.py``), so both give the very same model. Integer counters
    (BatchNorm's batch count) take a running maximum, exact in any order. The other tensors
    (float scalars, whose ``tensordot`` is a blocked dot product; other float dtypes) are few
    and small: they are kept and reduced by :func:`fedavg` at the end, the only part of the
    sums that grows with the clients (a few bytes each)."""

    def __init__(self, weights: torch.Tensor):
        self.weights = weights
        self.w = weights / weights.sum()
        self.added = 0
        self.sums: Tensors = {}
        self.maxima: Tensors = {}
        self.rows: dict[str, list[torch.Tensor]] = {}
        self.keys: list[str] = []

    @staticmethod
    def summed(v: torch.Tensor) -> bool:
        return v.dtype == torch.float32 and v.numel() > 1

    @torch.no_grad()
    def add(self, upload: Tensors) -> None:
        if self.added == len(self.w):
            raise ValueError(f"more uploads than the {len(self.w)} weights given")
        w = self.w[self.added]
        if not self.added:
            self.keys = list(upload)
        for k, v in upload.items():
            if self.summed(v):
                if k not in self.sums:
                    self.sums[k] = torch.zeros_like(v, memory_format=torch.contiguous_format)
                self.sums[k].add_(w.to(v.dtype) * v)
            elif not v.is_floating_point():
                top = self.maxima.get(k)
                self.maxima[k] = v.clone() if top is None else torch.maximum(top, v)
            else:
                self.rows.setdefault(k, []).append(v.detach().clone())
        self.added += 1

    def result(self) -> Tensors:
        if self.added != len(self.w):
            raise ValueError(f"{self.added} uploads added, {len(self.w)} weights given")
        rest = fedavg({k: torch.stack(r) for k, r in self.rows.items()}, self.weights)
        every = {**self.sums, **self.maxima, **rest}
        return {k: every[k] for k in self.keys}
