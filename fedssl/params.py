"""Parameter models: the single source of truth for every setting of every stage.

Files under ``params/`` (read by :mod:`fedssl.presets`):

* ``datasets/<name>.yaml``    -> :class:`DatasetParams`   (one prepared data set)
* ``partitions/<name>.yaml``  -> :class:`PartitionParams` (one client split of a data set)
* ``experiments/<name>.yaml`` -> the experiment model (title, partition, the method's section,
  evaluation): :func:`fedssl.experiment.experiment_model`, built from the sections here
* ``grids.yaml``              -> :class:`GridsParams` (paper grids: axes expanded into presets)
* ``pipelines.yaml``          -> :class:`PipelinesParams` (the experiments each pipeline runs)

The experiment's ``method`` section is a discriminated union (on ``name``) of the params models
that the registered methods (:mod:`fedssl.methods`) declare, so each method validates only the
fields it reads; that union sits above the registry, in :mod:`fedssl.experiment`. Shared
building blocks (the encoder, augmentation, probes) live here, below every method.
This module imports no torch: the front ends validate everything before any compute.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    create_model,
    model_validator,
)
from pydantic.fields import FieldInfo

from fedssl.data.catalog import datasets
from fedssl.stage.record import ParamsError

NAME_PATTERN = r"^[a-z0-9_]+$"  # preset names become stage names in Snakemake and DVC
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
Fraction = Annotated[float, Field(gt=0.0, le=1.0)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]


class Strict(BaseModel):
    """Every params model: no unknown keys, no infinite or NaN number, and no YAML boolean
    (``yes``, ``on``, ``true``) where a number or a name is meant (pydantic reads True as 1)."""

    # a field's docstring (a string under it) is its description, in the schemas and the site
    model_config = ConfigDict(
        extra="forbid", frozen=True, allow_inf_nan=False, use_attribute_docstrings=True
    )

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, data):
        for key, value in data.items() if isinstance(data, dict) else ():
            field = cls.model_fields.get(key)
            if field is not None and _holds_bool(value) and not _admits_bool(field.annotation):
                raise ValueError(
                    f"{key}: {value!r} is a yes/no value where a number or a name is meant "
                    f"(YAML reads yes, no, on, off, true and false as booleans)"
                )
        return data


def _holds_bool(value) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_holds_bool(v) for v in value)
    return isinstance(value, bool)


def _admits_bool(annotation) -> bool:
    """Whether a field's type accepts a boolean (bool or Any anywhere in it)."""
    if annotation is bool or annotation is Any:
        return True
    return any(_admits_bool(a) for a in typing.get_args(annotation) if not isinstance(a, str))


# The longest run a params file may ask for: a mistyped count (rounds: 1000000000000) is refused
# at planning instead of running until it is killed.
MAX_ROUNDS = 100_000
Rounds = Annotated[int, Field(ge=1, le=MAX_ROUNDS)]  # where training is meant
RoundCount = Annotated[int, Field(ge=0, le=MAX_ROUNDS)]  # where 0 means something (untrained)


Momentum = Annotated[float, Field(ge=0.0, lt=1.0)]
ParallelClients = Literal["auto", "on", "off"]
PARALLEL_CLIENTS_HELP = (
    "train clients together with torch.func.vmap (models without BN running "
    "stats only); auto = on CUDA, off on CPU where grouped convolutions are "
    "slower"
)

FEDERATION_HELP = "the federation settings: rounds, clients per round, local training, strategy"
# a method's padded random crop (its ``augment: crop_flip``)
CropPadding = Annotated[
    NonNegativeInt, Field(description="zero padding in pixels on each side before the random crop")
]

# Every setting a federation block may read, declared once: its type and meaning. A method
# names those it reads and their defaults (its paper's) with :func:`federation`.
FEDERATION_FIELDS: dict[str, tuple[Any, str]] = {
    "rounds": (Rounds, f"communication rounds (1 to {MAX_ROUNDS})"),
    "client_fraction": (Fraction, "clients sampled each round"),
    "lr": (PositiveFloat, "the clients' (peak) learning rate"),
    "local_epochs": (PositiveInt, "local epochs per round"),
    "batch_size": (PositiveInt, "a client's images per local step"),
    "optimizer": (Literal["adam", "sgd"], "the clients' optimizer"),
    "lr_schedule": (Literal["constant", "cosine"], "the learning rate over rounds"),
    "momentum": (Momentum, "SGD momentum"),
    "weight_decay": (NonNegativeFloat, "L2 weight decay"),
    "parallel_clients": (ParallelClients, PARALLEL_CLIENTS_HELP),
}


class FederationSettings(Strict):
    """The settings every federation runs with: rounds, the fraction of clients sampled and the
    clients' learning rate. A method's block of them (its top level or a section such as ``cfl``
    or ``training``) is built by :func:`fedssl.strategies.choices.federation_block`, which adds
    the common settings it reads from one catalogue (:data:`FEDERATION_FIELDS`), each at the
    method's default (:func:`federation_block`), and the choice of a library strategy;
    :func:`fedssl.fl.state.federation_config` turns any of them into the engine's
    configuration."""

    rounds: Rounds = Field(description=FEDERATION_FIELDS["rounds"][1])
    client_fraction: Fraction = Field(1.0, description=FEDERATION_FIELDS["client_fraction"][1])
    lr: PositiveFloat = Field(description=FEDERATION_FIELDS["lr"][1])
    monitor_every: NonNegativeInt = Field(
        0,
        description="rounds between k-NN monitor evaluations of the global encoder, logged "
        "in the round log (0 = off; the last round is always evaluated otherwise)",
    )


def federation_block(**settings: Any) -> type[FederationSettings]:
    """A federation block with the common settings a method reads, at its defaults.

    Each keyword names a setting of :data:`FEDERATION_FIELDS` (``rounds``, ``client_fraction``
    and ``lr`` are always there); its value is the default (``...``: required), or a
    ``Field(...)`` giving the paper's symbol and default, or ``(type, Field(...))`` narrowing
    the catalogue's type (``rounds`` >= 1, a schedule only one method has)."""
    fields = {}
    for name, value in settings.items():
        kind, meaning = FEDERATION_FIELDS[name]
        if isinstance(value, tuple):
            kind, value = value
        if not isinstance(value, FieldInfo):
            value = Field(value)
        # the catalogue's meaning under the method's own Field (its description wins): set on
        # the FieldInfo afterwards, pydantic's merge of the two dropped it from every schema
        fields[name] = (Annotated[kind, Field(description=meaning)], value)
    return create_model("Federation", __base__=FederationSettings, **fields)


def federation_path(model: type[BaseModel], prefix: str = "method") -> str | None:
    """The dotted path of the federation block in a method's params model
    (``method.federation``, or a phase's), found by its type; None: it federates nothing."""
    for name, field in model.model_fields.items():
        kind = field.annotation
        if not (isinstance(kind, type) and issubclass(kind, BaseModel)):
            continue
        if issubclass(kind, FederationSettings):
            return f"{prefix}.{name}"
        inner = federation_path(kind, f"{prefix}.{name}")
        if inner is not None:
            return inner
    return None


def federation_of(params: BaseModel) -> FederationSettings | None:
    """The federation block of validated method params (at :func:`federation_path`)."""
    path = federation_path(type(params))
    if path is None:
        return None
    for name in path.split(".")[1:]:
        params = getattr(params, name)
    return params


# --------------------------------------------------------------------------- data sets
DatasetName = Literal[tuple(datasets())]  # the registry's data sets, in registration order


class DatasetParams(Strict):
    """Where a data set is read from; the prepare stage writes it once as a uint8 artifact."""

    name: DatasetName
    """a registered data set (fedssl.data)"""
    data_root: str | None = Field(
        None,
        description="folder holding the data set in its usual "
        "on-disk layout; None = the default place for this data set",
    )
    download: bool = Field(False, description="let torchvision download it (needs internet)")


# --------------------------------------------------------------------------- partitions
class IIDScheme(Strict):
    deals_all: ClassVar[bool] = True  # whether every sample of the pool goes to a client
    kind: Literal["iid"] = "iid"


class DirichletScheme(Strict):
    """Per-class Dirichlet split: each class is spread over clients by Dir(alpha)."""

    deals_all: ClassVar[bool] = True  # whether every sample of the pool goes to a client
    kind: Literal["dirichlet"] = "dirichlet"
    alpha: PositiveFloat = Field(description="concentration xi; small = skewed, large = near IID")
    min_per_client: NonNegativeInt = Field(0, description="redraw until every client has this many")


class ShardsScheme(Strict):
    """Every client holds samples of exactly ``classes_per_client`` classes (label shards)."""

    deals_all: ClassVar[bool] = True  # whether every sample of the pool goes to a client
    kind: Literal["shards"] = "shards"
    classes_per_client: PositiveInt
    """label classes each client holds"""


class ClassGroupsScheme(Strict):
    """CP-CFL: equal client groups with overlapping class sets; per client, ``major_classes``
    of its group's classes get ``major_count`` samples and the rest ``minor_count``."""

    deals_all: ClassVar[bool] = False  # whether every sample of the pool goes to a client
    kind: Literal["class_groups"] = "class_groups"
    groups: list[list[NonNegativeInt]] = Field(
        default_factory=lambda: [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    )
    """each group's classes; the clients are split evenly over the groups"""
    major_classes: PositiveInt = 2
    """classes of its group a client holds many samples of"""
    major_count: PositiveInt = 20
    """samples of each of a client's major classes"""
    minor_count: NonNegativeInt = 5
    """samples of each other class of its group"""


class CyclicLognormalScheme(Strict):
    """FedRep's FEMNIST sampler (MpFedcon's (150, 3)): client ``i`` holds the classes
    ``(i + j) mod C`` for ``j < classes_per_client``, ``lognormal(mean, sigma) + offset`` samples
    split evenly over them, dealt from each class's shuffled samples (reshuffled when a class
    runs out, so clients share samples only then)."""

    deals_all: ClassVar[bool] = False  # whether every sample of the pool goes to a client
    kind: Literal["cyclic_lognormal"] = "cyclic_lognormal"
    classes_per_client: PositiveInt
    """consecutive classes (mod C) each client holds"""
    lognormal_mean: float = 4.0
    """mean of the log of a client's sample count"""
    lognormal_sigma: NonNegativeFloat = 1.0
    """SD of the log of a client's sample count"""
    size_offset: NonNegativeFloat = 100.0
    """samples added to every client's lognormal draw"""


PartitionScheme = Annotated[
    IIDScheme | DirichletScheme | ShardsScheme | ClassGroupsScheme | CyclicLognormalScheme,
    Field(discriminator="kind"),
]


class ClientTestSplit(Strict):
    """Per-client test sets with each client's training class mix (personalised evaluation)."""

    per_client: PositiveInt | None = Field(
        None,
        description="test images per client, spread over its classes in proportion to "
        "its training data; None = exactly its training counts per class",
    )
    fraction: PositiveFloat | None = Field(
        None,
        description="test images per client = this fraction of its training images "
        "(e.g. 1/9 for a 90/10 split), spread like per_client; exclusive with per_client",
    )
    disjoint: bool = Field(False, description="no test image goes to two clients")
    validation_per_client: PositiveInt | None = Field(
        None,
        description="also this many validation images per client, spread over its classes "
        "like per_client's test images, drawn (their own seed; disjoint as the test images "
        "are) from the training images no client and no server slice holds: what a "
        "learning rate is chosen on, never the test split (personal_top1_val). None = none",
    )

    @model_validator(mode="after")
    def _one_size(self):
        if self.per_client is not None and self.fraction is not None:
            raise ValueError("set per_client or fraction, not both")
        return self


class PartitionParams(Strict):
    dataset: Name = Field(description="name of a params/datasets preset")
    num_clients: PositiveInt
    """clients the training split is dealt to"""
    scheme: PartitionScheme
    """how the samples are dealt, chosen by its kind"""
    subset: PositiveInt | None = Field(
        None, description="split a class-stratified random subset of this many training samples"
    )
    client_tests: ClientTestSplit | None = Field(
        None, description="also give every client a test split (personalised evaluation)"
    )
    server_holdout: PositiveInt | None = Field(
        None,
        description="keep a class-stratified slice of this many training samples out of "
        "the clients' data, for the server (public pretraining data, a calibration set)",
    )
    server_holdout_seed: int | None = Field(
        None,
        description="seed of the server's slice; None = seed + 1. Fix it to keep one "
        "server slice (and what the server computed from it) across client resamplings",
    )
    seed: int = 0
    """seed of the split (and of the subset)"""
    label: str | None = Field(
        None,
        description="the partition's column in reports; none: the data set and its split "
        "(e.g. 'F-MNIST ξ=0.1'). Name what the split leaves out, such as the client count",
    )


# --------------------------------------------------------------------------- shared pieces
class ModelParams(Strict):
    """An encoder of :mod:`fedssl.models.encoders` and its SimCLR projection head."""

    arch: Literal["small_cnn", "resnet18", "pixels"] = Field(
        description="pixels = no encoder: the flattened image is the representation"
    )
    norm: Literal["bn", "gn"] = "gn"
    """normalisation layers: BatchNorm or GroupNorm"""
    channels_per_group: PositiveInt = Field(16, description="GroupNorm group size (Lambda)")
    width: PositiveInt = Field(32, description="channels of the first block")
    proj_hidden: PositiveInt = 256
    """hidden width of the projection head"""
    proj_dim: PositiveInt = 128
    """output width of the projection head (the loss's space)"""


class TrainsItsModel(Strict):
    """A method block whose ``model`` it trains: raw pixels have no weights to train."""

    @model_validator(mode="after")
    def _has_weights(self):
        if self.model.arch == "pixels":
            raise ValueError("model.arch 'pixels' has no weights to train: use method 'none'")
        return self


class AugmentParams(Strict):
    """SimCLR view generation; every sample draws its own parameters."""

    crop_scale: tuple[Fraction, Fraction] = (0.2, 1.0)
    """random resized crop: range of the area kept"""
    crop_ratio: tuple[PositiveFloat, PositiveFloat] = (3 / 4, 4 / 3)
    """random resized crop: range of the aspect ratio"""
    flip_p: Probability = 0.5
    """probability of a horizontal flip"""
    jitter_p: Probability = 0.8
    """probability of colour jitter"""
    brightness: NonNegativeFloat = 0.4
    """colour jitter: largest relative change of brightness"""
    contrast: NonNegativeFloat = 0.4
    """colour jitter: largest relative change of contrast"""
    saturation: NonNegativeFloat = 0.4
    """colour jitter: largest relative change of saturation"""
    hue: Annotated[float, Field(ge=0.0, le=0.5)] = 0.1
    """colour jitter: largest shift of hue (a fraction of the circle)"""
    grayscale_p: Probability = 0.2
    """probability of turning a view grey"""
    blur_p: Probability = 0.0
    """probability of a Gaussian blur"""
    blur_sigma: tuple[PositiveFloat, PositiveFloat] = (0.1, 2.0)
    """range of the blur's sigma, in pixels"""
    solarize_p: Probability = 0.0
    """probability of solarising a view"""

    @model_validator(mode="after")
    def _ordered(self):
        for name in ("crop_scale", "crop_ratio", "blur_sigma"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ValueError(f"{name}: lower bound {lo} exceeds upper bound {hi}")
        return self


PrecisionSetting = Literal["auto", "fp32", "fp32_channels_last", "bf16"]
PRECISION_HELP = (
    "what training and evaluation compute in: auto = bf16 autocast and "
    "channels-last where the device computes bf16 natively (CUDA, CPUs with "
    "AVX-512 BF16 or AMX), fp32 channels-last elsewhere; fp32 = plain fp32, contiguous "
    "(the code path of the results made before this setting); fp32_channels_last = plain "
    "fp32, channels-last (faster for convolutional steps); bf16 = that everywhere. "
    "Each stage records the precision it used (fedssl.precision)"
)


CompileSetting = Literal["off", "on", "auto"]
COMPILE_HELP = (
    "whether local training steps run through torch.compile: off = eager (every committed "
    "result); on = compiled; auto = compiled where the committed benchmark table of this CPU "
    "kind says it is faster for the model family and precision "
    "(results/bench/compiled_step/, fedssl.compiled). Agrees with eager within float "
    "rounding, not bit for bit"
)


class FeatureParams(Strict):
    layer: Literal["backbone", "projection"] = "backbone"
    """which output the probes read: the encoder's or the projection head's"""
    train_size: PositiveInt | None = Field(
        None, description="labelled training images for the probes (class-stratified); None = all"
    )
    batch_size: PositiveInt = 1024
    """images per forward pass when extracting"""
    validation_size: PositiveInt | None = Field(
        None,
        description="also a validation split of this many labelled training images "
        "(class-stratified, its own seed), held by no client, no server slice and not the "
        "probes' bank, which the same fitted probes score (linear_top1_val, knn_top1_val: "
        "what a learning rate is chosen on, never the test split); needs train_size. "
        "None = none",
    )

    @model_validator(mode="after")
    def _bank_leaves_room(self):
        if self.validation_size is not None and self.train_size is None:
            raise ValueError(
                "validation_size needs train_size: with train_size None the probes' bank "
                "holds every training image and none is left to validate on"
            )
        return self


class LinearProbeParams(Strict):
    epochs: PositiveInt = 100
    """passes over the labelled features"""
    lr: PositiveFloat = 1e-2
    """the probe's learning rate (Adam, cosine decay)"""
    weight_decay: NonNegativeFloat = 0.0
    """the probe's L2 weight decay"""
    batch_size: PositiveInt = 1024
    """features per step"""
    standardize: bool = Field(True, description="z-score features with train statistics first")
    seed: int = 0
    """seed of the probe's initialisation and batch order"""


class KnnParams(Strict):
    k: PositiveInt = 20
    """neighbours that vote (cosine similarity)"""
    temperature: PositiveFloat = Field(0.07, description="weights votes by exp(cos / T)")


def _light_augment() -> AugmentParams:
    return AugmentParams(crop_scale=(0.6, 1.0), jitter_p=0.0, grayscale_p=0.0)


class FinetuneParams(Strict):
    """Fine-tuning: the pretrained encoder and a new linear head trained end to end on the
    labelled training split (AdamW, linear warmup then cosine decay per step), top-1 on the
    test split. LW-FedSSL §5.1: lr 1e-3, 40 epochs with 10 of warmup, batch 256, weight decay
    1e-5; the paper's RandAugment is replaced by ``augment`` (crops and flips by default)."""

    epochs: PositiveInt = 40
    """passes over the labelled training split"""
    warmup_epochs: NonNegativeInt = 10
    """epochs of linear warmup before the cosine decay"""
    lr: PositiveFloat = 1e-3
    """peak learning rate (AdamW)"""
    weight_decay: NonNegativeFloat = 1e-5
    """AdamW weight decay"""
    batch_size: PositiveInt = 256
    """images per step"""
    train_size: PositiveInt | None = Field(
        None, description="labelled training images (class-stratified); None = all"
    )
    augment: AugmentParams = Field(default_factory=_light_augment)
    """views of the training images (light crops and flips by default)"""
    seed: int = 0
    """seed of the head's initialisation, batch order and views"""

    @model_validator(mode="after")
    def _warmup_fits(self):
        if self.warmup_epochs >= self.epochs:
            raise ValueError(
                f"warmup_epochs ({self.warmup_epochs}) must be below epochs ({self.epochs})"
            )
        return self


class PersonalEvalParams(Strict):
    """Personalised evaluation: every client's model on its own test split, every round."""

    last_rounds: PositiveInt = Field(10, description="accuracy averaged over the last rounds")
    checkpoints: tuple[Fraction, ...] = Field(
        (0.25, 0.5, 0.75, 1.0), description="fractions of the rounds to report accuracy at"
    )
    target: Annotated[float, Field(gt=0, le=100)] | None = Field(
        None, description="a mean accuracy (%): report the first round that reaches it"
    )


class NoiseParams(Strict):
    """I.i.d. zero-mean noise of a given variance on every value a party shares (the classic
    gradient-leakage defence, e.g. MpFedcon Tab. 4)."""

    kind: Literal["gaussian", "laplace"]
    """the noise's distribution"""
    variance: NonNegativeFloat
    """the noise's variance"""


# --------------------------------------------------------------------------- grids
AxisValues = list[Any] | dict[str, Any]


class Grid(Strict):
    """Presets of one kind expanded from axes: one per combination of the axes named in
    ``name``; each is ``extends`` with ``set`` merged over it, where ``{axis}`` in a string is
    the axis label and a string that is exactly ``{axis.value}`` is the axis value."""

    name: str = Field(description="pattern of the expanded names, e.g. cifar10_mfcl_{norm}_{xi}")
    extends: Annotated[str, Field(pattern=r"^([a-z0-9_]|\{[a-z0-9_]+\})+$")] | None = Field(
        None,
        description="the preset every member starts from, its `{axis}` placeholders filled "
        "(a sweep over several lines' own presets); none: `set` is a whole preset",
    )
    axes: dict[Name, AxisValues] = Field(
        default_factory=dict, description="axes of this grid only (shadow the shared ones)"
    )
    set: dict[str, Any] = Field(
        default_factory=dict, description="settings merged over the base, with placeholders"
    )
    overlays: list[Name] = Field(
        default_factory=list,
        description="axes whose values are partial presets, merged over "
        "the base in this order (before `set`): an axis of variants, e.g. ablations",
    )


class GridsParams(Strict):
    """``params/grids.yaml``: shared axes and the grids of partitions and experiments."""

    axes: dict[Name, AxisValues] = Field(
        default_factory=dict, description="axis -> labels (a list) or label -> value (a mapping)"
    )
    partitions: dict[Name, Grid] = Field(default_factory=dict)
    """grids of partition presets, by grid name"""
    experiments: dict[Name, Grid] = Field(default_factory=dict)
    """grids of experiment presets, by grid name"""


# --------------------------------------------------------------------------- pipelines
class PipelineSpec(Strict):
    """A pipeline whose report pivots on other rows or columns than method × partition."""

    experiments: list[Name | dict[Name, list[Name]]] = Field(
        description="experiments, grids (all their members), other pipelines (their "
        "experiments), or a grid's members selected by labels (``{grid: [label, ...]}``: the "
        "members whose axes carry every label)"
    )
    row: Literal["method", "title"] = Field(
        "method",
        description="what the pivot puts down: the method (runs of one method and "
        "column are repeats: mean ± std), or each experiment's title (ablations)",
    )
    column: str = Field(
        "partition",
        description="what the report's pivot table puts across: "
        "'partition' (data set and split, as MFCL Tab. 2) or a dotted path "
        "into the experiment params, e.g. method.client_module.cut",
    )


class PipelinesParams(Strict):
    """Pipeline name -> the experiments it runs (and reports in one table)."""

    pipelines: dict[Name, list[Name | dict[Name, list[Name]]] | PipelineSpec]
    """each pipeline: a list of experiments (or grids), or its spec"""

    @model_validator(mode="after")
    def _has_default(self):
        if "default" not in self.pipelines:
            raise ValueError("a pipeline named 'default' is required")
        return self

    def spec(self, name: str) -> PipelineSpec:
        entry = self.pipelines[name]
        return entry if isinstance(entry, PipelineSpec) else PipelineSpec(experiments=entry)


def setting(exp: BaseModel, dotted: str):
    """The value at a dotted path of validated params (e.g. ``method.client_module.cut``)."""
    value = exp
    for part in dotted.split("."):
        if not isinstance(value, BaseModel) or part not in type(value).model_fields:
            raise ParamsError(f"no setting '{dotted}' in the experiment params")
        value = getattr(value, part)
    return value


# --------------------------------------------------------------------------- JSON Schemas
SCHEMA_DIR = "schemas"


def _partial(node, suffix: str = "Partial"):
    """A copy of a JSON Schema where nothing is required (a preset that ``extends`` another
    sets only what differs): drops ``required``, turns discriminated ``oneOf`` into ``anyOf``
    (the discriminator itself may be inherited) and renames ``$defs`` references."""
    if isinstance(node, list):
        return [_partial(n, suffix) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in ("required", "discriminator"):
            continue
        if key == "$ref":
            out[key] = value + suffix
        elif key == "oneOf":
            out["anyOf"] = _partial(value, suffix)
        elif key == "$defs":
            out[key] = {name + suffix: _partial(d, suffix) for name, d in value.items()}
        else:
            out[key] = _partial(value, suffix)
    return out


def preset_schema(model: type[BaseModel]) -> dict:
    """The JSON Schema of a preset file: the whole model, or, with ``extends``, any part of it."""
    full = model.model_json_schema()
    defs = full.pop("$defs", {})
    partial = _partial({**full, "$defs": defs})
    partial_defs = partial.pop("$defs")
    extends = {
        "type": "string",
        "pattern": NAME_PATTERN,
        "description": "a preset of the same folder (or grid member) this one extends",
    }
    partial["properties"] = {"extends": extends, **partial["properties"]}
    root = model.__name__
    return {
        "title": full.get("title", root),
        "description": full.get("description", ""),
        "$defs": {**defs, **partial_defs, root: full, root + "Partial": partial},
        "if": {"required": ["extends"]},
        "then": {"$ref": f"#/$defs/{root}Partial"},
        "else": {"$ref": f"#/$defs/{root}"},
    }
