"""The ``costs`` stage of global supervised FL: bytes from the run's ledger (the whole network
down and up every round), FLOPs counted around one real local step of the variant's loss
(MOON's two reference forwards included), and a step's memory measured the same way."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from fedssl import costs
from fedssl.eval.global_model import load_saved
from fedssl.fl.cohort import Batch, StepLoss
from fedssl.methods.federated_supervised import build_model, trainer_loss
from fedssl.strategies.fedprox import proximal
from fedssl.strategies.references import reference_pairs

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


def references_held(p) -> int:
    """Frozen model copies a step reads: MOON's two, FedProx's round-start anchor."""
    return 2 * (p.variant == "moon") + (p.federation.strategy.kind == "fedprox")


def step_loss(p, model: nn.Module):
    """The variant's loss, with FedProx's term (towards the round-start copy) if chosen."""
    loss = trainer_loss(p)
    if p.federation.strategy.kind == "fedprox":
        loss = proximal(loss, p.federation.strategy.mu, reference_pairs(model))
    return loss


def step_costs(p, shape, classes: int) -> dict:
    """FLOPs per sample of a local step and its memory at the federation's batch size: saved
    activations + the live network's weights, gradients and SGD momentum + the frozen
    references the variant reads."""
    model = build_model(p, shape, classes, torch.device("cpu"))
    model.has_prev.fill_(1.0)  # MOON after its first round: both references in the step
    x = costs.probe_batch(shape)
    labels = torch.arange(len(x)) % classes
    step = StepLoss(
        model,
        step_loss(p, model),
        lambda x: Batch((x,), labels, torch.ones(len(x), dtype=torch.bool)),
    )
    scalar = lambda out, _x: out  # noqa: E731 - the step already returns the loss
    flops = costs.train_step_flops(step, x, scalar) / len(x)
    acts = costs.saved_activation_bytes(step, x, scalar) * p.federation.batch_size / len(x)
    net = costs.tensor_bytes(model.net.parameters())
    return {
        "flops_per_sample": flops,
        "peak_step_bytes": int(acts + net * (3 + references_held(p))),
    }


def client_costs(ctx: StepContext) -> list[dict]:
    p = ctx.exp.method
    saved = load_saved(ctx, "cpu")
    ledger = costs.step_traffic(ctx, "train")
    step = step_costs(p, ctx.image_shape, saved["classes"])
    per_sample_round = step["flops_per_sample"] * p.federation.local_epochs
    return costs.client_rows(ledger, per_sample_round, step["peak_step_bytes"])
