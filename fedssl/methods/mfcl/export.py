"""MFCL's export step (phase 2): what each client uploads once, and the bytes it really sent.
The paper's Eq. 5 bits are the `costs` stage's business (:mod:`.costs`), so editing a cost
formula reruns no training step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from fedssl.data.augment import BatchAugment
from fedssl.methods.mfcl.run import (
    build_client_module,
    dropped_clients,
    export_client,
)
from fedssl.rounds.runner import train_data
from fedssl.stage.runtime import write_json

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


def export(ctx: StepContext) -> None:
    """Phase-2 upload: every client that does not drop out sends rho pairs of twin views per
    local sample through the frozen client module + MaxPool, once; stored as fp16 arrays (one
    per client) with the bytes each client sent."""
    p, ex = ctx.exp.method, ctx.exp.method.export
    model = build_client_module(p, ctx.image_shape, ctx.device)
    ckpt = torch.load(
        ctx.input("pretrain") / "model.pt", map_location=ctx.device, weights_only=True
    )
    model.load_state_dict(ckpt["model"])
    images = train_data(ctx).images
    clients = ctx.clients()
    dropped = dropped_clients(len(clients), ex.client_dropout, p.seed)
    augment = BatchAugment(p.augment, ctx.image_shape[-1])
    per_client = []
    for m, idx in enumerate(clients):
        row = {
            "client": m,
            "samples": len(idx),
            "dropped": m in dropped,
            "bytes_sent": 0,
            "numel_sent": 0,
        }
        if m not in dropped:
            row.update(_upload(ctx, model, images, idx, augment, m))
        per_client.append(row)
        print(
            f"client {m}: "
            + ("dropped, sends nothing" if m in dropped else f"{row['bytes_sent']} bytes"),
            flush=True,
        )
    manifest = {
        "pairs": ex.pairs,
        "dtype": "float16",
        "dropped_clients": dropped,
        "bn_export_mode": ex.bn_export_mode,
        "tn_pairing": ex.tn_pairing,
        "per_client": per_client,
        "total_bytes_sent": sum(r["bytes_sent"] for r in per_client),
    }
    write_json(ctx.out / "manifest.json", manifest)
    ctx.info.update(dropped_clients=dropped, total_bytes_sent=manifest["total_bytes_sent"])


def _upload(ctx: StepContext, model, images, idx, augment: BatchAugment, m: int) -> dict:
    """Client ``m``'s upload, saved as its fp16 representations and their sample indices;
    returns what it sent."""
    p, ex = ctx.exp.method, ctx.exp.method.export
    reps = export_client(
        model,
        images,
        idx,
        augment,
        ex.pairs,
        ex.batch_pairs,
        p.seed,
        m,
        ex.bn_export_mode,
        ex.tn_pairing,
    )
    np.save(ctx.out / f"client_{m}.npy", reps.numpy())
    np.save(ctx.out / f"client_{m}_index.npy", np.asarray(idx))
    return {
        "bytes_sent": reps.numel() * reps.element_size(),
        "numel_sent": reps.numel(),
        "shape": list(reps.shape),
    }
