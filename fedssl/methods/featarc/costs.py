"""FeatARC's `costs` stage: bytes from the round ledger (all C cluster models down, one model
up), FLOPs of one measured local step (two views through the network, NT-Xent and the
alignment target's forward) plus the round's scoring (C + 1 backbone passes over the client's
data), and the step's peak memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fedssl import costs
from fedssl.fl.cohort import Batch, StepLoss, on_outputs
from fedssl.fl.state import nbytes
from fedssl.methods.featarc.model import FeatARCModel, featarc_forward, featarc_loss
from fedssl.models.encoders import seeded_contrastive_model

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


def _batch(images: torch.Tensor) -> Batch:
    """A local batch of the stacked (view 1, view 2, raw) images."""
    v1, v2, raw = images.chunk(3)
    valid = torch.ones(len(v1), dtype=torch.bool)
    return Batch((v1, v2, raw), valid, valid)


def _client_costs(p, shape, samples: list[int], rounds: list[int], sent: list[int]):
    net = seeded_contrastive_model(p.model, shape, p.seed, torch.device("cpu")).train()
    loss = on_outputs(featarc_loss(p), featarc_forward)
    step = StepLoss(FeatARCModel(net), loss, _batch)
    k = costs.PROBE_PAIRS
    probe = torch.rand((3 * k, *shape), generator=torch.Generator().manual_seed(0))
    scoring = costs.forward_flops(net.backbone.eval(), probe[:k]) / k * (p.clusters + 1)
    # the step is measured after the scoring, its backbone left in eval mode (the committed
    # peak's convention: in train mode BN would add 36,864 bytes at a batch of 256)
    local = costs.LocalStep(step, probe, k, lambda loss, _x: loss)
    flops, peak = costs.local_step_costs(local, p.federation)
    traffic = costs.ClientTraffic(samples, rounds, sent)
    return costs.client_rows(traffic, flops + scoring, peak)


def client_costs(ctx: StepContext) -> list[dict]:
    return costs.traffic_costs(ctx, _client_costs)


def round_bytes(p, shape) -> int:
    """One client's round: the C cluster models down and one model up."""
    state = seeded_contrastive_model(p.model, shape, p.seed, torch.device("cpu")).state_dict()
    return (p.clusters + 1) * nbytes(state)


projected_costs = costs.projection(_client_costs, round_bytes)
