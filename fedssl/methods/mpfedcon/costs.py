"""The ``costs`` stage of MpFedcon and its baselines: bytes from the run's ledger; FLOPs
counted around one real step of each of the variant's local phases (its own loss, only the
phase's parameters trainable), per sample × the phase's epochs × the party's samples × the
rounds it took part in. So MpFedcon's anchor forward and contrastive term, the head-then-body
schedule, Ditto's second model, APFL's mixture, Per-FedAvg's meta-gradient and SCAFFOLD's
correction are all in what a party pays. Memory: the largest phase's step (saved
activations at the real batch size + every weight the party holds + gradients and SGD
momentum of the trained ones; Per-FedAvg's meta-step runs under torch.func, which saved-tensor
hooks cannot observe, so its activations are those of a plain CE step on the same batch, a
lower bound). Evaluation and FedAvg+FT's closing fine-tune are not counted."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from fedssl import costs
from fedssl.fl.cohort import Batch
from fedssl.methods.mpfedcon.run import local_phases, make_strategy, num_classes_of, seeded_model
from fedssl.methods.mpfedcon.train import ce_loss
from fedssl.rounds.recipe import Local
from fedssl.strategies.base import first_start

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

PROBE_PAIRS = 6  # 12 probe rows: Per-FedAvg's meta-step slices its batch in 2 or 3


class PhaseStep(nn.Module):
    """One local step of a phase as a module the cost counters run: its loss on a labelled
    batch, the phase's parameters trainable and every other weight frozen."""

    def __init__(
        self, model: nn.Module, phase: Local | None, labels, loss_fn=None, trained=None, extra=None
    ):
        super().__init__()
        self.model, self.labels, self.extra = model, labels, extra or {}
        self.loss_fn = loss_fn
        self.trained = trained if trained is not None else phase.trainable(None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The loss on ``x``; ``extra``: what the strategy adds to a client's start (FedProx's
        anchors), beside the model's own buffers."""
        m = self.model
        params = {k: v if k in self.trained else v.detach() for k, v in m.named_parameters()}
        batch = Batch((x,), self.labels, torch.ones(len(x), dtype=torch.bool))
        return self.loss_fn(m, params, {**dict(m.named_buffers()), **self.extra}, batch)


def activation_bytes(step: PhaseStep, x: torch.Tensor) -> float:
    """The tensors autograd saves in one step on ``x``; for a loss built on torch.func
    transforms (Per-FedAvg), those of a plain CE step instead (see the module's note)."""
    scalar = lambda loss, _x: loss  # noqa: E731 - the step already returns the loss
    try:
        return costs.saved_activation_bytes(step, x, scalar)
    except RuntimeError:  # torch.func does not support saved-tensor hooks
        step = PhaseStep(step.model, None, step.labels, ce_loss(), step.trained)
        return costs.saved_activation_bytes(step, x, scalar)


def phase_costs(p, shape, classes: int) -> list[dict]:
    """Per phase: FLOPs per sample of one step, its epochs and its step memory in bytes."""
    model = seeded_model(p, shape, classes, torch.device("cpu"))
    if hasattr(model, "has_centre"):
        model.has_centre.fill_(1.0)  # after the first round every class has a centre
    strategy = make_strategy(p, model, tests=None)
    phases = local_phases(p, model, strategy)
    losses = [phase.objective_under(strategy, model) for phase in phases]  # before the start
    own = model.state_dict()
    extra = {k: v for k, v in first_start(strategy, model).items() if k not in own}
    x = costs.probe_batch(shape, PROBE_PAIRS)
    slots = costs.optimizer_slots(p.federation)
    held = costs.tensor_bytes(model.parameters())
    out = []
    for phase, loss in zip(phases, losses):
        step = PhaseStep(model, phase, torch.arange(len(x)) % classes, loss, extra=extra)
        scalar = lambda loss, _x: loss  # noqa: E731 - the step already returns the loss
        trained = costs.tensor_bytes(v for k, v in model.named_parameters() if k in step.trained)
        acts = activation_bytes(step, x) * phase.batch_size / len(x)
        out.append(
            {
                "flops_per_sample": costs.train_step_flops(step, x, scalar) / len(x),
                "epochs": phase.local_epochs,
                "step_bytes": int(acts + held + trained * (1 + slots)),
            }
        )
    return out


def client_costs(ctx: StepContext) -> list[dict]:
    p = ctx.exp.method
    phases = phase_costs(p, ctx.image_shape, num_classes_of(ctx))
    per_sample_round = sum(ph["flops_per_sample"] * ph["epochs"] for ph in phases)
    peak = max(ph["step_bytes"] for ph in phases)
    ledger = costs.step_traffic(ctx, "train")
    return costs.client_rows(ledger, per_sample_round, peak)
