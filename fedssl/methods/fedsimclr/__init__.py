"""FedSimCLR: SimCLR (two augmented views, NT-Xent, projection head) trained on every client and
averaged with FedAvg (the MFCL paper's baseline)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from fedssl.methods.base import MethodParams, PretrainStepMethod
from fedssl.methods.registry import register
from fedssl.params import (
    PARALLEL_CLIENTS_HELP,
    AugmentParams,
    FederationSettings,
    ModelParams,
    ParallelClients,
)


class FedSimCLRParams(MethodParams, FederationSettings):
    name: Literal["fedsimclr"] = "fedsimclr"
    model: ModelParams
    local_epochs: PositiveInt = 1
    batch_size: PositiveInt = 256
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: PositiveFloat = 1e-3
    lr_schedule: Literal["constant", "cosine"] = "constant"
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    weight_decay: NonNegativeFloat = 0.0
    temperature: PositiveFloat = 0.5
    augment: AugmentParams = AugmentParams()
    parallel_clients: ParallelClients = Field("auto", description=PARALLEL_CLIENTS_HELP)

    @model_validator(mode="after")
    def _has_weights(self):
        if self.model.arch == "pixels":
            raise ValueError("model.arch 'pixels' has no weights to train: use method 'none'")
        return self


@register
class FedSimCLR(PretrainStepMethod):
    name = "fedsimclr"
    label = "FedSimCLR"
    params = FedSimCLRParams
    package = __name__
    flower_steps = {"pretrain": "fedssl.methods.fedsimclr.run:federation"}
    encoder_builder = "fedssl.models.encoders:contrastive_encoder"
