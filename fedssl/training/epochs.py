"""The loops of centralised training and encoding (CP-CFL's server pretraining, MFCL's export
and rServer, FSL's smashed sample, the probes, the shared fine-tune), which own the precision
policy, and the resumable epoch loop around them.

:func:`encoded` and :func:`train_steps` run each batch's forward as one region of the policy
and the work around it (views, learning rates, a loss of the outputs, the optimizer) outside,
as the federated cohort's forward does for local training: a method hands them its forward and
batches and so cannot move a region's boundary (which would move its committed numbers).

:func:`run_epochs` keeps the federated engine's checkpoint rules: after every epoch the trained
state, the epoch count and the log are saved atomically; a restart loads them with
``weights_only=True`` and only when the params fingerprint matches, then runs the remaining
epochs. Each epoch draws its randomness from seeds named by the epoch, so a resumed run
computes exactly what an uninterrupted one does."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

import torch

from fedssl.precision import under_policy
from fedssl.stage.runtime import check_finite, load_checkpoint, torch_save


def train_mode_batches(rows: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """``rows`` in batches of ``batch_size`` as ``Tensor.split`` cuts them, except that a last
    batch of one sample, which batch norm in training mode cannot normalise, joins the one
    before it (a batch of B + 1); every other cut is ``split``'s, so results made with it stay."""
    batches = list(rows.split(batch_size))
    if len(batches) > 1 and len(batches[-1]) == 1:
        batches[-2:] = [torch.cat(batches[-2:])]
    return batches


class Stateful(Protocol):
    """A model or an optimizer: what the checkpoint holds of it."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict, /): ...


def run_epochs(
    epochs: int,
    one_epoch: Callable[[int], dict],
    state: dict[str, Stateful],
    ckpt: Path | None = None,
    fingerprint: str = "",
    device: torch.device | str = "cpu",
    name: str = "training",
    on_epoch: Callable[[list[dict]], None] | None = None,
) -> list[dict]:
    """Run ``one_epoch(epoch)`` for each epoch not yet done and return the log, one row per
    epoch (those of the checkpoint first). A row's ``loss`` must be finite. ``state`` names
    what the checkpoint saves and restores (e.g. ``{"model": net, "opt": opt}``); without
    ``ckpt`` nothing is saved. ``on_epoch(log)`` follows every epoch (progress, TSV logs)."""
    log, first = [], 0
    ck = None if ckpt is None else load_checkpoint(ckpt, fingerprint, device)
    if ck is not None:
        for key, obj in state.items():
            obj.load_state_dict(ck[key])
        log, first = ck["log"], ck["epoch"]
        print(f"{name}: resuming from epoch {first}", flush=True)
    for epoch in range(first, epochs):
        row = one_epoch(epoch)
        check_finite(
            row["loss"],
            f"{name} epoch {epoch + 1}",
            "the checkpoint of the last finished epoch is kept",
        )
        log.append(row)
        if ckpt is not None:
            torch_save(
                {
                    "fingerprint": fingerprint,
                    "epoch": epoch + 1,
                    "log": log,
                    **{key: obj.state_dict() for key, obj in state.items()},
                },
                ckpt,
            )
        if on_epoch:
            on_epoch(log)
    return log


def _regions(device: torch.device | str, fn: Callable, batches: Iterable[tuple]):
    """``fn(*args)`` for each ``args`` of ``batches``, each call one region of the policy;
    ``batches`` advances (views drawn, rates set) outside the regions."""
    for args in batches:
        yield under_policy(device, fn, *args)


@torch.no_grad()
def encoded(device: torch.device | str, encode: Callable, batches: Iterable[tuple]) -> Iterator:
    """``encode(*args)`` for each ``args`` of ``batches`` (lazily, in order), without gradients,
    under the precision policy on ``device``: outputs as computed (bf16 where it autocasts)."""
    yield from _regions(device, encode, batches)


def train_steps(
    opt: torch.optim.Optimizer,
    device: torch.device | str,
    forward: Callable,
    batches: Iterable[tuple],
    loss: Callable[..., torch.Tensor] | None = None,
    after_step: Callable[[], None] | None = None,
) -> float:
    """One optimizer step per ``args`` of ``batches``: ``forward(*args)`` under the precision
    policy on ``device`` (one region), then ``loss`` of its outputs outside the region (without
    ``loss`` the forward's value is the loss), a step of ``opt`` and ``after_step()`` (a target's
    EMA). Returns the mean of the steps' losses."""
    total, steps = 0.0, 0
    for out in _regions(device, forward, batches):
        value = out if loss is None else loss(out)
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()
        if after_step is not None:
            after_step()
        total += value.item()
        steps += 1
    return total / steps
