"""Reading params presets: YAML files, ``extends`` chains and grids, validated by the models of
:mod:`fedssl.params`; and the raw keys each stage reads, which both front ends compare.

A preset is ``params/<kind>s/<name>.yaml`` or a member of a grid in ``params/grids.yaml``. A
preset may start with ``extends: <another preset of the same kind>`` and then set only what
differs (mappings merge key by key, anything else replaces). A grid member is its grid's
``extends`` preset with the grid's ``set`` merged over it, placeholders filled from its axes.

What a stage reads is tracked as DVC params entries: for every *layer* the preset is made of
(each file of the chain, and for a grid member its block of ``grids.yaml``), the keys of that
layer that the stage reads and the layer sets itself. Snakemake fingerprints exactly these raw
values too, and defaults are code (the params models are among every stage's code
dependencies), so both front ends rerun a stage on the same edits.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from fedssl import params as P
from fedssl.data.catalog import dataset_spec, raw_train_size
from fedssl.stage.record import ParamsError, did_you_mean, lookup, read_yaml

PARAMS_DIR = Path("params")
# An override run (`fedssl run EXP key=value`) is an experiment of its own, ``EXP@<hash>``: its
# file here holds the settings merged over EXP as its nearest layer. Named by what it sets, so
# the same overrides find the same run, and never EXP's results (git-ignored, as artifacts/ is).
DERIVED_DIR = Path("artifacts/.overrides")
DERIVED_SEP = "@"
EXTENDS = "extends"
GRIDS_FILE = "grids.yaml"
PIPELINES_FILE = "pipelines.yaml"
KINDS = {"dataset": "datasets", "partition": "partitions", "experiment": "experiments"}
GRID_SECTIONS = {"partition": "partitions", "experiment": "experiments"}
EXPERIMENT_MODEL = "fedssl.experiment"


def model_of(kind: str) -> type[BaseModel]:
    """The params model of a preset kind. The experiment model (every method's params) is
    imported by name: a stage that loads a data set's or a partition's params does not run it,
    and the planner names it among the code of the stages that load an experiment's."""
    if kind in ("dataset", "partition"):
        return {"dataset": P.DatasetParams, "partition": P.PartitionParams}[kind]
    return importlib.import_module(EXPERIMENT_MODEL).experiment_model()


def deep_merge(base: dict, override: dict) -> dict:
    """``override`` on top of ``base``: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in override.items():
        out[key] = (
            deep_merge(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


def has_key(tree, dotted: str) -> bool:
    try:
        lookup(tree, dotted)
        return True
    except KeyError:
        return False


def _format_errors(where: str, err: ValidationError) -> str:
    lines = [f"{where}: invalid parameters"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(file)"
        lines.append(f"  {loc}: {_message(e)}")
    return "\n".join(lines)


def _message(error: dict) -> str:
    """Pydantic's message; for a mistyped ``name`` of a union (a method, a strategy), the
    names nearest it first."""
    if error["type"] != "union_tag_invalid":
        return error["msg"]
    tag, expected = str(error["ctx"]["tag"]), error["ctx"]["expected_tags"]
    near = did_you_mean(tag, re.findall(r"'([^']*)'", expected))
    return f"'{tag}' is not a known name{near}; known: {expected}"


# ---------------------------------------------------------------------------- layers
@dataclass
class Layer:
    """One source of a preset's settings: ``raw`` sits at ``prefix`` of ``file``; ``always``
    are keys of that file that decide the preset whatever a stage reads (``extends``, the
    values of a grid member's axes)."""

    file: Path
    prefix: str
    raw: dict
    always: list[str] = field(default_factory=list)

    def key(self, dotted: str) -> str:
        return ".".join(p for p in (self.prefix, dotted) if p)


@dataclass
class Resolved:
    kind: str
    name: str
    where: str  # what an error message names: the file (and grid)
    merged: dict
    layers: list[Layer]


class Presets:
    """All presets under one params folder (files and grid members), loaded lazily."""

    def __init__(self, root: Path = PARAMS_DIR):
        self.root = Path(root)
        self._resolved: dict[tuple[str, str], Resolved] = {}
        self._validated: dict[tuple[str, str], BaseModel] = {}
        self._grids: P.GridsParams | None = None
        self._members: dict[str, dict[str, tuple[str, dict[str, str]]]] = {}

    # ------------------------------------------------------------------ files and grids
    def path(self, kind: str, name: str) -> Path:
        return self.root / KINDS[kind] / f"{name}.yaml"

    @property
    def grids_path(self) -> Path:
        return self.root / GRIDS_FILE

    def grids(self) -> P.GridsParams:
        if self._grids is None:
            self._grids = (
                self._validate(P.GridsParams, read_yaml(self.grids_path), str(self.grids_path))
                if self.grids_path.exists()
                else P.GridsParams()
            )
        return self._grids

    def grid_members(self, kind: str) -> dict[str, tuple[str, dict[str, str]]]:
        """Member name -> (its grid, axis labels), for the grids of ``kind``."""
        if kind not in self._members:
            self._members[kind] = self._expand_grids(kind)
        return self._members[kind]

    def _expand_grids(self, kind: str) -> dict[str, tuple[str, dict[str, str]]]:
        grids = self.grids()
        members: dict[str, tuple[str, dict[str, str]]] = {}
        for gname, grid in getattr(grids, GRID_SECTIONS[kind]).items():
            axes = _placeholders(grid.name)
            labels = [list(self._axis(grids, grid, gname, kind, a)) for a in axes]
            for combo in itertools.product(*labels):
                member = _fill(grid.name, dict(zip(axes, combo)), {})
                where = f"{self.grids_path}: {GRID_SECTIONS[kind]}.{gname}.name"
                if not re.match(P.NAME_PATTERN, member):
                    raise ParamsError(f"{where}: expands to '{member}', not a valid name")
                if member in members or self.path(kind, member).exists():
                    raise ParamsError(f"{where}: '{member}' is defined twice")
                members[member] = (gname, dict(zip(axes, combo)))
        return members

    def _axis(self, grids, grid, gname: str, kind: str, axis: str) -> dict:
        """An axis as label -> value (a list's labels are their own values)."""
        values = grid.axes.get(axis, grids.axes.get(axis))
        if values is None:
            raise ParamsError(
                f"{self.grids_path}: {GRID_SECTIONS[kind]}.{gname}.name: no axis "
                f"'{axis}' (shared axes: {', '.join(grids.axes) or 'none'})"
            )
        return dict(values) if isinstance(values, dict) else {str(v): v for v in values}

    def names(self, kind: str) -> list[str]:
        """Every preset of a kind: its files, then the grid members."""
        files = sorted(p.stem for p in (self.root / KINDS[kind]).glob("*.yaml"))
        grid = list(self.grid_members(kind)) if kind in GRID_SECTIONS else []
        return files + grid

    # ------------------------------------------------------------------ resolution
    def resolve(self, kind: str, name: str, by: str | None = None) -> Resolved:
        """A preset's merged settings and the layers they come from (nearest first). ``by``:
        where the name was read (file and field), named when there is no such preset."""
        if kind != "experiment" or DERIVED_SEP not in name:
            return self._resolve(kind, name, [], by)
        base, overrides = derived_from(name), overrides_of(name)
        resolved = self._resolve(kind, base, [], by)
        return Resolved(
            kind,
            name,
            f"{resolved.where} with the command line's overrides",
            deep_merge(resolved.merged, overrides),
            [Layer(derived_file(name), name, overrides), *resolved.layers],
        )

    def _resolve(self, kind: str, name: str, visiting: list[str], where: str | None):
        key = (kind, name)
        if key in self._resolved:
            return self._resolved[key]
        if name in visiting:
            cycle = " -> ".join([*visiting, name])
            raise ParamsError(f"{self.path(kind, visiting[0])}: {EXTENDS}: cycle {cycle}")
        path = self.path(kind, name)
        if path.is_file():
            resolved = self._resolve_file(kind, path, [*visiting, name])
        elif kind in GRID_SECTIONS and name in self.grid_members(kind):
            resolved = self._resolve_member(kind, name, [*visiting, name])
        else:
            grids = f" or {self.grids_path}" if kind in GRID_SECTIONS else ""
            near = did_you_mean(name, self.names(kind))
            raise ParamsError(
                f"{where}: no preset '{name}' in {path.parent}{grids}{near}"
                if where
                else f"{path}: no such params file (no {kind} preset '{name}' in "
                f"{path.parent}{grids}){near}"
            )
        self._resolved[key] = resolved
        return resolved

    def _resolve_file(self, kind: str, path: Path, visiting: list[str]) -> Resolved:
        raw = read_yaml(path)
        own = {k: v for k, v in raw.items() if k != EXTENDS}
        layer = Layer(path, "", raw, [EXTENDS] if EXTENDS in raw else [])
        if EXTENDS not in raw:
            return Resolved(kind, path.stem, str(path), own, [layer])
        base = raw[EXTENDS]
        if not isinstance(base, str) or not re.match(P.NAME_PATTERN, base):
            raise ParamsError(
                f"{path}: {EXTENDS}: expected the name of a preset in {path.parent}, got {base!r}"
            )
        parent = self._resolve(kind, base, visiting, f"{path}: {EXTENDS}")
        return Resolved(
            kind, path.stem, str(path), deep_merge(parent.merged, own), [layer, *parent.layers]
        )

    def _resolve_member(self, kind: str, name: str, visiting: list[str]) -> Resolved:
        gname, labels = self.grid_members(kind)[name]
        grids = self.grids()
        grid = getattr(grids, GRID_SECTIONS[kind])[gname]
        section = f"{GRID_SECTIONS[kind]}.{gname}"
        values, always = {}, [f"{section}.{EXTENDS}"] if grid.extends else []
        for axis, label in labels.items():
            values[axis] = self._axis(grids, grid, gname, kind, axis)[label]
            local = axis in grid.axes
            if isinstance(grid.axes[axis] if local else grids.axes[axis], dict):
                always.append(f"{section}.axes.{axis}.{label}" if local else f"axes.{axis}.{label}")
        where = f"{self.grids_path} ({section}: {name})"
        overlay: dict = {}
        for axis in grid.overlays:
            if axis not in values or not isinstance(values[axis], dict):
                raise ParamsError(
                    f"{self.grids_path}: {section}.overlays: '{axis}' is not an "
                    f"axis of the grid's name whose values are mappings"
                )
            overlay = deep_merge(overlay, values[axis])
        try:
            overlay = deep_merge(overlay, _fill(grid.set, labels, values))
        except ParamsError as e:
            raise ParamsError(f"{self.grids_path}: {section}.set: {e}") from None
        own = Layer(self.grids_path, f"{section}.set", grid.set, always)
        if not grid.extends:
            return Resolved(kind, name, where, overlay, [own])
        try:
            base = _fill(grid.extends, labels, values)
        except ParamsError as e:
            raise ParamsError(f"{self.grids_path}: {section}.{EXTENDS}: {e}") from None
        parent = self._resolve(kind, base, visiting, f"{self.grids_path}: {section}.{EXTENDS}")
        return Resolved(
            kind, name, where, deep_merge(parent.merged, overlay), [own, *parent.layers]
        )

    def base_of(self, kind: str, name: str) -> str | None:
        """The preset a grid member extends (its placeholders filled), or a file's ``extends``."""
        if name in self.grid_members(kind):
            grid, labels = self.grid_members(kind)[name]
            extends = getattr(self.grids(), GRID_SECTIONS[kind])[grid].extends
            return None if extends is None else _fill(extends, labels, {})
        path = self.path(kind, name)
        return read_yaml(path).get(EXTENDS) if path.is_file() else None

    def load(self, kind: str, name: str, by: str | None = None):
        """The validated params of a preset; any problem raises ParamsError naming the file
        and the field (and ``by``, where a missing preset's name was read)."""
        key = (kind, name)
        if key not in self._validated:
            r = self.resolve(kind, name, by)
            self._validated[key] = self._validate(model_of(kind), r.merged, r.where)
        return self._validated[key]

    @staticmethod
    def _validate(model, raw: dict, where: str):
        try:
            return model.model_validate(raw)
        except ValidationError as e:
            raise ParamsError(_format_errors(where, e)) from None

    # ------------------------------------------------------------------ what stages read
    def tracked(self, kind: str, name: str, reads: tuple[str, ...] | None) -> dict:
        """DVC params entries of a stage reading ``reads`` (dotted keys; None = everything)
        of a preset: file -> the keys it sets itself (None = the whole file)."""
        entries: dict[str, list[str] | None] = {}
        for lay in self.resolve(kind, name).layers:
            if reads is None and not lay.prefix:
                entries[str(lay.file)] = None
                continue
            keys = [
                lay.key(r)
                for r in (reads if reads is not None else ("",))
                if has_key(lay.raw, r) and (r or lay.prefix)
            ]
            keys += lay.always
            if keys and entries.get(str(lay.file), []) is not None:
                entries.setdefault(str(lay.file), [])
                entries[str(lay.file)] += [k for k in keys if k not in entries[str(lay.file)]]
        return entries

    # ------------------------------------------------------------------ pipelines
    def pipelines(self) -> P.PipelinesParams:
        path = self.root / PIPELINES_FILE
        return self._validate(P.PipelinesParams, read_yaml(path), str(path))

    def pipeline_experiments(self, pipeline: str, within: tuple[str, ...] = ()) -> list[str]:
        """The experiments a pipeline runs, its grid entries expanded (in axis order) and
        selected, another pipeline's name standing for its experiments (:meth:`_entry_members`;
        ``within``: the pipelines naming this one, refused if it names itself again)."""
        if pipeline in within:
            raise ParamsError(
                f"{self.root / PIPELINES_FILE}: pipelines name each other in a cycle: "
                + " -> ".join((*within, pipeline))
            )
        out: list[str] = []
        for entry in self.pipelines().spec(pipeline).experiments:
            names = self._entry_members((*within, pipeline), entry)
            out += [n for n in names if n not in out]
        return out

    def _entry_members(self, path: tuple[str, ...], entry: str | dict[str, list[str]]) -> list[str]:
        """An entry of the last pipeline of ``path``: an experiment's name, a grid's members,
        a pipeline's experiments (a board made of its parts), or (``{grid: labels}``) the
        members of a grid selected by labels: on every axis that one of ``labels`` belongs to,
        the member's label is one of them (``[dir01_s0, lrh, lr2]``: run dir01_s0 at either
        rate)."""
        grids, pipeline = self.grids().experiments, path[-1]
        if isinstance(entry, str):
            if entry in grids:
                return [m for m, (g, _) in self.grid_members("experiment").items() if g == entry]
            if entry in self.pipelines().pipelines:
                return self.pipeline_experiments(entry, path)
            return [entry]
        where = f"{self.root / PIPELINES_FILE}: {pipeline}: {entry}"
        grid, wanted = next(iter(entry.items()), ("", []))
        if len(entry) != 1 or grid not in grids:
            raise ParamsError(f"{where}: expected one grid of {self.grids_path} and its labels")
        members = {m: lab for m, (g, lab) in self.grid_members("experiment").items() if g == grid}
        by_axis: dict[str, set[str]] = {}
        for labels in members.values():
            for axis, label in labels.items():
                if label in wanted:
                    by_axis.setdefault(axis, set()).add(label)
        if unknown := set(wanted) - set().union(*by_axis.values()):
            raise ParamsError(
                f"{where}: no axis of grid {grid} has label(s) {', '.join(sorted(unknown))}"
            )
        return [
            m for m, labels in members.items()
            if all(labels[axis] in chosen for axis, chosen in by_axis.items())
        ]  # fmt: skip


def derived_name(base: str, overrides: dict) -> str:
    """The id of the run of experiment ``base`` with ``overrides`` (nested settings)."""
    text = yaml.safe_dump(overrides, sort_keys=True)
    return f"{base}{DERIVED_SEP}{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def derived_file(name: str) -> Path:
    return DERIVED_DIR / f"{name}.yaml"


def derived_from(name: str) -> str | None:
    """The experiment an override run ``name`` derives from (None: ``name`` is a preset)."""
    return name.split(DERIVED_SEP, 1)[0] if DERIVED_SEP in name else None


def overrides_of(name: str) -> dict:
    """The settings override run ``name`` sets over its experiment ({} for a preset)."""
    if derived_from(name) is None:
        return {}
    file = derived_file(name)
    if not file.is_file():
        raise ParamsError(
            f"{file}: no such override run ('{name}' is made by `fedssl run "
            f"{derived_from(name)} KEY=VALUE ...` in this folder)"
        )
    return read_yaml(file).get(name) or {}


def write_derived(base: str, overrides: dict) -> str:
    """Record the override run of ``base`` with ``overrides``; returns its id."""
    name = derived_name(base, overrides)
    file = derived_file(name)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    tmp.write_text(yaml.safe_dump({name: overrides}, sort_keys=True))
    tmp.replace(file)
    return name


def train_size_of(dataset: P.DatasetParams, prepared: Path) -> int | None:
    """The training samples of a data set as far as planning knows them cheaply: its raw
    files' headers where the format has one (Fashion-MNIST's idx), else the count of its
    prepared copy in folder ``prepared``, else the catalog's figure (None: known only once
    read)."""
    size = raw_train_size(dataset.name, dataset.data_root)
    if size is None:
        try:
            summary = json.loads((Path(prepared) / "dataset.json").read_text())
            size = int(summary["splits"]["train"]["count"])
        except (OSError, ValueError, KeyError, TypeError):
            size = dataset_spec(dataset.name).train_size
    return size


def check_partition_fits(
    part: P.PartitionParams, where: str, dataset: P.DatasetParams, prepared: Path
) -> None:
    """Cross-file check: a partition cannot have more clients than it has samples (skipped
    for data sets whose size is only known once read, e.g. femnist); ``prepared``: the data
    set's prepared folder."""
    full_size = train_size_of(dataset, prepared)
    if full_size is None:
        return
    train_size = full_size - (part.server_holdout or 0)
    if train_size <= 0:
        raise ParamsError(
            f"{where}: server_holdout: {part.server_holdout} leaves no training "
            f"samples of data set '{part.dataset}' for the clients"
        )
    available = min(part.subset or train_size, train_size)
    if part.subset and part.subset > train_size:
        raise ParamsError(
            f"{where}: subset: {part.subset} exceeds the {train_size} "
            f"training samples of data set '{part.dataset}' left to the clients"
        )
    if part.num_clients > available:
        raise ParamsError(
            f"{where}: num_clients: {part.num_clients} clients but only "
            f"{available} samples to split"
        )
    check_client_validation_fits(part, where, full_size)


def check_client_validation_fits(part: P.PartitionParams, where: str, full_size: int) -> None:
    """The clients' validation images come from those no client and no server slice holds:
    a request beyond them is refused (a class running short fails the partition stage)."""
    tests = part.client_tests
    if tests is None or tests.validation_per_client is None:
        return
    need = tests.validation_per_client * (part.num_clients if tests.disjoint else 1)
    free = unused_by(part, full_size)
    if need > free:
        raise ParamsError(
            f"{where}: client_tests.validation_per_client: {need} validation images needed "
            f"but at most {free} training images lie outside the clients and the server "
            f"slice: lower it, or give the partition a smaller subset (or server_holdout)"
        )


def unused_by(part: P.PartitionParams, full_size: int) -> int:
    """The most training images a partition leaves to no client and no server slice: exactly
    that many where its scheme deals its whole pool, else (clients drawing some of it) all
    but the server slice."""
    held = part.server_holdout or 0
    if part.scheme.deals_all:
        held += part.subset or full_size - held
    return max(full_size - held, 0)


def check_experiment_fits(
    exp, where: str, part: P.PartitionParams, dataset: P.DatasetParams, prepared: Path
) -> None:
    """Cross-file check: the k-NN probe cannot ask for more neighbours than its bank holds
    (the labelled training images the features stage keeps), nor the validation split for
    more images than the bank and the partition leave."""
    knn, features = getattr(exp, "knn", None), getattr(exp, "features", None)
    size = train_size_of(dataset, prepared)
    if knn is None or features is None or size is None:
        return
    bank = min(features.train_size or size, size)
    if knn.k > bank:
        raise ParamsError(
            f"{where}: knn.k: {knn.k} neighbours but the bank holds {bank} training images "
            f"(data set '{part.dataset}'{', features.train_size' if features.train_size else ''})"
        )
    free = min(size - bank, unused_by(part, size))
    if (features.validation_size or 0) > free:
        raise ParamsError(
            f"{where}: features.validation_size: {features.validation_size} images but at most "
            f"{free} of data set '{part.dataset}' lie outside the probes' bank (train_size) "
            f"and partition '{exp.partition}''s clients and server slice: lower it or "
            f"features.train_size, or give the partition a smaller subset"
        )


# ---------------------------------------------------------------------------- placeholders
_PLACEHOLDER = re.compile(r"\{(\w+)(\.value|\.upper)?\}")


def _placeholders(pattern: str) -> list[str]:
    return list(dict.fromkeys(m.group(1) for m in _PLACEHOLDER.finditer(pattern)))


def _fill(tree, labels: dict[str, str], values: dict):
    """Fill ``{axis}`` (its label), ``{axis.upper}`` and ``{axis.value}`` (its value; typed
    when it is the whole string) in every string of ``tree``."""
    if isinstance(tree, dict):
        return {k: _fill(v, labels, values) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_fill(v, labels, values) for v in tree]
    if not isinstance(tree, str):
        return tree
    whole = _PLACEHOLDER.fullmatch(tree)
    if whole and whole.group(2) == ".value" and whole.group(1) in values:
        return values[whole.group(1)]

    def sub(m):
        axis, what = m.group(1), m.group(2)
        if axis not in labels:
            raise ParamsError(f"placeholder {m.group(0)} names no axis of this grid's name")
        if what == ".value":
            value = values[axis]
            return f"{value:g}" if isinstance(value, float) else str(value)
        return labels[axis].upper() if what == ".upper" else labels[axis]

    return _PLACEHOLDER.sub(sub, tree)
