"""FSL: federated split learning with locally generated losses (Han, Bhatti, Lee, Moon, ICML 2021
FL workshop; spec baselines.md §7), the split-learning row of MFCL's Tab. 2, supervised.

The network is cut after ``cut`` units of the encoder: the client part w_c, with a small
auxiliary head a_c (global average pool + Linear) on the cut layer, and the server part w_s (the
remaining units and the classifier). Per batch, a client updates w_c and a_c on its local loss
CE(a_c(s), y), s = w_c(x), and sends (s, y) to the server, which updates w_s on CE(w_s(s), y):
no gradient travels back, so both sides step in parallel on the same s. Choices where the paper
is silent ([U] in the spec): one server copy per client, averaged each round with the client
parts (SplitFed-v1 style; the copies stay on the server), the auxiliary head averaged too, every
batch sent (h = 1). Scored by the global model w_s∘w̄_c on the uniform test split; the shared
probes read the encoder part (w_c then w_s without its classifier).
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    PositiveInt,
    model_validator,
)

from fedssl.methods.base import Hook, MethodParams, SupervisedFederatedMethod
from fedssl.methods.registry import register
from fedssl.params import FEDERATION_HELP, CropPadding, ModelParams
from fedssl.strategies.choices import federation_block

# Units of each encoder a cut may leave on the client (a conv block, a residual block, ...);
# the server keeps at least one.
CUTTABLE_UNITS = {"small_cnn": 4, "resnet18": 9}


FSL_FEDERATION = federation_block(
    strategies=("fedavg",),
    local_epochs=1,
    batch_size=64,
    lr=0.01,
    momentum=0.9,
    weight_decay=0.0,
    parallel_clients="auto",
)


class FSLParams(MethodParams):
    name: Literal["fsl"] = "fsl"
    federation: FSL_FEDERATION = Field(description=FEDERATION_HELP)
    model: ModelParams = Field(description="the encoder (its projection fields are not used)")
    cut: PositiveInt = Field(2, description="encoder units on the client (w_c)")
    augment: Literal["none", "crop_flip"] = Field(
        "none", description="crop_flip = random crop with zero padding + horizontal flip"
    )
    crop_padding: CropPadding = 4

    @model_validator(mode="after")
    def _cut(self):
        units = CUTTABLE_UNITS.get(self.model.arch)
        if units is None:
            raise ValueError(f"model.arch '{self.model.arch}' cannot be split")
        if self.cut >= units:
            raise ValueError(
                f"cut: {self.cut} leaves the server nothing ({self.model.arch} has {units} units)"
            )
        return self


TRAIN = "fedssl.methods.fsl.train"


@register
class FSL(SupervisedFederatedMethod):
    name = "fsl"
    label = "FSL"
    params = FSLParams
    package = __name__
    network = Hook(TRAIN, "SplitClassifier")
    loss = Hook(TRAIN, "fsl_loss")
    strategy = Hook(TRAIN, "FSLTraffic")
    describe = Hook(TRAIN, "describe")
    encoder_of = Hook(TRAIN, "global_encoder")
    encoder_reads = ("method.model", "method.cut")

    def arch(self, params) -> str:
        return f"{params.model.arch}/cut{params.cut}"
