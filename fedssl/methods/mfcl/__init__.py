"""MFCL with Twin Normalization (Motamedi & Kim; spec methods/mfcl.md).

Phase 1 (step ``pretrain``): clients train a small autoencoder (client module + mirror decoder,
Twin/Group/Batch Norm) on twin-ordered augmented views, averaged by the gServer with FedAvg
(optionally through pairwise-masked secure aggregation). Phase 2: each client exports rho pairs
of twin views per sample through the frozen client module + MaxPool, once (step ``export``); the
rServer trains the remaining ResNet stages + projection head on them with NT-Xent and LARS (step
``rserver``). The probes read client module + MaxPool + rServer module."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from fedssl.methods.base import DATA, PARTITION, Hook, Method, MethodParams, Step
from fedssl.methods.registry import register
from fedssl.params import (
    PARALLEL_CLIENTS_HELP,
    AugmentParams,
    ParallelClients,
    RoundCount,
    Strict,
)
from fedssl.strategies.choices import federation_block


class MfclClientModule(Strict):
    """The client module (encoder of Tab. 9 / Tab. 10) and its mirror decoder."""

    arch: Literal["resnet18", "resnet50"] = Field(
        description="resnet18 = 2-conv client module (Tab. 9), resnet50 = 4-conv (Tab. 10)"
    )
    width: PositiveInt = Field(description="channels of the first conv (64 in the paper)")
    norm: Literal["tn", "gn", "bn"] = Field(description="Twin Norm, GroupNorm or BatchNorm")
    channels_per_group: PositiveInt = Field(16, description="Lambda for TN / GN")
    tn_variance: Literal["joint", "avg_of_views"] = Field(
        "joint", description="joint = Eq. 2; avg_of_views = the Tab. 18 snippet (ablation)"
    )
    ae_pool: Literal["outside", "upsample", "downsampled_target"] = Field(
        "outside", description="where the MaxPool sits while training the autoencoder (A2)"
    )
    cut: Annotated[int, Field(ge=1, le=7)] = Field(
        2,
        description="resnet18 only: client convs of the Tab. 1 sweep (A1); the rServer drops "
        "the (cut - 1) // 2 BasicBlocks they cover. 2 = Tab. 9",
    )
    tn_eval_pair: Literal["self", "hflip"] = Field(
        "self",
        description="Twin Norm's twin for unpaired images at evaluation (A5): the image "
        "itself (= GroupNorm) or its horizontal flip",
    )

    @model_validator(mode="after")
    def _cut_is_resnet18_only(self):
        # Tab. 10's ResNet-50 client module is a fixed 4-conv stem; the sweep is defined for R18.
        if self.arch == "resnet50" and self.cut != 2:
            raise ValueError(
                f"cut applies to arch resnet18 only (resnet50 has Tab. 10's fixed "
                f"client module), got cut={self.cut}"
            )
        return self


MFCL_FEDERATION = federation_block(
    rounds=(RoundCount, Field(description="T (15 in the paper); 0 = random client module")),
    local_epochs=1,
    lr=Field(description="Adam learning rate (0.05 C10 / 0.001 Tiny)"),
)


class MfclPhase1(MFCL_FEDERATION):
    """Phase 1: FedAvg of the client autoencoder at the gServer (Alg. 1, Tab. 12)."""

    batch_pairs: PositiveInt = Field(description="K samples per batch (2K twin views)")
    adam_eps: PositiveFloat = 1e-7
    """epsilon of the clients' Adam"""
    loss: Literal["bce", "mse"] = "bce"
    """the autoencoder's reconstruction loss: binary cross-entropy or mean squared error"""
    secure_aggregation: bool = Field(
        False, description="pairwise masks: the gServer only sees the sum of the updates"
    )


class MfclPhase1Section(Strict):
    """Phase 1's section: its federation (a method's federated phase keeps its block at
    ``method.phases.<name>.federation``)."""

    federation: MfclPhase1


class MfclPhases(Strict):
    """MFCL's federated phases by name: phase 1 (the export and the rServer are not
    federations)."""

    phase1: MfclPhase1Section


class MfclExport(Strict):
    """Phase 2 upload: rho pairs of twin views per sample through the frozen client module."""

    pairs: PositiveInt = Field(description="rho (8 in the paper)")
    client_dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(
        0.0, description="delta: fraction of clients (drawn once, seeded) that send nothing"
    )
    bn_export_mode: Literal["eval", "train"] = Field(
        "eval", description="BN client modules: aggregated running stats or batch stats (A7)"
    )
    batch_pairs: PositiveInt = Field(256, description="samples per export forward pass")
    tn_pairing: Literal["twin", "self", "cross", "pseudo"] = Field(
        "twin",
        description="Twin Norm at export (controls of the Twin Norm question): twin = "
        "a pair's two views share statistics (the paper); self = each view normalised with "
        "itself (nothing shared); cross = each view normalised with a view of another sample "
        "(pooled statistics, nothing shared between the positives); pseudo = the positive "
        "pair is two different images normalised together (content shares nothing)",
    )
    storage: Literal["tensors"] = Field(
        "tensors", description="tensors = the representations as fp16 arrays"
    )


class MfclRServer(Strict):
    """Phase 2b: the rServer module (the remaining ResNet stages, BN) + projection head."""

    width: PositiveInt = Field(description="channels of the first residual stage (64 = R18)")
    proj_hidden: PositiveInt = Field(description="width of the two hidden Dense layers (Tab. 11)")
    proj_dim: PositiveInt = Field(128, description="output of the projection head")
    epochs: PositiveInt
    """passes over the uploaded views"""
    batch_pairs: PositiveInt = Field(description="N_s samples (2 N_s representations) per batch")
    lr: PositiveFloat = Field(1.0, description="LARS base learning rate lr0")
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    """peak rate: none = lr; linear = lr x batch_pairs / 256; sqrt = lr x sqrt(batch_pairs)"""
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    """LARS momentum, in [0, 1)"""
    trust_coefficient: PositiveFloat = 0.001
    """LARS trust coefficient eta (a layer's step x eta x weight norm / update norm)"""
    weight_decay: NonNegativeFloat = 1e-4
    """LARS weight decay"""
    warmup_epochs: NonNegativeInt = 10
    """epochs of linear warm-up to the peak rate, then cosine decay (at most epochs)"""
    temperature: PositiveFloat = 0.5
    """tau of the rServer's NT-Xent loss"""
    restandardize: Literal["none", "group", "channel_mean"] = Field(
        "none",
        description="what the rServer does to each received view first: nothing (the "
        "paper); standardise it per group of Lambda channels; or subtract each channel's "
        "spatial mean (controls that remove a pairwise normalisation signature)",
    )
    seed: int = 0
    """the rServer's own seed: its initial weights, epoch order and the pair drawn per sample"""

    @model_validator(mode="after")
    def _warmup_fits(self):
        if self.warmup_epochs > self.epochs:
            raise ValueError(f"warmup_epochs ({self.warmup_epochs}) exceeds epochs ({self.epochs})")
        return self


class MfclParams(MethodParams):
    """The client module, phase 1, export and rServer (each its own section), plus the view
    augmentation shared by phase 1 and the export."""

    name: Literal["mfcl"] = "mfcl"
    federation_was: ClassVar[str] = "phase1"
    augment: AugmentParams = AugmentParams()
    parallel_clients: ParallelClients = Field("auto", description=PARALLEL_CLIENTS_HELP)
    client_module: MfclClientModule
    phases: MfclPhases
    export: MfclExport
    rserver: MfclRServer


VIEWS = ("method.seed", "method.augment", "method.client_module")


@register
class Mfcl(Method):
    name = "mfcl"
    label = "MFCL"
    params = MfclParams
    steps = (
        Step(
            "pretrain",
            reads=("partition", *VIEWS, "method.parallel_clients", "method.phases.phase1"),
            plots=("rounds.tsv",),
            runner=Hook("fedssl.methods.mfcl.run", "phase1"),
        ),
        Step(
            "export",
            reads=("partition", *VIEWS, "method.export"),
            inputs=(DATA, PARTITION, "pretrain"),
            runner=Hook("fedssl.methods.mfcl.export", "export"),
        ),
        Step(
            "rserver",
            reads=("method.client_module", "method.rserver"),
            inputs=("export",),
            plots=("rserver_epochs.tsv",),
            runner=Hook("fedssl.methods.mfcl.run", "rserver"),
        ),
    )
    flower_steps = {"pretrain": Hook("fedssl.methods.mfcl.run", "phase1_federation")}
    encoder_inputs = ("pretrain", "rserver")
    encoder_reads = ("method.client_module", "method.rserver")
    encoder_builder = Hook("fedssl.methods.mfcl.run", "encoder_skeleton")
    encoder_hook = Hook("fedssl.methods.mfcl.run", "deployed_encoder")
    costs_inputs = ("pretrain", "export")
    client_costs_hook = Hook("fedssl.methods.mfcl.costs", "client_costs")
    projected_costs_hook = Hook("fedssl.methods.mfcl.costs", "projected_costs")
    report_tables = Hook("fedssl.methods.mfcl.tables", "tables")

    def row_label(self, params) -> str:
        return f"MFCL({params.client_module.norm.upper()})"

    def arch(self, params) -> str:
        return f"{params.client_module.arch}-{params.client_module.norm}"
