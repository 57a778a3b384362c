"""FedSimCLR: SimCLR (two augmented views, NT-Xent, projection head) trained on every client and
averaged with FedAvg (the MFCL paper's baseline)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from fedssl.methods.base import MethodParams, PretrainStepMethod
from fedssl.methods.registry import register
from fedssl.params import (
    PARALLEL_CLIENTS_HELP,
    AugmentParams,
    FederationSettings,
    ModelParams,
    ParallelClients,
    TrainsItsModel,
)
from fedssl.strategies.params import FedAvgChoice, StrategyChoice


class FedSimCLRParams(MethodParams, FederationSettings, TrainsItsModel):
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
    strategy: StrategyChoice = Field(
        FedAvgChoice(), description="how the server aggregates (fedavg, or fedprox with its mu)"
    )


@register
class FedSimCLR(PretrainStepMethod):
    name = "fedsimclr"
    label = "FedSimCLR"
    params = FedSimCLRParams
    package = __name__
    flower_steps = {"pretrain": "fedssl.methods.fedsimclr.run:federation"}
    encoder_builder = "fedssl.models.encoders:contrastive_encoder"
