"""Orchestra's `costs` stage and projection: bytes from the round ledger (model, target,
rotation head and centroids down; the same plus the local centroids up), FLOPs and peak memory
counted around one real local step (three views, the clustering and rotation losses)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fedssl import costs
from fedssl.fl.cohort import Batch, StepLoss, on_outputs
from fedssl.fl.state import nbytes
from fedssl.methods.orchestra.loss import orchestra_forward, orchestra_loss
from fedssl.methods.orchestra.model import MEMORY, ROTATIONS, seeded_orchestra_model

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

VIEWS = 3  # a step sees x1 (teacher), x2 (student) and the rotated x3


def _batch(views: torch.Tensor) -> Batch:
    """A local batch of the three stacked views, x3 rotated by a turn per row."""
    x1, x2, x3 = views.chunk(VIEWS)
    turns = torch.arange(len(x1)) % ROTATIONS
    return Batch((x1, x2, x3, turns), turns, torch.ones(len(x1), dtype=torch.bool))


def _client_costs(p, shape, samples: list[int], rounds: list[int], sent: list[int]):
    model = seeded_orchestra_model(p, shape, torch.device("cpu")).train()
    loss = on_outputs(orchestra_loss(p), orchestra_forward)
    step = StepLoss(model, loss, _batch)
    probe = torch.rand(
        (VIEWS * costs.PROBE_PAIRS, *shape), generator=torch.Generator().manual_seed(0)
    )
    local = costs.LocalStep(step, probe, costs.PROBE_PAIRS, lambda loss, _x: loss)
    flops, peak = costs.local_step_costs(local, p.federation)
    return [
        {
            "client": m,
            "samples": n,
            "rounds": r,
            "bytes_exchanged": b,
            # round 0 only clusters: training rounds are r - 1 for a client that took part in it
            "flops": flops * n * max(r - 1, 0),
            "peak_step_bytes": peak,
        }
        for m, (n, r, b) in enumerate(zip(samples, rounds, sent))
    ]


def client_costs(ctx: StepContext) -> list[dict]:
    return costs.traffic_costs(ctx, _client_costs)


def round_bytes(p, shape) -> tuple[int, int]:
    """(down, up) bytes of one client's round: the model state without the memory; up adds
    the local centroids (N_L × proj_dim floats)."""
    state = seeded_orchestra_model(p, shape, torch.device("cpu")).state_dict()
    down = nbytes({k: v for k, v in state.items() if k != MEMORY})
    return down, down + p.local_clusters * p.model.proj_dim * 4


# the average client at full scale, in its share of the rounds plus round 0 (every client's)
projected_costs = costs.projection(_client_costs, lambda p, shape: sum(round_bytes(p, shape)), 1)
