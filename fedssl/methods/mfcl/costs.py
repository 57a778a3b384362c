"""MFCL's `costs` stage and projection: phase-1 training and traffic plus the one-shot export
per client, in the paper's conventions (:mod:`fedssl.methods.mfcl.paper_costs`) and measured."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import torch

from fedssl import costs
from fedssl.fl.state import nbytes
from fedssl.methods.mfcl import paper_costs
from fedssl.methods.mfcl.run import build_client_module, pre_pool_numel
from fedssl.models.autoencoder import reconstruction_loss

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


def _client_costs(p, shape, samples, rounds, sent, export: list[dict]) -> list[dict]:
    """Per-client MFCL costs: phase-1 training and traffic, plus the one-shot export."""
    ae = build_client_module(p, shape, torch.device("cpu")).train()
    kind = p.phases.phase1.federation.loss
    return paper_costs.mfcl_client_costs(
        ae,
        costs.probe_batch(shape),
        lambda logits, x: reconstruction_loss(logits, x, kind),
        p.phases.phase1.federation.batch_pairs,
        samples,
        rounds,
        p.phases.phase1.federation.local_epochs,
        p.export.pairs,
        [c["dropped"] for c in export],
        [b + c["bytes_sent"] for b, c in zip(sent, export)],
        pre_pool_numel(ae, shape),
    )


def client_costs(ctx: StepContext) -> list[dict]:
    traffic = costs.step_traffic(ctx, "pretrain")
    export = json.loads((ctx.input("export") / "manifest.json").read_text())["per_client"]
    return _client_costs(
        ctx.exp.method, ctx.image_shape, traffic.samples, traffic.rounds, traffic.sent, export
    )


def _round_bytes(p, shape) -> int:
    """A phase-1 round of one client: the autoencoder down and up."""
    return 2 * nbytes(build_client_module(p, shape, torch.device("cpu")).state_dict())


def _projected_client_costs(p, shape, samples, rounds, sent) -> list[dict]:
    """:func:`_client_costs` with what MFCL adds to the projection of its federation: each
    client's one-shot fp16 export of rho twin pairs per sample."""
    model = build_client_module(p, shape, torch.device("cpu"))
    with torch.no_grad():
        view = model.eval().encode(torch.zeros(2, *shape))[0]
    per_sample = p.export.pairs * 2 * view.numel() * 2
    export = [{"dropped": False, "bytes_sent": n * per_sample} for n in samples]
    return _client_costs(p, shape, samples, rounds, sent, export)


# the average client at full scale (Tab. 3's setting), from phase 1's federation block
projected_costs = costs.projection(_projected_client_costs, _round_bytes)
