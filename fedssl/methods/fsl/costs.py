"""FSL's ``costs`` stage: per client, the bytes of its ledger, FLOPs of its own step (client
part + auxiliary head, counted around a real step; the server's work is not the client's) and
that step's memory (saved activations + weights, gradients, SGD momentum)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from fedssl import costs
from fedssl.methods.federated_supervised import load_network

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


def client_costs(ctx: StepContext) -> list[dict]:
    p, model = ctx.exp.method, load_network(ctx, "cpu")
    local = nn.Sequential(model.client, model.aux).train()
    x = costs.probe_batch(ctx.image_shape)
    y = torch.arange(len(x)) % model.aux[-1].out_features
    loss = lambda out, _x: F.cross_entropy(out, y)  # noqa: E731
    flops, peak = costs.local_step_costs(costs.LocalStep(local, x, len(x), loss), p.federation)
    return costs.client_rows(costs.step_traffic(ctx, "train"), flops, peak)
