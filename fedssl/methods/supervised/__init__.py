"""Global supervised FL, the supervised rows of MFCL's Tab. 2 (spec baselines.md §1, §6):
FedAvg, FedProx and MOON, scored by the global model's accuracy on the uniform test set.

Every client trains the network F = O∘P∘D (D: the encoder of ``model``, the same family as the
SSL rows; P: the Linear-ReLU-Linear projection head; O: the classifier on P's output, MOON's
``ModelFedCon``) from the global model with cross-entropy, and the server takes the size-weighted
FedAvg of the whole network, which travels both ways every round. The variants differ only in
the local loss:

* ``fedavg``: CE; FedProx is ``fedavg`` with ``federation.strategy: {kind: fedprox, mu:
  ...}``, CE + (μ/2)‖w − W_g‖² over the trainable weights (W_g: the round's global model), as
  any method's;
* ``moon``: CE + μ·ℓ_con, ℓ_con = −log softmax([cos(z, z_glob), cos(z, z_prev)] / τ) at the
  positive, z = P(D(x)) of the live model, z_glob of the global model, z_prev of the client's
  own model after its previous local training (kept on the client; none yet: ℓ_con = 0, the
  authors' empty model pool in round 1).

Besides the global accuracy (``global.json``, and per round in ``rounds.tsv``) the shared probes
read the global encoder D, so the rows line up with the SSL rows' linear / k-NN columns.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    PositiveFloat,
    model_validator,
)

from fedssl.methods.base import Hook, MethodParams, SupervisedFederatedMethod
from fedssl.methods.registry import register
from fedssl.params import FEDERATION_HELP, CropPadding, ModelParams, TrainsItsModel
from fedssl.strategies.choices import federation_block

LABELS = {"fedavg": "FedAvg", "moon": "MOON"}


SUPERVISED_FEDERATION = federation_block(
    strategies=("fedavg", "fedprox"),
    local_epochs=10,
    batch_size=64,
    lr=0.01,
    momentum=0.9,
    weight_decay=1e-5,
    parallel_clients="auto",
)


class SupervisedParams(MethodParams, TrainsItsModel):
    """One global supervised FL run (defaults: MOON's setup, spec §1 and §6.3)."""

    name: Literal["supervised"] = "supervised"
    federation: SUPERVISED_FEDERATION = Field(description=FEDERATION_HELP)
    variant: Literal["fedavg", "moon"]
    """local loss: fedavg = cross-entropy; moon = cross-entropy + mu x model-contrastive term"""
    model: ModelParams = Field(
        description="D and P: the encoder and projection head (proj_hidden, proj_dim); O "
        "reads P's output"
    )
    mu: NonNegativeFloat = Field(0.0, description="moon: weight of l_con")
    temperature: PositiveFloat = Field(0.5, description="moon: tau of l_con")
    augment: Literal["none", "crop_flip"] = Field(
        "none", description="crop_flip = random crop with zero padding + horizontal flip"
    )
    crop_padding: CropPadding = 4
    init: Literal["encoder", "own"] = Field(
        "encoder",
        description="the network's first weights: encoder = D from the encoder's seeded stream, "
        "the weights every self-supervised line and the untrained reference start from at this "
        "seed (the heads drawn after it); own = the network's own stream (the committed smoke "
        "and benchmark rows)",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_retired_variant(cls, data):
        if isinstance(data, dict) and data.get("variant") == "fedprox":
            raise ValueError(
                "variant: 'fedprox': retired; write variant: fedavg and federation.strategy: "
                f"{{kind: fedprox, mu: {data.get('mu', '...')}}} (the library's "
                "FedProx, which any method can choose)"
            )
        return data

    @model_validator(mode="after")
    def _fits(self):
        if self.variant == "fedavg" and self.mu:
            raise ValueError(f"mu: variant 'fedavg' has no mu (got {self.mu})")
        return self


TRAIN = "fedssl.methods.supervised.train"


@register
class Supervised(SupervisedFederatedMethod):
    name = "supervised"
    label = "Supervised FL"
    params = SupervisedParams
    package = __name__
    network = Hook(TRAIN, "build_net")
    wrapper = Hook(TRAIN, "with_references")
    loss = Hook(TRAIN, "supervised_loss")
    strategy = Hook(TRAIN, "GlobalFedAvg")
    describe = Hook(TRAIN, "describe")
    encoder_of = Hook(TRAIN, "global_encoder")

    def row_label(self, params) -> str:
        strategy = params.federation.strategy
        if params.variant == "fedavg":
            return strategy.label()  # FedAvg, or the chosen strategy with its settings
        label = f"{LABELS[params.variant]} (μ={params.mu:g})"
        return f"{label} + {strategy.label()}" if strategy.stacks else label
