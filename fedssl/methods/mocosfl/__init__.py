"""MocoSFL and MonAcoSFL (Przewięźlikowski et al., ECML-PKDD 2024; spec methods/monacosfl.md):
split federated MoCo v2 with, for MonAcoSFL, momentum alignment.

Every client holds the bottom ``cut`` units of a GroupNorm + weight-standardised backbone (its
online copy and a momentum copy); the server holds the top units, the MLP projector, their
momentum copies and one FIFO queue of negatives. Each step the sampled clients upload their
cut-layer activations (online model on the query views, momentum model on the key views), the
server computes the MoCo loss (Eq. 1) on the concatenated batch, steps, and sends each client
the gradient of its activations. Every ``sync_every`` steps (and at the end of a round) the
clients' online models are replaced by their data-size-weighted FedAvg; MonAcoSFL also
averages the clients' momentum models (§4.2, the alignment).

Steps: ``pretrain`` (the split federation; per-round k-NN monitor on a held-out split, the
misalignment every step as Eq. 2 has it and as the authors log it, communication by kind from
the tensors sent) and ``inversion`` (the model-inversion attack of §5.3 on the final client
model's cut-layer activations); the ``costs`` stage reads what a client paid. The
shared probes read the synced client model + the server's backbone part (projector dropped).

One method with a ``variant`` field: both variants share every setting and the report puts them
side by side in the paper's layout (per cut, per number of clients).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from fedssl.methods.base import DATA, PARTITION, FederatedMethod, Hook, MethodParams, Step
from fedssl.methods.registry import register
from fedssl.params import (
    PARALLEL_CLIENTS_HELP,
    AugmentParams,
    Fraction,
    ParallelClients,
    RoundCount,
    Strict,
)
from fedssl.strategies.choices import federation_block

VARIANT_LABELS = {"mocosfl": "MocoSFL", "monacosfl": "MonAcoSFL"}
NUM_UNITS = 9  # both backbones: stem + 8 BasicBlocks / stem + 7 stages + final 1x1 conv


class SflBackbone(Strict):
    """The GN + WS backbone of :mod:`fedssl.models.split` and the server's MLP projector."""

    arch: Literal["resnet18", "mobilenetv2"]
    """the client-server network split at the cut layer: ResNet-18 or MobileNetV2"""
    width: PositiveInt | None = Field(
        None, description="resnet18: channels of the first stage (64 = ResNet-18); None = 64"
    )
    width_mult: PositiveFloat | None = Field(
        None, description="mobilenetv2: width multiplier (1.0 = MobileNetV2); None = 1.0"
    )
    channels_per_group: PositiveInt = Field(4, description="GroupNorm group size ([code] 4)")
    stem: Literal["cifar", "imagenet"] = Field(
        "cifar", description="cifar = 3x3 stride-1 stem, no max-pool (the paper's models)"
    )
    proj_hidden: PositiveInt = Field(1024, description="projector hidden width [paper]")
    proj_dim: PositiveInt = Field(1024, description="projector output width [code]")

    @model_validator(mode="after")
    def _width_fits_arch(self):
        if self.arch == "resnet18" and self.width_mult is not None:
            raise ValueError("width_mult applies to arch mobilenetv2; resnet18 takes `width`")
        if self.arch == "mobilenetv2" and self.width is not None:
            raise ValueError("width applies to arch resnet18; mobilenetv2 takes `width_mult`")
        return self


class SflMoco(Strict):
    """MoCo v2 on the server (Eq. 1)."""

    queue_size: PositiveInt = Field(6000, description="K negatives in the FIFO memory [paper]")
    temperature: PositiveFloat = Field(0.1, description="tau [code]")
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(
        0.99, description="EMA m of the client and server momentum models [code]"
    )
    symmetric: bool = Field(
        True,
        description="[code] V2: the server also queries the momentum activations against "
        "keys of the online ones and sums both losses (clients send the same rows; their "
        "gradient is the first direction's); false = query x', key x'' only",
    )


SFL_FEDERATION = federation_block(
    strategies=("fedavg",),
    rounds=(
        RoundCount,
        Field(description="200 in the paper ([code] 200/rho when sampling); 0 = the untrained net"),
    ),
    client_fraction=Field(1.0, description="clients drawn each round (rho)"),
    batch_size=Field(description="B_c images per client and step"),
    lr=Field(0.06, description="SGD learning rate, client and server"),
    momentum=0.9,
    weight_decay=5e-4,
    lr_schedule=Field("cosine", description="over rounds"),
)


class SflTraining(SFL_FEDERATION):
    """Rounds (= epochs over the sampled clients' data), SGD on both sides, synchronisation."""

    sync_every: PositiveInt = Field(
        description="steps between syncs of the client models (counted across rounds when "
        "a round does not end with a sync)"
    )
    sync_at_round_end: bool = Field(True, description="[code] also sync at a round's last step")
    log_every: PositiveInt = Field(1, description="steps between misalignment/loss log rows")
    round_steps: Literal["longest", "equal"] = Field(
        "longest",
        description="steps in a round: longest = until the sampled client with the most images "
        "has seen each once (the others stop when done, so one large client sets the round's "
        "length on a skewed partition); equal = [code] every sampled client takes the same "
        "steps, the mean client's ceil(n / B_c), cycling through its own images in fresh "
        "shuffles (the same as longest where the clients are of one size)",
    )
    client_lr_schedule: Literal["round", "step_cosine"] = Field(
        "round",
        description="round = the clients step the server's per-round rate; step_cosine = "
        "[code] each client its own cosine over its steps: lr (1 + cos(pi s / T)) / 2 at its "
        "step s (CosineAnnealingLR stepped per client step, so periodic beyond T)",
    )
    client_lr_period: PositiveInt | None = Field(
        None,
        description="T of step_cosine, in client steps; None = rounds ([code] T_max = the "
        "run's epochs, 200/rho)",
    )

    @model_validator(mode="after")
    def _period_needs_step_cosine(self):
        if self.client_lr_period is not None and self.client_lr_schedule != "step_cosine":
            raise ValueError("client_lr_period applies to client_lr_schedule step_cosine")
        return self

    @model_validator(mode="after")
    def _monitor_is_the_methods(self):
        if self.monitor_every:  # the library's monitor reads one module; the recipe's is kept
            raise ValueError(
                "monitor_every: MocoSFL's k-NN monitor (of the split model) is set by "
                "method.monitor (every, k, ...); leave method.federation.monitor_every at 0"
            )
        return self


class SflMonitor(Strict):
    """k-NN monitor during training (weighted k-NN, [code] k=200, T=0.1). It is only logged:
    the final model is evaluated, never the best-on-monitor one."""

    every: NonNegativeInt = Field(
        1,
        description="rounds between evaluations (0 = never; the "
        "last round is always evaluated otherwise)",
    )
    queries: Literal["holdout", "test"] = Field(
        "holdout",
        description="holdout = the partition's server_holdout (training images no "
        "client holds); test = a fixed class-stratified part of the test split",
    )
    query_size: PositiveInt = Field(2000, description="query images (at most the split)")
    bank_size: PositiveInt = Field(
        5000,
        description="labelled memory-bank images, a "
        "class-stratified subset of the clients' training data",
    )
    k: PositiveInt = 200
    """neighbours voting per query"""
    temperature: PositiveFloat = 0.1
    """the votes' temperature (weights exp(similarity / T))"""


class SflInversion(Strict):
    """Model-inversion attack (§5.3): a decoder trained on auxiliary data to map the final
    client model's cut-layer activations back to images."""

    aux_fraction: Fraction = Field(
        0.01, description="the attacker's share of the clients' training images (1% in the paper)"
    )
    epochs: PositiveInt = 50
    """passes of the decoder over the auxiliary images"""
    batch_size: PositiveInt = 32
    """images per decoder step"""
    lr: PositiveFloat = 1e-3
    """the decoder's Adam learning rate"""
    width: PositiveInt = Field(64, description="decoder channels after its first conv")
    eval_images: PositiveInt = Field(500, description="test images scored by MSE and SSIM")
    show: PositiveInt = Field(8, description="reconstructions in the picture")


class MocoSflParams(MethodParams):
    """MocoSFL / MonAcoSFL: the variant, the backbone and its cut, MoCo, training, the k-NN
    monitor, the inversion attack."""

    name: Literal["mocosfl"] = "mocosfl"
    federation_was: ClassVar[str] = "training"
    variant: Literal["mocosfl", "monacosfl"] = Field(
        description="mocosfl = sync the client online models only; monacosfl = also average "
        "the client momentum models at every sync (momentum alignment)"
    )
    backbone: SflBackbone
    cut: Annotated[int, Field(ge=1, le=NUM_UNITS)] = Field(
        description="units on the client: resnet18 = stem + (cut-1) BasicBlocks, i.e. the "
        "paper's L = 2 cut - 1 layers; mobilenetv2 = stem + (cut-1) inverted-residual stages "
        "(9 adds the final 1x1 conv)"
    )
    moco: SflMoco = SflMoco()
    federation: SflTraining
    augment: AugmentParams = AugmentParams()
    monitor: SflMonitor = SflMonitor()
    inversion: SflInversion = SflInversion()
    parallel_clients: ParallelClients = Field("auto", description=PARALLEL_CLIENTS_HELP)


def paper_layer(p: MocoSflParams) -> int | None:
    """The paper's cut index L (ResNet-18 only: 2 cut - 1 weighted layers on the client)."""
    return 2 * p.cut - 1 if p.backbone.arch == "resnet18" else None


TRAINING = (
    "partition",
    "method.variant",
    "method.seed",
    "method.backbone",
    "method.cut",
    "method.moco",
    "method.federation",
    "method.augment",
    "method.monitor",
    "method.parallel_clients",
)


@register
class MocoSfl(FederatedMethod):
    name = "mocosfl"
    label = "MocoSFL"
    params = MocoSflParams
    package = "fedssl.methods.mocosfl"
    # its recipe brings the split trainer, its monitor and its outputs (the model in two
    # parts, the step log): the one runtime runs it
    recipe = Hook("fedssl.methods.mocosfl.train", "recipe")
    encoder_loader = Hook("fedssl.methods.mocosfl.run", "encoder")
    flower_steps = {}  # the split trainer exchanges activations every batch, not rounds' models
    pretrain_reads = TRAINING
    pretrain_plots = ("rounds.tsv", "steps.tsv", "misalignment.png")
    later_steps = (
        Step(
            "inversion",
            reads=("partition", "method.seed", "method.backbone", "method.cut", "method.inversion"),
            inputs=(DATA, PARTITION, "pretrain"),
            plots=("inversion.png",),
            runner=Hook("fedssl.methods.mocosfl.run", "inversion"),
        ),
    )
    encoder_reads = ("method.backbone", "method.cut")
    encoder_builder = Hook("fedssl.methods.mocosfl.run", "encoder_skeleton")
    cost_columns = ("flops_per_step", "smashed_bytes_per_step", "server_flops")
    report_tables = Hook("fedssl.methods.mocosfl.report", "tables")
    report_figures = Hook("fedssl.methods.mocosfl.report", "figures")

    def row_label(self, params) -> str:
        layer = paper_layer(params)
        where = f"L{layer}" if layer else f"{params.backbone.arch} cut {params.cut}"
        return f"{VARIANT_LABELS[params.variant]} {where}"

    def arch(self, params) -> str:
        return f"{params.backbone.arch}-gnws"
