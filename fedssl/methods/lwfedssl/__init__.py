"""LW-FedSSL, Prog-FedSSL, FedMoCo and FedMoCo-LW (Tun et al., spec methods/lw-fedssl.md):
federated MoCo v3 on a ViT, end to end or grown block by block.

The layer-wise family grows the encoder over S = ``vit.depth`` stages; growth stage s is its own
cached step ``grow_s`` (its output, the encoder with s blocks and the heads, is where ``grow_{s+1}``
starts), so the DAG's shape follows the params (:meth:`Method.steps_for`) and editing the
settings of stage s reruns stages s..S only. Per method (Tab. 2), at stage s:

============  ===================  ==============  ===========  ===========  ======  =====
method        clients train        download        upload       calibration  align  grows
============  ===================  ==============  ===========  ===========  ======  =====
FedMoCo       L1..LS               L1..LS          L1..LS       -            -       no
FedMoCo-LW    L_s                  L_s             L_s          -            -       yes
LW-FedSSL     L_s                  L1..L_s         L_s          server       alpha   yes
Prog-FedSSL   L1..L_s              L1..L_s         L1..L_s      -            -       yes
============  ===================  ==============  ===========  ===========  ======  =====

The heads (H, P and the final LayerNorm) always train and travel; the patch embedding trains
with L_1 (and with every block where all blocks train). ``vit_scratch`` is the reference row:
the seeded initial encoder, never trained (the paper's "Scratch").

Per-stage settings: ``federation`` holds what every stage uses and ``stages`` overrides it for
single stages, keyed ``s1``..``sS`` (``stages: {s7: {rounds: 30}}``). A mapping keyed by stage
reads better than a list of S entries (DVC and the presets address mapping keys by name, not
list items) and a uniform schedule stays one line. Stage s reads the schedule, its own override
and, with the global cosine learning rate, the round counts of the other stages (its position
in the schedule depends on them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Literal

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


@dataclass(frozen=True)
class GrowthPlan:
    """What a client of a layer-wise family method trains and exchanges at stage s (Tab. 2):
    ``grows`` (False: all S blocks from the first round, end-to-end), which blocks it
    ``trains`` / ``downloads`` / ``uploads`` ("all" existing blocks, or the newest "last"),
    and whether it runs the received encoder for an alignment term (``global_forward``). The
    patch embedding trains with the first block (and with every block when ``trains`` is all)."""

    grows: bool
    trains: str
    downloads: str
    uploads: str
    global_forward: bool = False

    def blocks(self, which: str, s: int, depth: int) -> int:
        """How many blocks ``which`` ("all" / "last") covers at stage s."""
        present = s if self.grows else depth
        return present if which == "all" else 1

    def embedding_moves(self, which: str, s: int) -> bool:
        return which == "all" or (self.grows and s == 1)


class VitParams(Strict):
    """The encoder (ViT-Tiny by default, spec §2) and the MoCo v3 heads."""

    width: PositiveInt = 192
    """token width (ViT-Tiny: 192)"""
    depth: PositiveInt = Field(
        12, description="blocks S; the layer-wise methods grow one per stage"
    )
    heads: PositiveInt = 3
    """attention heads per block (the width must divide by it)"""
    mlp_ratio: PositiveFloat = 4.0
    """each block's MLP hidden width, as a multiple of the width"""
    patch_size: PositiveInt = 4
    """side of the square patches in pixels"""
    pool: Literal["cls", "mean"] = Field(
        "cls", description="representation: the CLS token (MoCo v3) or the mean patch token"
    )
    input_size: PositiveInt | None = Field(
        None,
        description="images are resized to this side (views and evaluation); None = as "
        "stored (STL-10 and Tiny-ImageNet: 32 in the paper)",
    )
    head_hidden: PositiveInt = Field(4096, description="hidden width of H and P")
    head_out: PositiveInt = Field(256, description="output of H and P")

    @model_validator(mode="after")
    def _shapes(self):
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not divisible by {self.heads} heads")
        if self.width % 4:
            raise ValueError(
                f"width {self.width}: 2-D sin-cos position embeddings need a multiple of 4"
            )
        if self.input_size and self.input_size % self.patch_size:
            raise ValueError(
                f"input_size {self.input_size} does not split into {self.patch_size}-pixel patches"
            )
        return self


LW_FEDERATION = federation_block(
    strategies=("fedavg", "fedprox"),  # a stage uploads some blocks: no SCAFFOLD server step
    rounds=(RoundCount, Field(15, description="R_s: rounds per stage; 0 = the untrained ViT")),
    local_epochs=3,
    batch_size=1024,
    lr=Field(6e-4, description="AdamW peak lr (1.5e-4 x batch / 256)"),
    lr_schedule=(
        Literal["cosine", "cyclic", "constant"],
        Field(
            "cosine",
            description="cosine: decays over all rounds of all stages; cyclic: restarts "
            "every stage (§5.9); constant",
        ),
    ),
    weight_decay=1e-5,
    momentum=Field(0.99, description="mu of the momentum branch (constant)"),
)


class Schedule(LW_FEDERATION):
    """What every stage uses unless ``stages`` overrides it (spec §3)."""

    temperature: PositiveFloat = 0.2
    """tau of the MoCo v3 contrastive loss"""


class StageOverride(Strict):
    """Settings of one stage that differ from the schedule."""

    rounds: NonNegativeInt | None = None
    """this stage's rounds; null = the schedule's"""
    local_epochs: PositiveInt | None = None
    """this stage's local epochs; null = the schedule's"""
    batch_size: PositiveInt | None = None
    """this stage's batch size; null = the schedule's"""
    lr: PositiveFloat | None = None
    """this stage's learning rate; null = the schedule's"""


class LwStageOverride(StageOverride):
    alpha: NonNegativeFloat | None = None
    """this stage's weight of the alignment term (Eq. 3); null = the method's alpha"""


class Calibration(Strict):
    """LW-FedSSL's server-side calibration: end-to-end MoCo v3 on the partition's
    ``server_holdout`` (unlabelled use, through ``shift``) with the clients' settings, once
    per round."""

    enabled: bool = True
    """calibrate on the server every round (false: no calibration)"""
    timing: Literal["round_start", "round_end"] = Field(
        "round_start",
        description="round_start: before every round's local training (Alg. 1, "
        "the first round of each stage included, none after the last aggregation); round_end: "
        "after every aggregation (the prose of §4.2)",
    )
    local_epochs: PositiveInt | None = Field(None, description="None = the stage's")
    batch_size: PositiveInt | None = Field(None, description="None = the stage's")
    shift: Literal["none", "invert", "rotate90"] = Field(
        "none",
        description="how D^g differs from the clients' data: none = the holdout as drawn "
        "(the clients' distribution); invert = every image's intensities inverted (255 - x); "
        "rotate90 = every image turned a quarter turn counter-clockwise. The paper calibrates "
        "on CIFAR-10 for STL-10 clients, the same kind of objects seen differently; a fixed "
        "transform no view augmentation undoes stands in for that with one data set",
    )


SHIFT_WORDS = {"invert": "inverted", "rotate90": "rotated 90°"}  # in the report's row labels
STAGE_KEY = re.compile(r"^s([1-9][0-9]*)$")


class MocoFamilyParams(MethodParams):
    """What all four methods read."""

    federation_was: ClassVar[str] = "schedule"

    vit: VitParams = VitParams()
    federation: Schedule = Field(Schedule(), description="what every stage federates with")
    augment: AugmentParams = Field(description="view 1 (MoCo v3: blur always, no solarize)")
    augment_2: AugmentParams | None = Field(
        None, description="view 2 (MoCo v3: blur p=0.1, solarize p=0.2); None = as view 1"
    )
    parallel_clients: ParallelClients = Field("auto", description=PARALLEL_CLIENTS_HELP)
    # Tab. 2: what a client trains and exchanges (LW-FedSSL's depends on its settings)
    growth_plan: ClassVar[GrowthPlan]

    def stage_count(self) -> int:
        return self.vit.depth

    def growth_stages(self) -> list[int | None]:
        """The stages the steps run: 1..S, or [None] for one end-to-end step."""
        return list(range(1, self.vit.depth + 1))

    def settings(self, s: int | None) -> Schedule:
        """The schedule stage s runs with."""
        raise NotImplementedError

    def plan(self, s: int | None) -> GrowthPlan:
        """Tab. 2 at stage s."""
        return self.growth_plan

    def stage_alpha(self, s: int | None) -> float:
        """The weight of the alignment term at stage s (LW-FedSSL's only)."""
        return 0.0

    @property
    def calibrates(self) -> bool:
        """Whether the server calibrates the global model on its own data (LW-FedSSL's)."""
        return False


class GrowingParams(MocoFamilyParams):
    """The methods that grow the encoder one block per stage."""

    weight_transfer: bool = Field(
        True, description="a new block starts as a copy of the previous one (§5.1, App. B.2)"
    )
    stages: dict[str, StageOverride] = Field(
        default_factory=dict, description="per-stage overrides, keyed s1..sS"
    )

    @model_validator(mode="after")
    def _stage_keys(self):
        for key in self.stages:
            m = STAGE_KEY.match(key)
            if not m or int(m.group(1)) > self.vit.depth:
                raise ValueError(f"stages: '{key}' is not a stage (expected s1..s{self.vit.depth})")
        return self

    def stage(self, s: int) -> Schedule:
        """The settings of stage s (1-based): the schedule with the stage's overrides."""
        over = self.stages.get(f"s{s}")
        values = dict(self.federation)  # its fields as they are (the strategy choice a model)
        if over is not None:
            values.update(
                {k: v for k, v in over.model_dump().items() if v is not None and k in values}
            )
        return self.federation.model_copy(update=values)

    def stage_rounds(self) -> list[int]:
        return [self.stage(s).rounds for s in range(1, self.vit.depth + 1)]

    def settings(self, s: int | None) -> Schedule:
        return self.stage(s)


class FedMoCoParams(MocoFamilyParams):
    """End-to-end FedAvg of MoCo v3: ``vit.depth`` x ``federation.rounds`` rounds (the same R as
    the layer-wise schedule)."""

    name: Literal["fedmoco"] = "fedmoco"
    growth_plan: ClassVar[GrowthPlan] = GrowthPlan(False, "all", "all", "all")
    weight_transfer: ClassVar[bool] = True  # no new block ever starts (the strategy asks)

    def growth_stages(self) -> list[int | None]:
        return [None]

    def settings(self, s: int | None) -> Schedule:
        """S x R_s rounds of the schedule."""
        rounds = self.federation.rounds * self.vit.depth
        return self.federation.model_copy(update={"rounds": rounds})


class FedMoCoLWParams(GrowingParams):
    name: Literal["fedmoco_lw"] = "fedmoco_lw"
    growth_plan: ClassVar[GrowthPlan] = GrowthPlan(True, "last", "last", "last")


class ProgFedSSLParams(GrowingParams):
    name: Literal["prog_fedssl"] = "prog_fedssl"
    growth_plan: ClassVar[GrowthPlan] = GrowthPlan(True, "all", "all", "all")


class LwFedSSLParams(GrowingParams):
    name: Literal["lw_fedssl"] = "lw_fedssl"
    stages: dict[str, LwStageOverride] = Field(
        default_factory=dict, description="per-stage overrides, keyed s1..sS"
    )
    alpha: NonNegativeFloat = Field(0.01, description="weight of the alignment term (Eq. 3)")
    calibration: Calibration = Calibration()

    def stage_alpha(self, s: int | None) -> float:
        over = self.stages.get(f"s{s}")
        return self.alpha if over is None or over.alpha is None else over.alpha

    @property
    def calibrates(self) -> bool:
        return self.calibration.enabled

    def plan(self, s: int | None) -> GrowthPlan:
        # calibration changes every block on the server, so clients download them all (without
        # it the frozen blocks never change and the newest one is enough)
        return GrowthPlan(
            True,
            "last",
            "all" if self.calibrates else "last",
            "last",
            global_forward=self.stage_alpha(s or 1) > 0,
        )


class VitScratchParams(MethodParams):
    """The seeded initial encoder (the first model FedMoCo trains), never trained."""

    name: Literal["vit_scratch"] = "vit_scratch"
    vit: VitParams = VitParams()


# --------------------------------------------------------------------------- plugins
RUN = "fedssl.methods.lwfedssl.run"  # the module that trains (the runners and the encoder)
SHARED_READS = (
    "partition",
    "method.seed",
    "method.vit",
    "method.federation",
    "method.augment",
    "method.augment_2",
    "method.parallel_clients",
)
COST_COLUMNS = (
    "paper_flops",
    "encoder_bytes",
    "encoder_bytes_down",
    "encoder_bytes_up",
    "block_bytes",
    "rounds_taken",
)


class _Family(Method):
    """What the four methods share: evaluation, costs, labels, the Tab. 3 table."""

    encoder_reads = ("method.vit",)
    encoder_builder = Hook("fedssl.methods.lwfedssl.run", "encoder_skeleton")
    costs_reads = ("method", "partition")
    cost_columns = COST_COLUMNS
    finetunable = True
    encoder_hook = Hook(RUN, "encoder")
    client_costs_hook = Hook("fedssl.methods.lwfedssl.costs", "client_costs")
    projected_costs_hook = Hook("fedssl.methods.lwfedssl.costs", "projected_costs")
    report_tables = Hook("fedssl.methods.lwfedssl.tables", "tab3")

    def arch(self, params) -> str:
        v = params.vit
        return f"vit-w{v.width}-d{v.depth}"


class _Growing(_Family):
    """Steps grow_1..grow_S, one per growth stage."""

    def extra_reads(self, params) -> tuple[str, ...]:
        return ("method.weight_transfer",)

    def row_label(self, params) -> str:
        return self.label + ("" if params.weight_transfer else " w/o WT")

    def steps_for(self, params) -> tuple[Step, ...]:
        steps = []
        for s in range(1, params.vit.depth + 1):
            own = (f"method.stages.s{s}",) if f"s{s}" in params.stages else ()
            others = ()
            if params.federation.lr_schedule == "cosine":  # the position in the whole schedule
                others = tuple(
                    f"method.stages.s{t}.rounds"
                    for t in range(1, params.vit.depth + 1)
                    if t != s and f"s{t}" in params.stages
                )
            inputs = (DATA, PARTITION) + ((f"grow_{s - 1}",) if s > 1 else ())
            steps.append(
                Step(
                    f"grow_{s}",
                    reads=SHARED_READS + self.extra_reads(params) + own + others,
                    inputs=inputs,
                    plots=(f"grow_{s}.tsv",),
                    runner=Hook(RUN, "grow"),
                    args=(s,),
                )
            )
        return tuple(steps)

    def encoder_inputs_for(self, params) -> tuple[str, ...]:
        return (f"grow_{params.vit.depth}",)

    def costs_inputs_for(self, params) -> tuple[str, ...]:
        return tuple(f"grow_{s}" for s in range(1, params.vit.depth + 1))


@register
class FedMoCo(_Family):
    name = "fedmoco"
    label = "FedMoCo"
    params = FedMoCoParams
    steps = (
        Step(
            "pretrain",
            reads=SHARED_READS,
            plots=("rounds.tsv",),
            runner=Hook(RUN, "grow"),
            args=(None,),
        ),
    )  # end to end: no growth stage
    encoder_inputs = ("pretrain",)
    costs_inputs = ("pretrain",)


@register
class FedMoCoLW(_Growing):
    name = "fedmoco_lw"
    label = "FedMoCo-LW"
    params = FedMoCoLWParams


@register
class ProgFedSSL(_Growing):
    name = "prog_fedssl"
    label = "Prog-FedSSL"
    params = ProgFedSSLParams


@register
class LwFedSSL(_Growing):
    name = "lw_fedssl"
    label = "LW-FedSSL"
    params = LwFedSSLParams

    def extra_reads(self, params) -> tuple[str, ...]:
        return ("method.weight_transfer", "method.alpha", "method.calibration")

    def row_label(self, params) -> str:
        calibrated = params.calibration.enabled
        aligned = params.alpha > 0 or any(o.alpha for o in params.stages.values())
        label = (
            self.label
            + {
                (True, True): "",
                (True, False): " (calibration only)",
                (False, True): " (alignment only)",
                (False, False): " (neither)",
            }[(calibrated, aligned)]
        )
        if not params.weight_transfer:
            label += " w/o WT"
        shift = params.calibration.shift
        if calibrated and shift != "none":
            label += f", D^g {SHIFT_WORDS[shift]}"
        return label


@register
class VitScratch(Method):
    name = "vit_scratch"
    label = "Scratch"
    params = VitScratchParams
    steps = (
        Step(
            "init", reads=("method.seed", "method.vit"), inputs=(DATA,), runner=Hook(RUN, "scratch")
        ),
    )
    encoder_inputs = ("init",)
    encoder_reads = ("method.vit",)
    encoder_builder = Hook("fedssl.methods.lwfedssl.run", "encoder_skeleton")
    encoder_hook = Hook(RUN, "encoder")
    finetunable = True

    def arch(self, params) -> str:
        return f"vit-w{params.vit.width}-d{params.vit.depth}"
