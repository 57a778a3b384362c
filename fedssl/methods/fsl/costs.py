"""FSL's ``costs`` stage: per client, the bytes of its ledger, FLOPs of its own step (client
part + auxiliary head, counted around a real step; the server's work is not the client's) and
that step's memory (saved activations + weights, gradients, SGD momentum)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedssl import costs
from fedssl.methods.federated_supervised import load_network


def client_costs(ctx) -> list[dict]:
    p, model = ctx.exp.method, load_network(ctx, "cpu")
    local = nn.Sequential(model.client, model.aux).train()
    x = costs.probe_batch(ctx.image_shape)
    y = torch.arange(len(x)) % model.aux[-1].out_features
    loss = lambda out, _x: F.cross_entropy(out, y)  # noqa: E731
    flops = costs.train_step_flops(local, x, loss) / len(x)
    acts = costs.saved_activation_bytes(local, x, loss) * p.federation.batch_size / len(x)
    peak = int(acts + 3 * costs.tensor_bytes(local.parameters()))
    ledger = costs.step_traffic(ctx, "train")
    return costs.client_rows(ledger, flops * p.federation.local_epochs, peak)
