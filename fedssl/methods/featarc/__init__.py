"""FeatARC (Wang et al., ICLR 2023; spec `baselines.md` §5): decentralised SimCLR with C
cluster models. Every round each client joins the cluster whose model's features on its data
align best with those of its own last model, trains SimCLR from that cluster's model with a
feature-alignment term toward it, and each cluster model becomes the uniform mean of its
members' uploads."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from fedssl.methods.base import FederatedMethod, Hook, MethodParams
from fedssl.methods.registry import register
from fedssl.params import FEDERATION_HELP, AugmentParams, ModelParams, TrainsItsModel
from fedssl.strategies.choices import federation_block

FEATARC_FEDERATION = federation_block(
    strategies=("fedavg", "fedprox"),
    local_epochs=5,
    batch_size=256,
    optimizer="adam",
    lr=1e-3,
    lr_schedule="constant",
    momentum=0.9,
    weight_decay=1e-6,
    parallel_clients=(
        Literal["off"],
        Field("off", description="one client at a time: the frozen anchor runs in eval mode"),
    ),
)


class FeatARCParams(MethodParams, TrainsItsModel):
    name: Literal["featarc"] = "featarc"
    federation: FEATARC_FEDERATION = Field(description=FEDERATION_HELP)
    model: ModelParams
    temperature: PositiveFloat = 0.5
    """tau of the NT-Xent loss"""
    clusters: PositiveInt = Field(2, description="C: cluster models kept by the server")
    align_scale: NonNegativeFloat = Field(1.0, description="s: weight of the alignment term")
    align_space: Literal["proj_to_backbone", "backbone_to_backbone"] = Field(
        "proj_to_backbone",
        description="what is pulled toward the cluster model's backbone feature: the projection "
        "(the authors' code; needs proj_dim = the backbone's width) or the backbone feature",
    )
    weighting: Literal["uniform", "size"] = Field(
        "uniform", description="a cluster model is the uniform (authors) or size-weighted mean"
    )
    augment: AugmentParams = AugmentParams()


@register
class FeatARC(FederatedMethod):
    """SimCLR plus alignment on the shared runtime; its model, views, loss and clustering in
    :mod:`.model` and :mod:`.strategy`; the probes read the evaluated cluster's network."""

    name = "featarc"
    label = "FeatARC"
    params = FeatARCParams
    package = __name__
    encoder_builder = Hook("fedssl.models.encoders", "contrastive_encoder")
    recipe = Hook(f"{__name__}.train", "recipe")
    # its server assigns every client a cluster from the client's data: no Flower split
    flower_steps = {}
