"""A toy method plugin: a linear autoencoder trained with FedAvg. The test copies this one file
into a project's fedssl/methods/ to show that a method needs no other file: params, step,
training, encoder and report label all live here."""

from __future__ import annotations

from typing import Literal

from pydantic import PositiveInt

from fedssl.methods.base import Hook, Method, MethodParams, Step
from fedssl.methods.registry import register


class ToyParams(MethodParams):
    name: Literal["toy"] = "toy"
    dim: PositiveInt = 8
    rounds: PositiveInt = 2
    lr: float = 0.01


def build(p, shape):
    import torch
    from torch import nn

    torch.manual_seed(p.seed)
    pixels = shape[0] * shape[1] * shape[2]
    return nn.Sequential(nn.Flatten(), nn.Linear(pixels, p.dim), nn.Linear(p.dim, pixels))


def reconstruction(model, params, buffers, batch):
    from torch.func import functional_call

    x = batch.views[0].flatten(1)
    err = ((functional_call(model, (params, buffers), (batch.views[0],)) - x) ** 2).mean(1)
    return (err * batch.valid).sum() / batch.valid.sum()


@register
class Toy(Method):
    name = "toy"
    label = "Toy AE"
    params = ToyParams
    steps = (Step("fit", reads=("partition", "method"), plots=("rounds.tsv",)),)
    encoder_inputs = ("fit",)
    encoder_builder = Hook(__name__, "untrained_encoder")  # what `fedssl export` loads into

    def arch(self, params) -> str:
        return f"linear-{params.dim}"

    def fit(self, ctx) -> None:
        import torch

        from fedssl.data.augment import to_float
        from fedssl.fl.cohort import CohortTrainer, OptimizerConfig
        from fedssl.fl.state import FederationConfig
        from fedssl.rounds.loop import Federation, LocalTraining
        from fedssl.rounds.runner import run_federation, train_data
        from fedssl.strategies.base import Strategy

        p = ctx.exp.method
        model = build(p, ctx.image_shape).to(ctx.device)
        cohort = CohortTrainer(
            model,
            lambda b, g: (to_float(b),),
            reconstruction,
            OptimizerConfig("adam"),
            batch_size=32,
            local_epochs=1,
        )
        cfg = FederationConfig(rounds=p.rounds, client_fraction=1.0, lr=p.lr, seed=p.seed)
        fed = Federation(
            Strategy(cfg),
            LocalTraining(cohort),
            train_data(ctx),
            cfg,
            ctx.resume_path,
            ctx.fingerprint,
        )
        run_federation(ctx, fed, model)
        torch.save(model.state_dict(), ctx.out / "model.pt")
        ctx.info["parameters"] = sum(q.numel() for q in model.parameters())

    def encoder(self, ctx):
        import torch

        model = build(ctx.exp.method, ctx.image_shape).to(ctx.device)
        model.load_state_dict(torch.load(ctx.input("fit") / "model.pt", weights_only=True))
        return encoder_of(model)


def encoder_of(model):
    """The frozen encoder of the autoencoder: its flatten and first linear layer."""
    from fedssl.models.encoders import frozen

    return frozen(model[:2])


def untrained_encoder(p, image_shape, projection: bool = False):
    """The encoder the ``encoder`` hook returns, untrained (its exported weights load into
    it); the autoencoder has no projection head."""
    return encoder_of(build(p, image_shape))
