"""MpFedcon (Li, Fang, Shi 2022; spec methods/mpfedcon.md) and the baselines of its Tab. 1, as
variants of one personalised-FL method, plus its gradient-leakage study (§4.4, §5.10).

Every party holds the layered network F = O∘P∘D (base encoder D, projection head P, output
layer O). ``shared`` says which layers travel and are averaged; the others stay on the party
across rounds (A8). The variants:

* ``mpfedcon``: P+O local; the head trains first (``head_epochs``, cross-entropy), then D
  (``body_epochs``) with CE + μ·l_con (Eq. 5) against the global class centres; parties upload
  D and their class centres (Eq. 3), the server averages both (Eq. 4);
* ``fedrep``: the same schedule with CE only; ``fedper``: D shared, P+O local, all trained
  together; ``lg_fedavg``: P+O shared, D local (the mirror split);
* ``fedavg``: everything shared; ``fedavg_ft``: FedAvg, evaluated after ``finetune_epochs``
  of local fine-tuning of the head (FedProx: ``fedavg`` with ``federation.strategy: {kind:
  fedprox, mu: ...}``, the library's (μ_p/2)‖w − w_g‖² that any method can choose);
* ``solo``: nothing shared, nothing sent (local training only);
* the personalised baselines of Tab. 1 (spec methods/baselines.md §8-11; module
  :mod:`~fedssl.methods.mpfedcon.personalised`), whole model shared: ``scaffold`` (control
  variates, option II), ``apfl`` (personal model mixed with the global one by α),
  ``ditto`` (λ-proximal personal model), ``perfedavg`` (MAML meta-steps, evaluated after one
  adaptation step).

Evaluation is personalised (the shared ``personal`` stage): each round every party's model
(shared layers from the server, its own layers) on its own test split.

The leakage study of §5.10 is the method ``gradient_leakage`` (its own package).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from fedssl.methods.base import Hook, Method, MethodParams, Step
from fedssl.methods.registry import register
from fedssl.params import FEDERATION_HELP, CropPadding, NoiseParams, Strict
from fedssl.strategies.choices import federation_block

Variant = Literal[
    "mpfedcon",
    "fedrep",
    "fedper",
    "lg_fedavg",
    "fedavg",
    "fedavg_ft",
    "solo",
    "scaffold",
    "apfl",
    "ditto",
    "perfedavg",
]
Layer = Literal["base", "projector", "output"]
ALL_LAYERS: tuple[str, ...] = ("base", "projector", "output")
# The split of each variant (spec A8: FedPer / FedRep keep P+O local like MpFedcon).
DEFAULT_SHARED: dict[str, tuple[str, ...]] = {
    "mpfedcon": ("base",),
    "fedrep": ("base",),
    "fedper": ("base",),
    "lg_fedavg": ("projector", "output"),
    "fedavg": ALL_LAYERS,
    "fedavg_ft": ALL_LAYERS,
    "solo": (),
    "scaffold": ALL_LAYERS,
    "apfl": ALL_LAYERS,
    "ditto": ALL_LAYERS,
    "perfedavg": ALL_LAYERS,
}
HEAD_FIRST = ("mpfedcon", "fedrep")  # local head epochs, then body epochs
LABELS = {
    "mpfedcon": "MpFedcon",
    "fedrep": "FedRep",
    "fedper": "FedPer",
    "lg_fedavg": "LG-FedAvg",
    "fedavg": "FedAvg",
    "fedavg_ft": "FedAvg+FT",
    "solo": "SOLO",
    "scaffold": "SCAFFOLD",
    "apfl": "APFL",
    "ditto": "Ditto",
    "perfedavg": "Per-FedAvg",
}
PERSONALISED = ("scaffold", "apfl", "ditto", "perfedavg")  # baselines.md §8-11


class NetParams(Strict):
    """F = O∘P∘D. D: ``cnn`` = FedRep's CNNCifar without its last layer (conv k5 blocks with
    ReLU and max-pool 2, then ReLU fc layers ``hidden``), ``mlp`` = ReLU fc layers ``hidden``
    (FEMNIST). P: Linear-ReLU-Linear (hidden, out) = ``projection`` (None: no P). O: Linear."""

    base: Literal["cnn", "mlp"]
    """D: cnn (FedRep's CNNCifar) or mlp (fc layers only)"""
    conv_channels: tuple[PositiveInt, ...] = (64, 64)
    """cnn: output channels of each conv block"""
    kernel_size: PositiveInt = 5
    """cnn: side of every conv kernel"""
    hidden: tuple[PositiveInt, ...] = (120, 64)
    """widths of D's ReLU fc layers (the last one is D's output)"""
    projection: tuple[PositiveInt, PositiveInt] | None = (128, 128)
    """P's (hidden, out) widths; null = no projection head"""


MPFEDCON_FEDERATION = federation_block(
    strategies=("fedavg", "fedprox"),
    rounds=(PositiveInt, Field(description="T")),
    client_fraction=Field(0.1, description="r: parties sampled per round"),
    batch_size=10,
    lr=0.01,
    momentum=0.5,
    weight_decay=1e-4,
    parallel_clients="auto",
)


class MpFedconParams(MethodParams):
    """One personalised-FL run: the variant, its network and split, and Alg. 1's settings."""

    name: Literal["mpfedcon"] = "mpfedcon"
    federation: MPFEDCON_FEDERATION = Field(description=FEDERATION_HELP)
    variant: Variant
    """the method or baseline of Tab. 1 (see the method's page): what is shared and how it trains"""
    net: NetParams
    shared: tuple[Layer, ...] | None = Field(
        None,
        description="layers averaged by the server (the rest stay on the party); None = "
        "the variant's split (mpfedcon/fedrep/fedper: base; lg_fedavg: projector + output; "
        "fedavg/fedavg_ft: all; solo: none)",
    )
    head_epochs: NonNegativeInt = Field(
        10, description="tau_h: epochs on the local head first (mpfedcon, fedrep)"
    )
    body_epochs: PositiveInt = Field(
        1,
        description="tau_0: epochs on the shared base (mpfedcon, fedrep), or of the whole "
        "network trained together (the other variants)",
    )
    mu: NonNegativeFloat = Field(10.0, description="mpfedcon: weight of l_con (Eq. 6)")
    temperature: PositiveFloat = Field(0.5, description="mpfedcon: tau of Eq. 5 (SUG)")
    neg_source: Literal["round_start", "prev_local"] = Field(
        "round_start",
        description="mpfedcon, A2: z_con from the round-start model, or from "
        "the party's model after its previous local training",
    )
    personal_every: PositiveInt = Field(
        1,
        description="rounds between the personalised evaluations of every party during "
        "training: every k-th round and each of the last k (1 = every round; at 100 parties a "
        "round's evaluation costs several times its training); the last personal.last_rounds "
        "must lie within the last k",
    )
    finetune_epochs: PositiveInt = Field(10, description="fedavg_ft: local fine-tuning epochs")
    finetune_layers: Literal["head", "output"] = Field(
        "head", description="fedavg_ft: what fine-tuning trains: P+O, or O only"
    )
    augment: Literal["none", "crop_flip"] = Field(
        "none", description="crop_flip = random crop with zero padding + horizontal flip"
    )
    crop_padding: CropPadding = 4
    upload_noise: NoiseParams | None = Field(
        None,
        description="Tab. 4's defence: noise on every shared value a party uploads "
        "(added to its update, i.e. to the trained weights)",
    )
    scaffold_server_lr: PositiveFloat | None = Field(
        None, description="scaffold: eta_g; None = 1 (canonical), 0.1 with fedrep_code"
    )
    scaffold_clip_norm: PositiveFloat | None = Field(
        None,
        description="scaffold: clip each local step's gradient (CE + correction) to this L2 "
        "norm, as FedRep's code does with 10; None = no clipping",
    )
    apfl_alpha: Annotated[float, Field(ge=0.0, le=1.0)] = Field(
        0.5, description="apfl: the mixing weight alpha of the personal model (its start value)"
    )
    apfl_adaptive: bool = Field(
        False, description="apfl: learn alpha by gradient descent (clipped to [0, 1])"
    )
    ditto_lambda: NonNegativeFloat = Field(1.0, description="ditto: lambda of the prox term")
    perfedavg_order: Literal["first_order", "hessian_free"] = Field(
        "first_order", description="perfedavg: FO or HF meta-gradient"
    )
    perfedavg_alpha: PositiveFloat = Field(
        0.01, description="perfedavg: alpha, the inner / personalisation step size"
    )
    perfedavg_delta: PositiveFloat = Field(
        1e-3, description="perfedavg hessian_free: delta of the finite difference"
    )
    fedrep_code: bool = Field(
        False,
        description="reproduce FedRep's code (MpFedcon's baseline numbers): scaffold eta_g "
        "0.1 (its gradient clipping at norm 10: scaffold_clip_norm 10); apfl's training "
        "mixture alpha v + alpha w",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_retired_fedprox(cls, data):
        if not isinstance(data, dict):
            return data
        retired = [
            *(["variant: 'fedprox'"] if data.get("variant") == "fedprox" else []),
            *(["prox_mu"] if "prox_mu" in data else []),
        ]
        if retired:
            mu = data.get("prox_mu", 0.1)  # the retired field's default
            raise ValueError(
                f"{' and '.join(retired)}: retired; write variant: fedavg and "
                f"federation.strategy: {{kind: fedprox, mu: {mu}}} (the library's FedProx, "
                "which any method can choose)"
            )
        return data

    @model_validator(mode="after")
    def _own_strategy(self):
        if self.variant in PERSONALISED and self.federation.strategy.stacks:
            raise ValueError(
                f"strategy: variant '{self.variant}' is a strategy of its own; "
                f"'{self.federation.strategy.kind}' does not stack on it"
            )
        return self

    @model_validator(mode="after")
    def _split(self):
        if self.shared is None:
            return self
        if len(set(self.shared)) != len(self.shared):
            raise ValueError(f"shared: {list(self.shared)} names a layer twice")
        fixed = {"fedavg", "fedavg_ft", "solo", *PERSONALISED}
        if self.variant in fixed and set(self.shared) != set(DEFAULT_SHARED[self.variant]):
            raise ValueError(
                f"shared: variant '{self.variant}' shares "
                f"{list(DEFAULT_SHARED[self.variant]) or 'nothing'} by definition"
            )
        if self.variant not in fixed and set(self.shared) in (set(), set(ALL_LAYERS)):
            raise ValueError(
                f"shared: variant '{self.variant}' needs both shared and local "
                f"layers, got {list(self.shared)}"
            )
        return self

    @model_validator(mode="after")
    def _projection(self):
        if self.net.projection is None and "projector" in (self.shared or ()):
            raise ValueError("shared: names 'projector' but net.projection is null (no P)")
        return self

    def check_sections(self, experiment) -> None:
        """The rounds ``personal.last_rounds`` averages must all be evaluated."""
        personal, every = getattr(experiment, "personal", None), self.personal_every
        if personal is not None and every > 1 and personal.last_rounds > every:
            raise ValueError(
                f"method.personal_every: {every} evaluates each of the last {every} rounds "
                f"only, and personal.last_rounds averages the last {personal.last_rounds}: "
                f"raise personal_every to {personal.last_rounds} or lower last_rounds"
            )

    @property
    def scaffold_eta_g(self) -> float:
        if self.scaffold_server_lr is not None:
            return self.scaffold_server_lr
        return 0.1 if self.fedrep_code else 1.0

    @property
    def shared_layers(self) -> tuple[str, ...]:
        return tuple(self.shared) if self.shared is not None else DEFAULT_SHARED[self.variant]


def personalised_suffix(p: MpFedconParams) -> str:
    """The settings that tell a personalised baseline's rows apart (and FedRep's code mode)."""
    if p.variant == "scaffold":
        mode = "FedRep code" if p.fedrep_code else "canonical"
        return f" ({mode}, η_g={p.scaffold_eta_g:g})"
    if p.variant == "apfl":
        alpha = "learned" if p.apfl_adaptive else f"{p.apfl_alpha:g}"
        return f" (α={alpha}{', FedRep code' if p.fedrep_code else ''})"
    if p.variant == "ditto":
        return f" (λ={p.ditto_lambda:g})"
    return " (FO)" if p.perfedavg_order == "first_order" else " (HF)"


@register
class MpFedcon(Method):
    name = "mpfedcon"
    label = "MpFedcon"
    params = MpFedconParams
    steps = (
        Step(
            "train",
            reads=("partition", "method"),
            plots=("rounds.tsv",),
            runner=Hook("fedssl.methods.mpfedcon.run", "train"),
        ),
    )
    flower_steps = {"train": Hook("fedssl.methods.mpfedcon.run", "flower_federation")}
    evaluation_sections = ("personal",)
    personal_inputs = ("train",)
    costs_inputs = ("train",)
    client_costs_hook = Hook("fedssl.methods.mpfedcon.costs", "client_costs")
    report_tables = Hook("fedssl.methods.mpfedcon.tables", "paper_tables")

    def row_label(self, params) -> str:
        label = LABELS[params.variant]
        if params.federation.strategy.stacks:  # FedAvg + FedProx is FedProx
            title = params.federation.strategy.title
            label = title if params.variant == "fedavg" else f"{label} + {title}"
        if params.variant == "mpfedcon":
            label += f" (μ={params.mu:g})"
        if params.variant in PERSONALISED:
            label += personalised_suffix(params)
        if params.upload_noise is not None:
            kind = {"gaussian": "G", "laplace": "L"}[params.upload_noise.kind]
            label += f" + {kind} {params.upload_noise.variance:g}"
        if params.shared is not None and params.shared_layers != DEFAULT_SHARED[params.variant]:
            label += f" [shared: {'+'.join(params.shared_layers)}]"
        return label

    def arch(self, params) -> str:
        n = params.net
        base = (
            f"cnn{'-'.join(map(str, n.conv_channels))}" if n.base == "cnn" else "mlp"
        ) + f"-fc{'-'.join(map(str, n.hidden))}"
        proj = f"P{n.projection[0]}-{n.projection[1]}" if n.projection else "noP"
        return f"{base}/{proj}/O"
