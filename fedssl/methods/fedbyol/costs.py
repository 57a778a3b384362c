"""The family's `costs` stage and projection: bytes from the ledger of the exchanged tensors
(online network and predictor both ways; the target never travels), FLOPs counted around one
real BYOL step, and that step's memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fedssl import costs
from fedssl.fl.state import nbytes
from fedssl.losses import byol_loss
from fedssl.methods.fedbyol.model import seeded_byol
from fedssl.strategies.byol import TARGET

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


def _loss(output, _inputs):
    p, t = output
    return byol_loss(*p.chunk(2), *t.chunk(2))


def _client_costs(p, shape, samples: list[int], rounds: list[int], sent: list[int]):
    model = seeded_byol(p.model, shape, p.seed, torch.device("cpu")).train()
    probe = costs.probe_batch(shape)  # both views of PROBE_PAIRS images
    local = costs.LocalStep(model, probe, costs.PROBE_PAIRS, _loss)
    # gradients and optimizer state of the online network only (the target is an EMA)
    flops, peak = costs.local_step_costs(local, p.federation, trained_only=True)
    return costs.client_rows(costs.ClientTraffic(samples, rounds, sent), flops, peak)


def client_costs(ctx: StepContext) -> list[dict]:
    return costs.traffic_costs(ctx, _client_costs)


def payload_bytes(p, shape) -> int:
    """One direction of one round for one client: the online network and predictor (with
    their BN buffers), spec §2.5 / §3.5's algorithmic payload."""
    state = seeded_byol(p.model, shape, p.seed, torch.device("cpu")).state_dict()
    return nbytes({k: v for k, v in state.items() if not k.startswith(TARGET)})


# the average client at full scale: the payload down and up in each of its rounds
projected_costs = costs.projection(_client_costs, lambda p, shape: 2 * payload_bytes(p, shape))
