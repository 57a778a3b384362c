"""The DAG: the one place that says which stages exist, what each runs, reads and writes.

The Snakefile builds its rules from :class:`Dag`; ``dvc.yaml`` (and one file per other pipeline
that was run, under ``pipelines/``) is generated from it (:mod:`fedssl.plan.dvcfile`) and a test
fails when the checked-in files drift from it. Stages come from the experiments' methods (the
registry in :mod:`fedssl.methods`) plus the shared ones: prepare data, partition, the
evaluations (:mod:`fedssl.evaluations`: features, evaluate, personal, finetune, costs) and
the report. A per-experiment stage is named after the experiment that
owns its content (:meth:`Dag.owners`), so experiments that differ only downstream share it.

What decides a rerun is the same for both front ends: a stage's command, the raw params keys it
reads in every layer of its presets (:meth:`fedssl.presets.Presets.tracked`), the code it runs
and its inputs. A stage's code is what its entry modules import (:mod:`fedssl.plan.codegraph`): its
stage script, the method's declaration and, by name, only the module of the hook it runs (a
step's ``runner``, the ``encoder``, ``client_costs`` or report functions), so a method's report
code is not a dependency of its training and the reverse. DVC compares these itself; for
Snakemake every stage has a *fingerprint* of the same things (:meth:`Dag.fingerprint`, checked
by :mod:`fedssl.plan.freshness`). All of it is in each stage's plan record (:meth:`Dag.record`,
:mod:`fedssl.stage.record`), which the stage reads instead of this module.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from fedssl import evaluations
from fedssl import params as P
from fedssl.data.catalog import dataset_spec
from fedssl.methods import registry
from fedssl.plan.codegraph import code_files
from fedssl.plan.layout import (
    ARTIFACTS,
    data_dir,
    experiment_dir,
    owner_of,
    partition_dir,
    report_artifacts_dir,
    report_dir,
    results_dir,
)
from fedssl.presets import (
    EXPERIMENT_MODEL,
    PARAMS_DIR,
    PIPELINES_FILE,
    Presets,
    check_experiment_fits,
    check_partition_fits,
)
from fedssl.stage.contract import DATA, PARTITION
from fedssl.stage.record import (
    COMPILED,
    PRECISION,
    fingerprint,
    fingerprint_inputs,
    hash_file,
    lookup,
    raw_values,
    values_digest,
)
from fedssl.strategies import choices as strategy_choices

REPORT_READS = ("title", "partition", "method")


def _report_reads(s: Stage, steps: set[str]) -> list[str]:
    """What the report reads of stage ``s``: a method step's meta and traffic (its output),
    besides any metrics it wrote; an evaluation's committed files, or its output where it
    commits none (as Snakemake's digest has it: a new probe curve reruns the report in both
    front ends)."""
    committed = [*s.metrics, *s.plots]
    return [*s.metrics, s.out] if s.kind in steps else (committed or [s.out])


def _merged_keys(merged: list[str] | None, keys: list[str] | None) -> list[str] | None:
    """The params keys of one file read so far, with ``keys`` added (None: the whole file)."""
    if keys is None or merged is None:
        return None
    return merged + [k for k in keys if k not in merged]


def _method_part(method, params, uses: str | None) -> tuple[tuple, tuple, bool]:
    """What an evaluation that ``uses`` a part of the method adds: (params it reads, steps it
    reads, whether it calls the method's hook)."""
    if uses == "encoder":
        return method.encoder_reads, method.encoder_inputs_for(params), True
    if uses == "costs":
        return method.costs_reads, method.costs_inputs_for(params), True
    if uses == "personal":
        return (), method.personal_inputs, False
    return (), (), False


@dataclass
class Stage:
    name: str
    kind: str
    cmd: str
    out: str  # the stage's output directory (holds meta.json)
    deps: list[str] = field(default_factory=list)  # artifacts of upstream stages
    upstream: list[str] = field(default_factory=list)  # names of those stages
    params: dict[str, list[str] | None] = field(default_factory=dict)  # file -> keys (None=all)
    code: list[str] = field(default_factory=list)  # project files its code imports
    gpu: bool = False
    hooks: list[str] = field(default_factory=list)  # "module:function"s it calls by name
    method: str | None = None  # the method whose step it is, or whose hook it calls
    # Small result files committed with the code (DVC outs with cache: false)
    results: list[str] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)

    @property
    def committed(self) -> list[str]:
        return self.results + self.metrics + self.plots


def _entry(kind: str) -> str:
    return f"stages.{kind}"


# The scripts that run any of several kinds, named first on their command line: a method's steps
# and the shared evaluations.
DISPATCHERS = ("stages.method", "stages.evaluation")


class Dag:
    """The stages of one pipeline (or of some experiments), upstream first, validated against
    their params files."""

    def __init__(
        self,
        pipeline: str | None = None,
        root: Path = PARAMS_DIR,
        experiments: list[str] | None = None,
        presets: Presets | None = None,
        derived: list[str] = (),
    ):
        """The stages of ``pipeline`` (from pipelines.yaml) with its report, or, with
        ``experiments``, just those experiments' stages (all a stage script needs); plus the
        stages of the override runs ``derived``, which the report does not read."""
        self.pipeline, self.root = pipeline, Path(root)
        self.presets = presets or Presets(self.root)
        self.row, self.column = "method", "partition"  # the report's pivot
        if experiments is None:
            pipelines = self.presets.pipelines()
            if pipeline not in pipelines.pipelines:
                raise P.ParamsError(
                    f"{self.root / PIPELINES_FILE}: no pipeline '{pipeline}' "
                    f"(known: {', '.join(pipelines.pipelines)})"
                )
            spec = pipelines.spec(pipeline)
            self.row, self.column = spec.row, spec.column
            experiments = self.presets.pipeline_experiments(pipeline)
        for exp in experiments if pipeline is not None else []:
            self.presets.resolve(
                "experiment", exp, f"{self.root / PIPELINES_FILE}: pipelines.{pipeline}"
            )
        self.experiments = experiments
        self.stages: dict[str, Stage] = {}
        self.of_experiment: dict[str, list[str]] = {}  # experiment -> its stages (shared too)
        self.content: dict[str, str] = {}  # per-experiment stage -> the key of its content
        self._owners: dict[tuple[str, str], str] | None = None
        self._content_only = False  # a scout of owners() needs only the stages' content keys
        for exp in self.experiments:
            self._add_experiment(exp)
        if pipeline is not None and not self.stages.get(f"report__{pipeline}"):
            self._add_report()
        self._planned = set(self.stages)  # the pipeline's own stages, which its report plans
        for exp in derived:
            self._add_experiment(exp)

    # ------------------------------------------------------------------ stage scripts
    @classmethod
    def for_stage(cls, kind: str, name: str, root: Path = PARAMS_DIR) -> tuple[Dag, str]:
        """The smallest DAG that holds stage ``<kind>__<name>``: a data set's or a partition's
        own stages, an experiment's stage of that kind (maybe shared, named after the
        experiment that owns its content), or a pipeline's report. Returns (dag, stage name)."""
        presets = Presets(root)
        if kind == "report":
            return cls(name, root, presets=presets), f"report__{name}"
        dag = cls(None, root, experiments=[], presets=presets)
        if kind in ("prepare_data", "partition"):
            {"prepare_data": dag._add_dataset, "partition": dag._add_partition}[kind](name)
            return dag, f"{kind}__{name}"
        dag._add_experiment(name)
        mine = [s for s in dag.of_experiment[name] if dag.stages[s].kind == kind]
        if not mine:
            raise P.ParamsError(
                f"experiment '{name}' has no stage '{kind}' (its stages: "
                f"{', '.join(dag.of_experiment[name])})"
            )
        return dag, mine[0]

    # ------------------------------------------------------------------ building
    def _add(self, stage: Stage) -> None:
        self.stages.setdefault(stage.name, stage)

    def _add_dataset(self, name: str) -> str:
        params = self.presets.load("dataset", name)  # validates it first
        stage = f"prepare_data__{name}"
        if stage in self.stages:
            return stage
        spec = dataset_spec(params.name)
        self._add(
            Stage(
                stage,
                "prepare_data",
                f"python -m stages.prepare_data {name}",
                data_dir(name),
                params=self.presets.tracked("dataset", name, None),
                # it calls the reader its record names (by name: its module is its code) as its
                # record says (:meth:`_dataset_plan`), and runs no registry code
                code=code_files(_entry("prepare_data"), spec.source_module),
                hooks=[spec.source],
            )
        )
        return stage

    def _add_partition(self, name: str) -> str:
        part = self.presets.load("partition", name)
        where = self.presets.resolve("partition", name).where
        dataset = self.presets.load("dataset", part.dataset, f"{where}: dataset")
        check_partition_fits(part, where, dataset, Path(data_dir(part.dataset)))
        up = self._add_dataset(part.dataset)
        stage = f"partition__{name}"
        self._add(
            Stage(
                stage,
                "partition",
                f"python -m stages.partition {name}",
                partition_dir(name),
                deps=[data_dir(part.dataset)],
                upstream=[up],
                params=self.presets.tracked("partition", name, None),
                code=code_files(_entry("partition")),
            )
        )
        return stage

    def _exp_stage(
        self,
        kind: str,
        exp_name: str,
        entry: str,
        reads: tuple[str, ...],
        inputs: list[str],
        modules: list[str],
        gpu: bool,
    ) -> Stage:
        """A per-experiment stage reading ``inputs`` (names of upstream stages). It is named
        after the experiment that owns its content (:meth:`owner`), so experiments that differ
        only downstream of it share it."""
        # a stage that computes on the device computes in the experiment's precision, its
        # local steps compiled or not
        reads = _with_name(reads) + (("precision", "compile") if gpu else ())
        key = content_key(
            kind, self._values(exp_name, reads), [self.content.get(u, u) for u in inputs]
        )
        owner = self.owners().get((kind, key), exp_name)
        name = f"{kind}__{owner}"
        if name not in self.stages:
            self.content[name] = key
            args = [kind, owner] if entry in DISPATCHERS else [owner]
            cmd = " ".join(["python -m", entry, *args])
            self._add(
                Stage(
                    name,
                    kind,
                    cmd,
                    f"{experiment_dir(owner)}/{kind}",
                    deps=[self.stages[u].out for u in inputs],
                    upstream=list(inputs),
                    params={}
                    if self._content_only
                    else self.presets.tracked("experiment", owner, reads),
                    code=[] if self._content_only else code_files(*modules),
                    gpu=gpu,
                )
            )
        self.of_experiment.setdefault(exp_name, []).append(name)
        return self.stages[name]

    def _values(self, exp_name: str, reads: tuple[str, ...]) -> dict:
        dump = self.presets.load("experiment", exp_name).model_dump(mode="json")
        return {r: lookup(dump, r) for r in reads}

    def _checked_experiment(self, exp_name: str):
        """The experiment's params and its partition's, checked: the pipeline's column is one
        of its settings, and it fits its data set."""
        exp = self.presets.load("experiment", exp_name)
        if self.column != "partition":
            try:
                P.setting(exp, self.column)
            except P.ParamsError as e:
                raise P.ParamsError(
                    f"{self.root / PIPELINES_FILE}: pipelines.{self.pipeline}"
                    f".column: {e} of '{exp_name}'"
                ) from None
        where = self.presets.resolve("experiment", exp_name).where
        part = self.presets.load("partition", exp.partition, f"{where}: partition")
        part_where = self.presets.resolve("partition", exp.partition).where
        dataset = self.presets.load("dataset", part.dataset, f"{part_where}: dataset")
        check_experiment_fits(exp, where, part, dataset, Path(data_dir(part.dataset)))
        return exp, part

    def _add_experiment(self, exp_name: str) -> None:
        exp, part = self._checked_experiment(exp_name)
        method = registry.get(exp.method.name)
        add = self._stage_adder(exp_name, exp, part)
        for step in method.steps_for(exp.method):
            stage = add(step.name, step.reads, step.inputs, step.gpu, entry="method")
            results = results_dir(owner_of(stage.out))
            stage.plots = [f"{results}/{p}" for p in step.plots]
            stage.metrics = [f"{results}/{m}" for m in step.metrics]
        for ev in evaluations.all():
            if ev.applies(method, exp):
                reads, inputs, calls_method = _method_part(method, exp.method, ev.uses)
                stage = add(
                    ev.kind,
                    ev.reads + reads,
                    ev.inputs + ev.more_inputs(exp) + inputs,
                    ev.gpu,
                    "evaluation",
                    calls_method,
                    ev.run.__module__,
                )
                results = results_dir(owner_of(stage.out))
                stage.metrics = [f"{results}/{m}" for m in ev.metrics]
                stage.plots = [f"{results}/{p}" for p in ev.plots]
                stage.results = [f"{results}/{r}" for r in ev.results]

    def _stage_adder(self, exp_name: str, exp, part):
        """``add(kind, reads, inputs, gpu, ...)``: adds one stage of experiment ``exp_name``
        (its inputs named by what earlier calls added) and returns it."""
        method = registry.get(exp.method.name)
        declaration = registry.module_of(method.name)
        # the method's steps run the strategies its params choose: their declarations (each
        # imports its strategy's code where it builds it)
        steps = {s.name for s in method.steps_for(exp.method)}
        strategies = [type(c).__module__ for c in strategy_choices.chosen(exp.method)]
        sources = {
            DATA: f"prepare_data__{part.dataset}",
            PARTITION: self._add_partition(exp.partition),
        }

        def add(kind, reads, inputs, gpu, entry=None, calls_method=True, runs=None) -> Stage:
            """The stage runs its script and the module it ``runs`` (an evaluation's file),
            and, when it calls the method, the method's declaration and the module of the hook
            it calls."""
            entry = _entry(entry or kind)
            modules = [
                entry,
                EXPERIMENT_MODEL,  # it loads the experiment's params
                *([PRECISION, COMPILED] if gpu else []),
                *([runs] if runs else []),
                *(
                    [declaration, *method.hook_modules(exp.method, kind)]
                    + (strategies if kind in steps else [])
                    if calls_method
                    else []
                ),
            ]
            stage = self._exp_stage(
                kind, exp_name, entry, reads, [sources[i] for i in inputs], modules, gpu
            )
            if calls_method:
                stage.method, stage.hooks = method.name, method.hooks(exp.method, kind)
            sources[kind] = stage.name
            return stage

        return add

    def owners(self) -> dict[tuple[str, str], str]:
        """(stage kind, content key) -> the first experiment, by name, among every preset
        (files and grid members) whose stage of that kind has that content: the stage's owner,
        whichever pipeline runs it. Presets that do not validate own nothing."""
        if self._owners is None:
            self._owners = _cached_owners(OWNERS_CACHE, self._owners_key(), self._find_owners)
        return self._owners

    def _find_owners(self) -> dict[tuple[str, str], str]:
        """:meth:`owners` from every preset: a scout DAG of all of them (content keys only)."""
        owners: dict[tuple[str, str], str] = {}
        scout = Dag(None, self.root, experiments=[], presets=self.presets)
        scout._owners, scout._content_only = {}, True
        for name in sorted(self.presets.names("experiment")):
            try:
                scout._add_experiment(name)
            except P.ParamsError:
                continue
        for name, key in scout.content.items():
            kind, owner = name.split("__", 1)
            owners.setdefault((kind, key), owner)
        return owners

    def _owners_key(self) -> str:
        """What :meth:`owners` depends on: every params file, the methods registered and the
        library's code (the methods' declarations and the params models decide what a stage
        reads)."""
        files = sorted(self.root.rglob("*.yaml")) + sorted(Path("fedssl").rglob("*.py"))
        methods = [(m.name, registry.module_of(m.name)) for m in registry.all()]
        h = hashlib.sha256(json.dumps([str(self.root.resolve()), methods]).encode())
        for f in files:
            h.update(f"{f}\0{hash_file(f)}\0".encode())
        return h.hexdigest()

    def _add_report(self) -> None:
        """The report reads every experiment's metrics, the meta and traffic of its method's
        steps, its costs, and the partitions' heat-maps."""
        # the metrics' declarations say how the report shows them
        modules = {_entry("report"), EXPERIMENT_MODEL, *evaluations.modules()}
        deps, upstream, params, hooks = [], [], {}, set()
        for exp in self.experiments:
            exp_params = self.presets.load("experiment", exp)
            method = registry.get(exp_params.method.name)
            steps = {st.name for st in method.steps_for(exp_params.method)}
            for name in self.of_experiment[exp]:
                s = self.stages[name]
                if s.kind != "features":
                    upstream.append(name)
                    deps += _report_reads(s, steps)
            for file, keys in self.presets.tracked("experiment", exp, REPORT_READS).items():
                params[file] = _merged_keys(params.get(file, []), keys)
            modules.add(registry.module_of(method.name))
            part = self.presets.load("partition", exp_params.partition)
            modules.add(dataset_spec(self.presets.load("dataset", part.dataset).name).module)
            modules.update(method.hook_modules(exp_params.method, "report"))
            hooks.update(method.hooks(exp_params.method, "report"))
        parts = [s for s in self.stages.values() if s.kind == "partition"]
        deps += [s.out for s in parts]
        upstream += [s.name for s in parts]
        params[str(self.root / PIPELINES_FILE)] = [f"pipelines.{self.pipeline}"]
        out = report_dir(self.pipeline)
        self._add(
            Stage(
                f"report__{self.pipeline}",
                "report",
                f"python -m stages.report {self.pipeline}",
                report_artifacts_dir(self.pipeline),
                deps=deps,
                upstream=upstream,
                params=params,
                code=code_files(*sorted(modules)),
                hooks=sorted(hooks),
                results=[f"{out}/report.md", f"{out}/report.csv", f"{out}/report.json"],
                plots=[f"{out}/curves.png"],
            )
        )

    # ------------------------------------------------------------------ records, fingerprints
    def record(self, name: str) -> dict:
        """The stage's plan record (:mod:`fedssl.stage.record`): what the stage runtime reads
        instead of this DAG."""
        s = self.stages[name]
        return {
            "stage": s.name,
            "kind": s.kind,
            "name": s.name.split("__", 1)[1],
            "command": s.cmd,
            "params": s.params,
            "params_digest": values_digest(raw_values(s.params)),
            "inputs": {
                u: {"kind": self.stages[u].kind, "out": self.stages[u].out} for u in s.upstream
            },
            "outputs": {
                "out": s.out,
                "results": s.results,
                "metrics": s.metrics,
                "plots": s.plots,
            },
            "code": s.code,
            "hooks": s.hooks,
            "method": s.method,
            "gpu": s.gpu,
            **({"pipeline": self._pipeline_plan()} if s.kind == "report" else {}),
            **({"dataset": self._dataset_plan(s)} if s.kind == "prepare_data" else {}),
        }

    def _pipeline_plan(self) -> dict:
        """What the report reads of its pipeline's plan: its experiments (in order) with their
        stages, each stage's kind and outputs, and the report's pivot. ``order`` keeps the
        pipeline's order of the experiments, which the record's sorted keys lose."""
        return {
            "row": self.row,
            "column": self.column,
            "order": list(self.experiments),
            "experiments": {e: self.of_experiment[e] for e in self.experiments},
            "stages": {
                n: {"kind": s.kind, "out": s.out, "metrics": s.metrics, "plots": s.plots}
                for n, s in self.stages.items()
                if s.kind != "report" and n in self._planned
            },
        }

    def _dataset_plan(self, s: Stage) -> dict:
        """What the prepare stage reads of its data set: its params, validated, with the
        registry's default place for a ``data_root`` left unset."""
        params = self.presets.load("dataset", s.name.split("__", 1)[1])
        spec = dataset_spec(params.name)
        return {
            "name": spec.name,
            "root": params.data_root or spec.root,
            "download": params.download,
        }

    def fingerprint_inputs(self, name: str) -> dict:
        """What a stage's output depends on, as both front ends see it (see
        :func:`fedssl.stage.record.fingerprint_inputs`)."""
        return fingerprint_inputs(self.record(name), raw_values(self.stages[name].params))

    def fingerprint(self, name: str) -> str:
        return fingerprint(self.fingerprint_inputs(name))

    def param_values(self, s: Stage) -> dict:
        """What the stage ran with, for its meta.json: the raw values it reads."""
        return raw_values(s.params)


OWNERS_CACHE = ARTIFACTS / ".cache" / "owners.json"


def _cached_owners(path: Path, key: str, compute) -> dict[tuple[str, str], str]:
    """``compute()`` (:meth:`Dag.owners`), kept in ``path`` under ``key``: the stored copy is
    used while ``key`` is the same."""
    try:
        stored = json.loads(path.read_text())
        if stored["key"] == key:
            return {(kind, k): owner for kind, k, owner in stored["owners"]}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    owners = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "owners": [[*k, o] for k, o in owners.items()]}))
    tmp.replace(path)  # atomic: a concurrent reader sees the old file or the new one
    return owners


def content_key(kind: str, values: dict, inputs: list[str]) -> str:
    """What determines a stage's output: its kind, the resolved params it reads (defaults
    included) and what determines its inputs."""
    payload = json.dumps([kind, values, inputs], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _with_name(reads: tuple[str, ...]) -> tuple[str, ...]:
    """A stage reading anything of the method section also reads which method it is."""
    if any(r.startswith("method.") for r in reads) and "method" not in reads:
        return ("method.name", *reads)
    return reads
