"""Reference rows without pretraining: the encoder at its seeded random initialisation (the
same weights a method with these settings starts from), or raw pixels (``model.arch: pixels``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from fedssl.methods.base import DATA, Hook, Method, MethodParams, Step
from fedssl.methods.registry import register
from fedssl.params import ModelParams

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


class NoneParams(MethodParams):
    name: Literal["none"] = "none"
    model: ModelParams


@register
class NoPretraining(Method):
    name = "none"
    label = ""  # reference rows are labelled by their title in the report
    params = NoneParams
    steps = (Step("pretrain", reads=("method.model", "method.seed"), inputs=(DATA,)),)
    encoder_inputs = ("pretrain",)
    encoder_reads = ("method.model",)
    encoder_builder = Hook("fedssl.models.encoders", "contrastive_encoder")

    def arch(self, params) -> str:
        return params.model.arch

    def pretrain(self, ctx: StepContext) -> None:
        """Save the seeded initial model."""
        from fedssl.models.encoders import save_contrastive_model, seeded_contrastive_model

        p = ctx.exp.method
        model = seeded_contrastive_model(p.model, ctx.image_shape, p.seed, ctx.device)
        save_contrastive_model(model, ctx.out / "model.pt", ctx.image_shape)
        ctx.info.update(rounds=0, parameters=sum(q.numel() for q in model.parameters()))

    def encoder(self, ctx: StepContext):
        from fedssl.models.encoders import load_encoder

        return load_encoder(
            ctx.exp.method.model,
            ctx.input("pretrain") / "model.pt",
            ctx.device,
            ctx.exp.features.layer == "projection",
        )
