"""FedSimCLR: SimCLR (two augmented views, NT-Xent, projection head) trained on every client and
averaged with FedAvg (the MFCL paper's baseline)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat

from fedssl.methods.base import FederatedMethod, Hook, MethodParams
from fedssl.methods.registry import register
from fedssl.params import FEDERATION_HELP, AugmentParams, ModelParams, TrainsItsModel
from fedssl.strategies.choices import federation_block

SIMCLR_FEDERATION = federation_block(
    local_epochs=1,
    batch_size=256,
    optimizer="adam",
    lr=1e-3,
    lr_schedule="constant",
    momentum=0.9,
    weight_decay=0.0,
    parallel_clients="auto",
)


class FedSimCLRParams(MethodParams, TrainsItsModel):
    name: Literal["fedsimclr"] = "fedsimclr"
    federation: SIMCLR_FEDERATION = Field(description=FEDERATION_HELP)
    model: ModelParams
    temperature: PositiveFloat = 0.5
    """tau of the NT-Xent loss"""
    augment: AugmentParams = AugmentParams()


@register
class FedSimCLR(FederatedMethod):
    name = "fedsimclr"
    label = "FedSimCLR"
    params = FedSimCLRParams
    package = __name__
    encoder_builder = Hook("fedssl.models.encoders", "contrastive_encoder")
    recipe = Hook("fedssl.methods.fedsimclr.train", "recipe")
    costs_module = "fedssl.costs.end_to_end"  # the whole model both ways, in MFCL's Tab. 3 terms
