"""MFCL's `costs` stage and projection: phase-1 training and traffic plus the one-shot export
per client, in the paper's conventions (:mod:`fedssl.methods.mfcl.paper_costs`) and measured."""

from __future__ import annotations

import json

import torch

from fedssl import costs
from fedssl.data.catalog import dataset_spec
from fedssl.fl.state import nbytes
from fedssl.methods.mfcl import paper_costs
from fedssl.methods.mfcl.run import build_client_module, pre_pool_numel
from fedssl.models.autoencoder import reconstruction_loss


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


def client_costs(ctx) -> list[dict]:
    traffic = costs.step_traffic(ctx, "pretrain")
    export = json.loads((ctx.input("export") / "manifest.json").read_text())["per_client"]
    return _client_costs(
        ctx.exp.method, ctx.image_shape, traffic.samples, traffic.rounds, traffic.sent, export
    )


def projected_costs(exp, part, dataset: str) -> dict:
    """The average client at full scale (Tab. 3's setting): the autoencoder down and up in each
    of its rounds and the fp16 export of rho twin pairs per sample."""
    p, shape = exp.method, dataset_spec(dataset).shape
    n = costs.average_client_samples(part, dataset)
    model = build_client_module(p, shape, torch.device("cpu"))
    with torch.no_grad():
        view = model.eval().encode(torch.zeros(2, *shape))[0]
    rounds = round(p.phases.phase1.federation.client_fraction * p.phases.phase1.federation.rounds)
    sent = 2 * nbytes(model.state_dict()) * rounds
    export = [{"dropped": False, "bytes_sent": n * p.export.pairs * 2 * view.numel() * 2}]
    return costs.summarize_client_costs(_client_costs(p, shape, [n], [rounds], [sent], export))
