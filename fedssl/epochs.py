"""The resumable epoch loop of centralised training (CP-CFL's server pretraining, MFCL's rServer,
the shared fine-tune), with the federated engine's checkpoint rules: after every epoch the
trained state, the epoch count and the log are saved atomically; a restart loads them with
``weights_only=True`` and only when the params fingerprint matches, then runs the remaining
epochs. Each epoch draws its randomness from seeds named by the epoch, so a resumed run
computes exactly what an uninterrupted one does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from fedssl.stage.runtime import check_finite, load_checkpoint, torch_save


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
