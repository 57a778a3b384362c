"""FedSimCLR's `costs` stage and projection: the whole model both ways every round, in the
conventions of MFCL's Tab. 3 (where FedSimCLR is a baseline) and measured."""

from __future__ import annotations

import torch

from fedssl import costs
from fedssl.data.catalog import dataset_spec
from fedssl.fl.engine import nbytes
from fedssl.losses import nt_xent
from fedssl.methods.mfcl import paper_costs
from fedssl.models.encoders import seeded_contrastive_model


def _client_costs(p, shape, samples: list[int], rounds: list[int], sent: list[int]):
    """Per-client costs of end-to-end FedSimCLR: the whole model both ways every round."""
    model = seeded_contrastive_model(p.model, shape, p.seed, torch.device("cpu")).train()
    probe = costs.probe_batch(shape)
    return paper_costs.e2e_client_costs(
        model,
        probe.chunk(2),
        lambda z, _x: nt_xent(*z.chunk(2), p.temperature),
        p.batch_size,
        samples,
        rounds,
        p.local_epochs,
        sent,
        optimizer_slots=2 if p.optimizer == "adam" else 1,
    )


def client_costs(ctx) -> list[dict]:
    ledger = costs.ledger_of(ctx.input("pretrain"), [len(c) for c in ctx.clients()])
    return _client_costs(
        ctx.exp.method, ctx.image_shape, ledger.samples, ledger.rounds, ledger.sent
    )


def projected_costs(exp, part, dataset: str) -> dict:
    """The average client at full scale: the model state down and up in each of its rounds."""
    p, shape = exp.method, dataset_spec(dataset).shape
    n = costs.average_client_samples(part, dataset)
    rounds = round(p.client_fraction * p.rounds)
    state = seeded_contrastive_model(p.model, shape, p.seed, torch.device("cpu")).state_dict()
    rows = _client_costs(p, shape, [n], [rounds], [2 * nbytes(state) * rounds])
    return costs.summarize_client_costs(rows)
