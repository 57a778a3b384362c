"""The federated BYOL family of MFCL's Tab. 2 (spec methods/baselines.md §2-3): FedBYOL, FedEMA
(Zhuang et al., ICLR 2022) and FedU (Zhuang et al., ICCV 2021).

Every client trains BYOL: an online network θ (backbone + projector) and a predictor φ regress
an EMA target ξ of θ (updated after every step, kept on the client and never sent). The online
network and the predictor travel both ways each round and the server averages them weighted by
data size. The three differ only in how a returning client starts its round from the global θ_g,
φ_g and its own previous θ_k, φ_k (the authors' EasyFL switches, spec §3.2):

=========  =========================================  ==========================================
method     online network θ                           predictor φ
=========  =========================================  ==========================================
FedBYOL    θ_g (replaced)                             φ_g
FedU       θ_g (replaced)                             φ_g if d_k < threshold else φ_k (DAPU)
FedEMA     (1-μ)·θ_g + μ·θ_k, μ = min(λ_k·d_k, 1)     the same blend
=========  =========================================  ==========================================

d_k is the divergence (mean over conv weights of the L2 distance, §2.2 step 4); FedEMA's
autoscaler sets λ_k = τ / d_k at the client's first blend, so that blend uses μ = τ.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeFloat

from fedssl.methods.base import FederatedMethod, Hook, MethodParams
from fedssl.methods.registry import register
from fedssl.params import FEDERATION_HELP, AugmentParams, ModelParams, TrainsItsModel
from fedssl.strategies.choices import federation_block

BYOL_FEDERATION = federation_block(
    local_epochs=5,
    batch_size=128,
    optimizer="sgd",
    lr=0.032,
    lr_schedule="cosine",
    momentum=0.9,
    weight_decay=5e-4,
    parallel_clients="auto",
)


class FedBYOLParams(MethodParams, TrainsItsModel):
    """BYOL on every client (EasyFL's defaults where the smoke scale allows: SGD, cosine over
    rounds, target EMA 0.99 per step). ``model.proj_hidden`` / ``proj_dim`` size both the
    projector and the predictor (Linear-BN-ReLU-Linear, spec §2.3: 4096 / 2048)."""

    name: Literal["fedbyol"] = "fedbyol"
    federation: BYOL_FEDERATION = Field(description=FEDERATION_HELP)
    model: ModelParams
    target_ema: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(
        0.99, description="the target's EMA decay after every optimizer step"
    )
    augment: AugmentParams = AugmentParams()


class FedEMAParams(FedBYOLParams):
    name: Literal["fedema"] = "fedema"  # type: ignore[assignment]
    tau: NonNegativeFloat = Field(
        0.7, description="autoscaler target: a client's first EMA decay (0 = FedBYOL)"
    )
    divergence: Literal["local_progress", "global_vs_local"] = Field(
        "local_progress",
        description="d_k: how far the client moved in its last local training (the authors' "
        "code) or the new global model's distance from its previous local one (the paper)",
    )


class FedUParams(FedBYOLParams):
    name: Literal["fedu"] = "fedu"  # type: ignore[assignment]
    dapu_threshold: NonNegativeFloat = Field(
        0.4,
        description="DAPU: a returning client takes the global predictor when its last "
        "divergence is below this (absolute units; .inf = always, i.e. FedBYOL)",
    )


class _FederatedBYOL(FederatedMethod):
    """What the family shares: BYOL on every client (the target follows the online encoder
    after every step), the family member's strategy on the server, the probes on the global
    online backbone, client costs from the exchanged tensors."""

    package = __name__
    encoder_builder = Hook("fedssl.methods.fedbyol.model", "byol_encoder")
    recipe = Hook("fedssl.methods.fedbyol.train", "recipe")
    encoder_loader = Hook("fedssl.methods.fedbyol.model", "load_online_encoder")


@register
class FedBYOL(_FederatedBYOL):
    name = "fedbyol"
    label = "FedBYOL"
    params = FedBYOLParams


@register
class FedEMA(_FederatedBYOL):
    name = "fedema"
    label = "FedEMA"
    params = FedEMAParams


@register
class FedU(_FederatedBYOL):
    name = "fedu"
    label = "FedU"
    params = FedUParams
