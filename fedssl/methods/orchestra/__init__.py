"""Orchestra (Lubana et al., ICML 2022; spec `baselines.md` §4): federated SSL by globally
consistent clustering. Clients cluster their recent target projections into equal-size local
centroids (Sinkhorn-Knopp), the server clusters those into global centroids, and clients train
a teacher-student loss on soft assignments to the global centroids plus rotation prediction."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from fedssl.methods.base import FederatedMethod, Hook, MethodParams
from fedssl.methods.registry import register
from fedssl.params import FEDERATION_HELP, AugmentParams, ModelParams, TrainsItsModel
from fedssl.strategies.choices import federation_block

# the authors' views (utils.py): A, and A' with less blur and some solarisation
ORCHESTRA_AUGMENT = AugmentParams(
    crop_scale=(0.5, 1.0), brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1, blur_p=0.5
)
ORCHESTRA_AUGMENT_PRIME = ORCHESTRA_AUGMENT.model_copy(update={"blur_p": 0.1, "solarize_p": 0.2})


ORCHESTRA_FEDERATION = federation_block(
    strategies=("fedavg", "fedprox"),
    rounds=(
        PositiveInt,
        Field(description="training rounds (a clustering-only round 0 precedes)"),
    ),
    local_epochs=10,
    batch_size=16,
    optimizer="sgd",
    lr=0.003,
    lr_schedule="constant",
    momentum=0.9,
    weight_decay=1e-4,
    parallel_clients=(
        Literal["off"],
        Field("off", description="one client at a time: BN, and the memory each one writes"),
    ),
)


class OrchestraParams(MethodParams, TrainsItsModel):
    name: Literal["orchestra"] = "orchestra"
    federation: ORCHESTRA_FEDERATION = Field(description=FEDERATION_HELP)
    model: ModelParams = Field(description="backbone; proj_hidden / proj_dim size the projector")
    temperature: PositiveFloat = Field(0.1, description="T of the cluster softmaxes")
    target_momentum: Annotated[float, Field(ge=0.0, le=1.0)] = 0.996
    """EMA rate of the target network after each local step (1: frozen)"""
    global_clusters: PositiveInt = Field(128, description="N_G")
    local_clusters: PositiveInt = Field(16, description="N_L per client")
    memory_size: PositiveInt = Field(128, description="m: target projections a client keeps")
    augment: AugmentParams = ORCHESTRA_AUGMENT
    augment_prime: AugmentParams = ORCHESTRA_AUGMENT_PRIME

    @model_validator(mode="after")
    def _consistent(self):
        if self.local_clusters > self.memory_size:
            raise ValueError(
                f"local_clusters ({self.local_clusters}) exceeds memory_size ({self.memory_size})"
            )
        return self


@register
class Orchestra(FederatedMethod):
    """On the shared runtime: its network, views, EMA target and encoder in :mod:`.model`, its
    loss in :mod:`.loss`, its memory and clustering rounds in :mod:`.strategy`, which round 0
    (a setup round) runs alone; the network is saved whole."""

    name = "orchestra"
    label = "Orchestra"
    params = OrchestraParams
    package = __name__
    encoder_reads = ("method",)
    encoder_builder = Hook(f"{__name__}.model", "encoder_module")
    recipe = Hook(f"{__name__}.train", "recipe")
    encoder_loader = Hook(f"{__name__}.model", "encoder")
