"""Pure aggregation functions: tensors in, tensors out (no engine, no strategy).

:class:`RunningMean` is the weighted mean of uploads taken as the clients finish, so a round
holds one model's worth of sums instead of every client's model (memory O(model), not
O(clients)); :func:`fedavg` is the same mean of uploads stacked along a client axis, computed
by adding the rows to a :class:`RunningMean`. Both paths perform the same elementwise
operations in the same order, so they agree bit for bit whichever kernels the CPU picks (a
BLAS matrix-vector product sums the clients in an order, and with fused multiply-adds or not,
that depends on the CPU's instruction set).
"""

from __future__ import annotations

import torch

Tensors = dict[str, torch.Tensor]


def fedavg(stacked: Tensors, weights: torch.Tensor) -> Tensors:
    """Weighted mean over the client axis; integer buffers (BN batch counters) take the max.
    The rows go through :class:`RunningMean`, so a round that sums its uploads as the clients
    finish gets these very bits."""
    running = RunningMean(weights)
    for i in range(len(weights)):
        running.add({k: v[i] for k, v in stacked.items()})
    return running.result()


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
    """The weighted mean of uploads added one at a time, in client order, each dropped once
    added (:func:`fedavg` is this over the rows of a stack).

    A float tensor is summed from zero as 0 + w_0 v_0 + w_1 v_1 + ..., in its own dtype
    (float32 or float64; half precision in float32, rounded back once at the end), each
    product rounded, then added: two elementwise operations, each correctly rounded, so the
    bits depend on no kernel choice (``add_(v, alpha=w)`` would be a fused multiply-add on some
    instruction sets and not on others); each of the two runs as one call over the tensors of a
    dtype (``torch._foreach_*``: on the CPU the same per-tensor kernels). Integer counters
    (BatchNorm's batch count) take a running maximum, exact in any order. It holds one model's
    worth of sums, whatever the client count."""

    def __init__(self, weights: torch.Tensor):
        self.w = weights / weights.sum()
        # each client's weight in both sum dtypes, cast once a round rather than once a client
        self.w_as = {dtype: self.w.to(dtype) for dtype in (torch.float32, torch.float64)}
        self.added = 0
        self.sums: Tensors = {}
        self.maxima: Tensors = {}
        self.dtypes: dict[str, torch.dtype] = {}
        self.by_dtype: dict[torch.dtype, list[str]] = {}  # the float tensors by sum dtype

    @torch.no_grad()
    def add(self, upload: Tensors) -> None:
        if self.added == len(self.w):
            raise ValueError(f"more uploads than the {len(self.w)} weights given")
        if not self.added:
            self._open(upload)
        i = self.added
        for dtype, keys in self.by_dtype.items():  # one product, one sum, over the tensors
            products = torch._foreach_mul([upload[k].to(dtype) for k in keys], self.w_as[dtype][i])
            torch._foreach_add_([self.sums[k] for k in keys], products)
        for k in [k for k in self.dtypes if k not in self.sums]:
            top, v = self.maxima.get(k), upload[k]
            self.maxima[k] = v.clone() if top is None else torch.maximum(top, v)
        self.added += 1

    def _open(self, upload: Tensors) -> None:
        """Zeros to sum the first upload's float tensors in (half precision in float32)."""
        self.dtypes = {k: v.dtype for k, v in upload.items()}
        for k, v in upload.items():
            if v.is_floating_point():
                dtype = torch.promote_types(v.dtype, torch.float32)
                self.sums[k] = torch.zeros_like(
                    v, dtype=dtype, memory_format=torch.contiguous_format
                )
                self.by_dtype.setdefault(dtype, []).append(k)

    def result(self) -> Tensors:
        if self.added != len(self.w):
            raise ValueError(f"{self.added} uploads added, {len(self.w)} weights given")
        every = {**self.sums, **self.maxima}
        return {k: every[k].to(dtype) for k, dtype in self.dtypes.items()}
