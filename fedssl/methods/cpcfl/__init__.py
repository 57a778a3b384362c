"""CP-CFL: contrastive pre-training on the server, then clustered FL with a model pool
(Tun, Nguyen, Thwal, Choi, Hong; spec methods/cp-cfl.md).

Step ``pretrain`` (server only, no clients): SimCLR, BYOL or SimSiam on a public unlabelled
set (a slice of the training split that the partition holds out, or another split such as
STL-10's unlabelled one); one encoder per projector-width candidate, the best one picked by a
linear probe on a labelled proxy set. Step ``cfl``: a pool of N models that share that encoder
and have their own random heads; every round each client downloads the whole pool, takes a
random model with the encoder frozen for the first T_c rounds and afterwards the one with the
lowest loss on its own training data, trains it and sends it back; the server averages each
model over the clients that chose it. The shared ``personal`` stage scores every client's
cluster model on its own test split each round, and how well the choices recover the true
groups.

The paper's baselines are settings of the same method (one Method, one code path):
FedAvg = ``federation.clusters: 1``; IFCA (None) = ``pretrain: none`` (N fully random models,
``federation.explore_rounds: 0``, restarts on clustering failure); IFCA (FedAvg) = ``pretrain:
fedavg`` (the encoder of a FedAvg (None) run on the same clients, recomputed in this step).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from fedssl.methods.base import DATA, PARTITION, Hook, Method, MethodParams, Step
from fedssl.methods.registry import register
from fedssl.params import (
    PARALLEL_CLIENTS_HELP,
    AugmentParams,
    LinearProbeParams,
    ParallelClients,
    Strict,
)
from fedssl.strategies.choices import federation_block

SSL_KINDS = ("simclr", "byol", "simsiam")
PRETRAIN_LABELS = {
    "none": "None",
    "simclr": "SimCLR",
    "byol": "BYOL",
    "simsiam": "SimSiam",
    "fedavg": "FedAvg",
}
# The paper's projector widths (§4.1): SimCLR Dense256-ReLU-Dense256, BYOL / SimSiam 512.
PAPER_PROJ_WIDTH = {"simclr": 256, "byol": 512, "simsiam": 512}


class CpcflEncoderParams(Strict):
    """The encoder θ_f every pool model shares (or, without pretraining, each has its own)."""

    arch: Literal["cnn4", "resnet18"] = Field(
        "cnn4",
        description="cnn4 = the paper's 4-conv CNN (§4.1); resnet18 = §4.10 (3x3 stem, "
        "no max-pool, output 8 x width)",
    )
    padding: Literal["valid", "same"] = Field(
        "valid", description="cnn4's padding (spec §8.1: valid; needs inputs of >= 31 px)"
    )
    input_size: PositiveInt | None = Field(
        None,
        description="bilinear resize of every input to this side first (spec §4: 96 for "
        "CIFAR/MNIST at paper scale; 32 for 28 px Fashion-MNIST at smoke scale); None = as is",
    )
    channels: tuple[PositiveInt, ...] = Field(
        (64, 128, 192, 256), description="cnn4's conv widths (the paper's; narrower for tests)"
    )
    feature_dim: PositiveInt = Field(256, description="cnn4's Dense layer (h in R^256)")
    width: PositiveInt = Field(64, description="resnet18: channels of the first stage")
    norm: Literal["bn", "gn"] = Field("bn", description="resnet18's normalisation")
    channels_per_group: PositiveInt = 16
    """resnet18 with gn: channels per GroupNorm group"""


class PublicData(Strict):
    """The server's unlabelled pretraining set."""

    split: Literal["train", "unlabeled"] = Field(
        "train",
        description="train = a class-stratified slice of the training split (the "
        "partition must hold exactly this slice out: server_holdout = size, "
        "server_holdout_seed = seed); unlabeled = a split of its own (STL-10's 100k)",
    )
    size: PositiveInt | None = Field(None, description="images; None = the whole split")
    seed: int = Field(1, description="seed of the stratified slice")

    @model_validator(mode="after")
    def _train_slice_is_sized(self):
        if self.split == "train" and self.size is None:
            raise ValueError(
                "a public slice of the training split needs a `size` (the "
                "partition's server_holdout)"
            )
        return self


class LinearEvalParams(Strict):
    """Selection of the pretrained encoder (§4.1): a linear probe on a labelled proxy set."""

    proxy: Literal["public", "train"] = Field(
        "public",
        description="probe training labels: public = the labels of the public slice "
        "(used for selection only), train = the labelled training split (STL-10 train)",
    )
    train_size: PositiveInt | None = Field(None, description="class-stratified subset; None = all")
    test_size: PositiveInt | None = Field(None, description="of the test split; None = all")
    probe: LinearProbeParams = Field(
        LinearProbeParams(epochs=100, lr=1e-3, batch_size=256),
        description="spec §8.11: Adam 1e-3, 100 epochs, batch size 256",
    )


class SSLParams(Strict):
    """Server-side contrastive pretraining (Alg. 1; §4.1)."""

    public: PublicData
    epochs: PositiveInt = Field(300, description="E_p")
    batch_size: PositiveInt = 500
    """images per pretraining step (capped at the public set's size)"""
    lr: PositiveFloat = Field(1e-3, description="Adam, constant")
    temperature: PositiveFloat = Field(0.1, description="SimCLR's tau")
    ema: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(0.9, description="BYOL's beta")
    proj_widths: tuple[PositiveInt, ...] | None = Field(
        None,
        description="projector widths to pretrain and choose from by linear evaluation "
        "(the paper tunes 256 and 512); None = the paper's width for the loss (SimCLR 256, "
        "BYOL / SimSiam 512)",
    )
    predictor_hidden: PositiveInt = Field(64, description="BYOL / SimSiam predictor bottleneck")
    augment: AugmentParams = AugmentParams(crop_scale=(0.08, 1.0))
    linear_eval: LinearEvalParams = LinearEvalParams()
    seed: int = 0
    """the pretraining's seed: initial weights, image order and views"""

    @model_validator(mode="after")
    def _proxy_has_labels(self):
        if self.public.split == "unlabeled" and self.linear_eval.proxy == "public":
            raise ValueError(
                "an unlabelled public split has no labels for the linear probe: "
                "set linear_eval.proxy: train"
            )
        return self


CFL_FEDERATION = federation_block(
    strategies=("fedavg",),
    rounds=(PositiveInt, Field(description="T")),
    local_epochs=Field(3, description="E_l"),
    batch_size=32,
    lr=1e-3,
)


class CflParams(CFL_FEDERATION):
    """Clustered FL with a pool of models (Alg. 2)."""

    clusters: PositiveInt = Field(3, description="N (1 = FedAvg)")
    explore_rounds: NonNegativeInt = Field(
        10, description="T_c: random model choice with the encoder frozen (0 = IFCA)"
    )
    encoder_epochs: NonNegativeInt | None = Field(
        None,
        description="E_l,f (Tab. 7): the encoder trains in the first E_l,f local epochs, "
        "the head in all; None = all",
    )
    adam_eps: PositiveFloat = Field(1e-8, description="1e-7 would match Keras (spec §8.14)")
    head: Literal["c", "c-1", "c-2", "c-3"] = Field(
        "c", description="theta_c (one Dense) or with 1-3 hidden ReLU layers (spec §2)"
    )
    global_encoder: bool = Field(
        False,
        description="Tab. 7: average the encoder over all clients (one for every "
        "cluster); heads stay per cluster",
    )
    restarts: NonNegativeInt = Field(
        0,
        description="IFCA's clustering-failure rule (spec §8.8): restart from new random "
        "models at most this often",
    )
    patience: PositiveInt = Field(
        5,
        description="failure = every client on one model this many rounds in a row after "
        "T_c, or in the last round",
    )

    @model_validator(mode="after")
    def _consistent(self):
        if self.explore_rounds > self.rounds:
            raise ValueError(
                f"explore_rounds ({self.explore_rounds}) exceeds rounds ({self.rounds})"
            )
        if self.encoder_epochs is not None and self.encoder_epochs > self.local_epochs:
            raise ValueError(
                f"encoder_epochs ({self.encoder_epochs}) exceeds local_epochs ({self.local_epochs})"
            )
        return self


class CpcflParams(MethodParams):
    """``seed`` is the trial's: heads, exploration, local batches, restarts (the encoder's
    pretraining has ``ssl.seed``)."""

    name: Literal["cpcfl"] = "cpcfl"
    federation_was: ClassVar[str] = "cfl"
    encoder: CpcflEncoderParams = CpcflEncoderParams()
    pretrain: Literal["none", "simclr", "byol", "simsiam", "fedavg"] = Field(
        description="the encoder's source: none (random), server-side SSL, or the global model "
        "of a FedAvg (None) run on the clients (IFCA (FedAvg))"
    )
    ssl: SSLParams | None = Field(None, description="needed when pretrain is simclr/byol/simsiam")
    warmup_rounds: PositiveInt | None = Field(
        None,
        description="pretrain: fedavg: rounds of the FedAvg (None) run; None = federation.rounds",
    )
    federation: CflParams
    relevance_samples: PositiveInt = Field(
        300, description="images from each side for the relevance score (Tab. 5)"
    )
    parallel_clients: ParallelClients = Field("auto", description=PARALLEL_CLIENTS_HELP)

    @model_validator(mode="after")
    def _ssl_when_needed(self):
        if self.pretrain in SSL_KINDS and self.ssl is None:
            raise ValueError(f"pretrain: {self.pretrain} needs an `ssl` section")
        return self


def algorithm(p: CpcflParams) -> str:
    """The paper's name for these settings: FedAvg (one model), IFCA (no server-side SSL),
    CP-CFL."""
    if p.federation.clusters == 1:
        return "FedAvg"
    return "CP-CFL" if p.pretrain in SSL_KINDS else "IFCA"


@register
class Cpcfl(Method):
    name = "cpcfl"
    label = "CP-CFL"
    params = CpcflParams
    steps = (
        Step(
            "pretrain",
            reads=("method.encoder", "method.pretrain", "method.ssl"),
            inputs=(DATA,),
            plots=("ssl_epochs.tsv",),
            runner=Hook("fedssl.methods.cpcfl.pretrain", "run"),
        ),
        Step(
            "cfl",
            reads=("partition", "method"),
            inputs=(DATA, PARTITION, "pretrain"),
            plots=("rounds.tsv", "choices.tsv", "choice_trace.png"),
            runner=Hook("fedssl.methods.cpcfl.run", "run"),
        ),
    )
    evaluation_sections = ("personal",)
    personal_inputs = ("cfl",)
    costs_inputs = ("cfl",)
    client_costs_hook = Hook("fedssl.methods.cpcfl.costs", "client_costs")
    projected_costs_hook = Hook("fedssl.methods.cpcfl.costs", "projected_costs")
    report_tables = Hook("fedssl.methods.cpcfl.tables", "paper_tables")

    def row_label(self, params) -> str:
        label = f"{algorithm(params)} ({PRETRAIN_LABELS[params.pretrain]})"
        if algorithm(params) == "IFCA" and params.federation.restarts == 0:
            label += ", no restarts"
        return label

    def arch(self, params) -> str:
        e = params.encoder
        arch = f"cnn4-{e.padding}" if e.arch == "cnn4" else f"resnet18-{e.norm}"
        return f"{arch}+head-{params.federation.head}"
