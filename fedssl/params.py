"""Parameter models: the single source of truth for every setting of every stage.

Three kinds of YAML file live under ``params/``:

* ``datasets/<name>.yaml``    -> :class:`DatasetParams`   (one prepared data set)
* ``partitions/<name>.yaml``  -> :class:`PartitionParams` (one client split of a data set)
* ``experiments/<name>.yaml`` -> :class:`ExperimentParams` (model, pretraining, evaluation)

plus ``pipelines.yaml`` (:class:`PipelinesParams`), which names the experiments each pipeline
runs. Experiments refer to a partition preset by name, and partitions to a data set preset, so
several experiments share one prepared data set and one partition (computed once).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, Union

import yaml
from pydantic import (BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt,
                      PositiveFloat, PositiveInt, ValidationError, model_validator)

PARAMS_DIR = Path("params")
NAME_PATTERN = r"^[a-z0-9_]+$"  # preset names become stage names in Snakemake and DVC
Fraction = Annotated[float, Field(gt=0.0, le=1.0)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ParamsError(ValueError):
    """A params file that cannot be used; the message names the file and the field."""


# --------------------------------------------------------------------------- data sets
DatasetName = Literal["fashion_mnist", "cifar10", "cifar100", "stl10", "tiny_imagenet"]


class DatasetParams(Strict):
    """Where a data set is read from; the prepare stage writes it once as a uint8 artifact."""
    name: DatasetName
    data_root: str | None = Field(None, description="folder holding the data set in its usual "
                                  "on-disk layout; None = the default place for this data set")
    download: bool = Field(False, description="let torchvision download it (needs internet)")


# --------------------------------------------------------------------------- partitions
class IIDScheme(Strict):
    kind: Literal["iid"] = "iid"


class DirichletScheme(Strict):
    """Per-class Dirichlet split: each class is spread over clients by Dir(alpha)."""
    kind: Literal["dirichlet"] = "dirichlet"
    alpha: PositiveFloat = Field(description="concentration xi; small = skewed, large = near IID")
    min_per_client: NonNegativeInt = Field(0, description="redraw until every client has this many")


class ShardsScheme(Strict):
    """Every client holds samples of exactly ``classes_per_client`` classes (label shards)."""
    kind: Literal["shards"] = "shards"
    classes_per_client: PositiveInt


class ClassGroupsScheme(Strict):
    """CP-CFL: equal client groups with overlapping class sets; per client, ``major_classes``
    of its group's classes get ``major_count`` samples and the rest ``minor_count``."""
    kind: Literal["class_groups"] = "class_groups"
    groups: list[list[NonNegativeInt]] = Field(
        default_factory=lambda: [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]])
    major_classes: PositiveInt = 2
    major_count: PositiveInt = 20
    minor_count: NonNegativeInt = 5


PartitionScheme = Annotated[Union[IIDScheme, DirichletScheme, ShardsScheme, ClassGroupsScheme],
                            Field(discriminator="kind")]


class PartitionParams(Strict):
    dataset: str = Field(pattern=NAME_PATTERN, description="name of a params/datasets preset")
    num_clients: PositiveInt
    scheme: PartitionScheme
    subset: PositiveInt | None = Field(
        None, description="split a class-stratified random subset of this many training samples")
    seed: int = 0


# --------------------------------------------------------------------------- experiments
class ModelParams(Strict):
    arch: Literal["small_cnn", "resnet18", "pixels"] = Field(
        description="pixels = no encoder: the flattened image is the representation")
    norm: Literal["bn", "gn"] = "gn"
    channels_per_group: PositiveInt = Field(16, description="GroupNorm group size (Lambda)")
    width: PositiveInt = Field(32, description="channels of the first block")
    proj_hidden: PositiveInt = 256
    proj_dim: PositiveInt = 128


class AugmentParams(Strict):
    """SimCLR view generation; every sample draws its own parameters."""
    crop_scale: tuple[Fraction, Fraction] = (0.2, 1.0)
    crop_ratio: tuple[PositiveFloat, PositiveFloat] = (3 / 4, 4 / 3)
    flip_p: Probability = 0.5
    jitter_p: Probability = 0.8
    brightness: NonNegativeFloat = 0.4
    contrast: NonNegativeFloat = 0.4
    saturation: NonNegativeFloat = 0.4
    hue: Annotated[float, Field(ge=0.0, le=0.5)] = 0.1
    grayscale_p: Probability = 0.2
    blur_p: Probability = 0.0
    blur_sigma: tuple[PositiveFloat, PositiveFloat] = (0.1, 2.0)
    solarize_p: Probability = 0.0

    @model_validator(mode="after")
    def _ordered(self):
        for name in ("crop_scale", "crop_ratio", "blur_sigma"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ValueError(f"{name}: lower bound {lo} exceeds upper bound {hi}")
        return self


class PretrainParams(Strict):
    method: Literal["fedsimclr", "mfcl", "none"] = Field(
        description="none = keep the seeded random initialisation (a reference row); mfcl = "
        "the settings of the experiment's `mfcl` section (only augment and seed apply here)")
    rounds: NonNegativeInt = 0
    local_epochs: PositiveInt = 1
    client_fraction: Fraction = 1.0
    batch_size: PositiveInt = 256
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: PositiveFloat = 1e-3
    lr_schedule: Literal["constant", "cosine"] = "constant"
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    weight_decay: NonNegativeFloat = 0.0
    temperature: PositiveFloat = 0.5
    augment: AugmentParams = AugmentParams()
    parallel_clients: Literal["auto", "on", "off"] = Field(
        "auto", description="train clients together with torch.func.vmap (models without BN "
        "running stats only); auto = on CUDA, off on CPU where grouped convolutions are slower")
    seed: int = 0


class FeatureParams(Strict):
    layer: Literal["backbone", "projection"] = "backbone"
    train_size: PositiveInt | None = Field(
        None, description="labelled training images for the probes (class-stratified); None = all")
    batch_size: PositiveInt = 1024


class LinearProbeParams(Strict):
    epochs: PositiveInt = 100
    lr: PositiveFloat = 1e-2
    weight_decay: NonNegativeFloat = 0.0
    batch_size: PositiveInt = 1024
    standardize: bool = Field(True, description="z-score features with train statistics first")
    seed: int = 0


class KnnParams(Strict):
    k: PositiveInt = 20
    temperature: PositiveFloat = Field(0.07, description="weights votes by exp(cos / T)")


# --------------------------------------------------------------------------- MFCL
class MfclClientModule(Strict):
    """The client module (encoder of Tab. 9 / Tab. 10) and its mirror decoder."""
    arch: Literal["resnet18", "resnet50"] = Field(
        description="resnet18 = 2-conv client module (Tab. 9), resnet50 = 4-conv (Tab. 10)")
    width: PositiveInt = Field(description="channels of the first conv (64 in the paper)")
    norm: Literal["tn", "gn", "bn"] = Field(description="Twin Norm, GroupNorm or BatchNorm")
    channels_per_group: PositiveInt = Field(16, description="Lambda for TN / GN")
    tn_variance: Literal["joint", "avg_of_views"] = Field(
        "joint", description="joint = Eq. 2; avg_of_views = the Tab. 18 snippet (ablation)")
    ae_pool: Literal["outside", "upsample", "downsampled_target"] = Field(
        "outside", description="where the MaxPool sits while training the autoencoder (A2)")
    cut: Annotated[int, Field(ge=1, le=7)] = Field(
        2, description="resnet18 only: client convs of the Tab. 1 sweep (A1); the rServer drops "
        "the (cut - 1) // 2 BasicBlocks they cover. 2 = Tab. 9")
    tn_eval_pair: Literal["self", "hflip"] = Field(
        "self", description="Twin Norm's twin for unpaired images at evaluation (A5): the image "
        "itself (= GroupNorm) or its horizontal flip")

    @model_validator(mode="after")
    def _cut_is_resnet18_only(self):
        # Tab. 10's ResNet-50 client module is a fixed 4-conv stem; the sweep is defined for R18.
        if self.arch == "resnet50" and self.cut != 2:
            raise ValueError(f"cut applies to arch resnet18 only (resnet50 has Tab. 10's fixed "
                             f"client module), got cut={self.cut}")
        return self


class MfclPhase1(Strict):
    """Phase 1: FedAvg of the client autoencoder at the gServer (Alg. 1, Tab. 12)."""
    rounds: NonNegativeInt = Field(description="T (15 in the paper); 0 = random client module")
    local_epochs: PositiveInt = 1
    batch_pairs: PositiveInt = Field(description="K samples per batch (2K twin views)")
    lr: PositiveFloat = Field(description="Adam learning rate (0.05 C10 / 0.001 Tiny)")
    adam_eps: PositiveFloat = 1e-7
    loss: Literal["bce", "mse"] = "bce"
    client_fraction: Fraction = 1.0
    secure_aggregation: bool = Field(
        False, description="pairwise masks: the gServer only sees the sum of the updates")


class MfclExport(Strict):
    """Phase 2 upload: rho pairs of twin views per sample through the frozen client module."""
    pairs: PositiveInt = Field(description="rho (8 in the paper)")
    client_dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(
        0.0, description="delta: fraction of clients (drawn once, seeded) that send nothing")
    bn_export_mode: Literal["eval", "train"] = Field(
        "eval", description="BN client modules: aggregated running stats or batch stats (A7)")
    batch_pairs: PositiveInt = Field(256, description="samples per export forward pass")
    tn_pairing: Literal["twin", "self"] = Field(
        "twin", description="Twin Norm at export: twin = a pair's two views share statistics "
        "(the paper); self = each view is paired with itself (ablation: nothing shared)")
    storage: Literal["tensors"] = Field(
        "tensors", description="tensors = the representations as fp16 arrays")


class MfclRServer(Strict):
    """Phase 2b: the rServer module (the remaining ResNet stages, BN) + projection head."""
    width: PositiveInt = Field(description="channels of the first residual stage (64 = R18)")
    proj_hidden: PositiveInt = Field(description="width of the two hidden Dense layers (Tab. 11)")
    proj_dim: PositiveInt = Field(128, description="output of the projection head")
    epochs: PositiveInt
    batch_pairs: PositiveInt = Field(description="N_s samples (2 N_s representations) per batch")
    lr: PositiveFloat = Field(1.0, description="LARS base learning rate lr0")
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    trust_coefficient: PositiveFloat = 0.001
    weight_decay: NonNegativeFloat = 1e-4
    warmup_epochs: NonNegativeInt = 10
    temperature: PositiveFloat = 0.5
    seed: int = 0

    @model_validator(mode="after")
    def _warmup_fits(self):
        if self.warmup_epochs > self.epochs:
            raise ValueError(f"warmup_epochs ({self.warmup_epochs}) exceeds epochs "
                             f"({self.epochs})")
        return self


class MfclParams(Strict):
    """MFCL with Twin Normalization (spec methods/mfcl.md): client module, phase 1, export,
    rServer. The linear probe reads the frozen client module + MaxPool + rServer module."""
    client_module: MfclClientModule
    phase1: MfclPhase1
    export: MfclExport
    rserver: MfclRServer


class ExperimentParams(Strict):
    title: str = Field(description="row label in the report")
    partition: str = Field(pattern=NAME_PATTERN, description="name of a params/partitions preset")
    model: ModelParams | None = Field(
        None, description="the encoder (required unless pretrain.method is mfcl, whose network "
        "is set in the mfcl section)")
    pretrain: PretrainParams
    features: FeatureParams
    linear_probe: LinearProbeParams
    knn: KnnParams
    mfcl: MfclParams | None = Field(None, description="required when pretrain.method is mfcl")

    @model_validator(mode="after")
    def _mfcl_section_matches_method(self):
        if self.pretrain.method == "mfcl":
            if self.mfcl is None:
                raise ValueError("pretrain.method 'mfcl' needs an mfcl section")
            if self.model is not None:
                raise ValueError("pretrain.method 'mfcl': leave out `model` (the network is "
                                 "set in mfcl.client_module and mfcl.rserver)")
            if self.pretrain.rounds:
                raise ValueError("pretrain.method 'mfcl': set mfcl.phase1.rounds, not "
                                 "pretrain.rounds")
            return self
        if self.mfcl is not None:
            raise ValueError(f"an mfcl section needs pretrain.method 'mfcl', not "
                             f"'{self.pretrain.method}'")
        if self.model is None:
            raise ValueError(f"pretrain.method '{self.pretrain.method}' needs a model section")
        return self

    @model_validator(mode="after")
    def _pixels_have_nothing_to_train(self):
        if self.model and self.model.arch == "pixels" and self.pretrain.method != "none":
            raise ValueError("model.arch 'pixels' has no weights: set pretrain.method to 'none'")
        return self


ExperimentName = Annotated[str, Field(pattern=NAME_PATTERN)]


class PipelineSpec(Strict):
    """A pipeline whose report pivots on other rows or columns than method × partition."""
    experiments: list[ExperimentName]
    row: Literal["method", "title"] = Field(
        "method", description="what the pivot puts down: the method (runs of one method and "
        "column are repeats: mean ± std), or each experiment's title (ablations)")
    column: str = Field("partition", description="what the report's pivot table puts across: "
                        "'partition' (data set and split, as MFCL Tab. 2) or a dotted path "
                        "into the experiment params, e.g. mfcl.client_module.cut")


class PipelinesParams(Strict):
    """Pipeline name -> the experiments it runs (and reports in one table)."""
    pipelines: dict[Annotated[str, Field(pattern=NAME_PATTERN)],
                    list[ExperimentName] | PipelineSpec]

    @model_validator(mode="after")
    def _has_default(self):
        if "default" not in self.pipelines:
            raise ValueError("a pipeline named 'default' is required")
        return self

    def spec(self, name: str) -> PipelineSpec:
        entry = self.pipelines[name]
        return entry if isinstance(entry, PipelineSpec) else PipelineSpec(experiments=entry)


def setting(exp: BaseModel, dotted: str):
    """The value at a dotted path of validated params (e.g. ``mfcl.client_module.cut``)."""
    value = exp
    for part in dotted.split("."):
        if not isinstance(value, BaseModel) or part not in type(value).model_fields:
            raise ParamsError(f"no setting '{dotted}' in the experiment params")
        value = getattr(value, part)
    return value


# --------------------------------------------------------------------------- loading
SCHEMAS: dict[str, type[Strict]] = {
    "dataset": DatasetParams, "partition": PartitionParams,
    "experiment": ExperimentParams, "pipelines": PipelinesParams,
}
SUBDIRS = {"dataset": "datasets", "partition": "partitions", "experiment": "experiments"}


def preset_path(kind: str, name: str, root: Path = PARAMS_DIR) -> Path:
    return root / SUBDIRS[kind] / f"{name}.yaml"


def _format_errors(path: Path, err: ValidationError) -> str:
    lines = [f"{path}: invalid parameters"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(file)"
        lines.append(f"  {where}: {e['msg']}")
    return "\n".join(lines)


EXTENDS = "extends"  # a preset may extend a sibling preset of the same kind (same folder)


def deep_merge(base: dict, override: dict) -> dict:
    """``override`` on top of ``base``: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in override.items():
        out[key] = (deep_merge(out[key], value) if isinstance(value, dict)
                    and isinstance(out.get(key), dict) else value)
    return out


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ParamsError(f"{path}: no such params file")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ParamsError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping of settings at the top level")
    return raw


def preset_chain(path: Path) -> list[tuple[Path, dict]]:
    """``path`` and the presets it extends, nearest first, each with its own (unmerged) YAML."""
    chain: list[tuple[Path, dict]] = []
    path = Path(path)
    while True:
        if path in [p for p, _ in chain]:
            cycle = " -> ".join(p.stem for p, _ in chain) + f" -> {path.stem}"
            raise ParamsError(f"{chain[0][0]}: {EXTENDS}: cycle {cycle}")
        raw = _read_yaml(path)
        chain.append((path, raw))
        base = raw.get(EXTENDS)
        if base is None:
            return chain
        if not isinstance(base, str) or not re.match(NAME_PATTERN, base):
            raise ParamsError(f"{path}: {EXTENDS}: expected the name of a preset in "
                              f"{path.parent}, got {base!r}")
        if not (path.parent / f"{base}.yaml").is_file():
            raise ParamsError(f"{path}: {EXTENDS}: no preset '{base}' in {path.parent}")
        path = path.parent / f"{base}.yaml"


def load_file(path: Path, model: type[Strict]):
    """Read and validate one YAML file (merged over the presets it ``extends``); any problem
    raises ParamsError naming file and field."""
    path = Path(path)
    merged: dict = {}
    for _, raw in reversed(preset_chain(path)):
        merged = deep_merge(merged, {k: v for k, v in raw.items() if k != EXTENDS})
    try:
        return model.model_validate(merged)
    except ValidationError as e:
        raise ParamsError(_format_errors(path, e)) from None


def load_preset(kind: str, name: str, root: Path = PARAMS_DIR):
    return load_file(preset_path(kind, name, root), SCHEMAS[kind])


def load_pipelines(root: Path = PARAMS_DIR) -> PipelinesParams:
    return load_file(root / "pipelines.yaml", PipelinesParams)


def check_partition_fits(part: PartitionParams, part_path: Path, train_size: int) -> None:
    """Cross-file check: a partition cannot have more clients than it has samples."""
    available = min(part.subset or train_size, train_size)
    if part.subset and part.subset > train_size:
        raise ParamsError(f"{part_path}: subset: {part.subset} exceeds the {train_size} "
                          f"training samples of data set '{part.dataset}'")
    if part.num_clients > available:
        raise ParamsError(f"{part_path}: num_clients: {part.num_clients} clients but only "
                          f"{available} samples to split")


# --------------------------------------------------------------------------- JSON Schemas
SCHEMA_DIR = Path("schemas")


def json_schemas() -> dict[str, str]:
    """File name -> JSON Schema text, generated from the models above (for editors and tests)."""
    import json
    return {f"{kind}.schema.json": json.dumps(model.model_json_schema(), indent=2) + "\n"
            for kind, model in SCHEMAS.items()}


if __name__ == "__main__":
    SCHEMA_DIR.mkdir(exist_ok=True)
    for name, text in json_schemas().items():
        (SCHEMA_DIR / name).write_text(text)
        print(f"wrote {SCHEMA_DIR / name}")
