"""The DAG: the one place that says which stages exist, what each runs, reads and writes.

The Snakefile builds its rules from :class:`Dag`; ``dvc.yaml`` (and one file per other pipeline
that was run, under ``pipelines/``) is generated from it by ``python -m fedssl.pipeline write``
and a test fails when the checked-in files drift from it. Stages come from the experiments'
methods (the registry in :mod:`fedssl.methods`) plus the shared ones: prepare data, partition,
features, evaluate, personal, costs, report. A per-experiment stage is named after the
experiment that owns its content (:meth:`Dag.owners`), so experiments that differ only
downstream share it.

What decides a rerun is the same for both front ends: a stage's command, the raw params keys it
reads in every layer of its presets (:meth:`fedssl.presets.Presets.tracked`), the code its entry
modules import (:mod:`fedssl.codegraph`) and its inputs. DVC compares these itself. For
Snakemake, every stage has a *fingerprint*: a hash of the same command, params values and code,
and of the *output digests* its upstream stages recorded in their ``meta.json``; a stage records
the fingerprint it ran with (and what went into it) in its own ``meta.json``. Before Snakemake
plans, :func:`sync_receipts` compares them, says why each stale stage must run, and gives
Snakemake its view of the DAG: each rule's output is a receipt file that exists, dated 1970,
when the stage is up to date, and is removed when it must run. Snakemake never sees the real
outputs, so it cannot delete them before a job (stages replace their outputs atomically, on
success only), file times restored by ``dvc checkout`` do not matter, and after one front end
ran the other sees nothing to do. This module imports no torch: planning stays cheap.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fedssl import params as P
from fedssl.codegraph import code_files
from fedssl.data.sources import missing_data
from fedssl.methods import registry
from fedssl.methods.base import DATA, PARTITION
from fedssl.presets import (PARAMS_DIR, PIPELINES_FILE, Presets, check_partition_fits, lookup,
                            raw_values)

ARTIFACTS = Path("artifacts")
RESULTS = Path("results")  # small result files committed with the code (DVC, cache: false)
STAMPS = ARTIFACTS / ".receipts"
RAN_LOG = STAMPS / "ran-by-snakemake"
LOGS = ARTIFACTS / "logs"  # one log file per stage run by Snakemake
EXTRA_PIPELINES_DIR = Path("pipelines")
# What the shared per-experiment stages read of an experiment (the method adds its own keys).
FEATURE_READS = ("features",)
EVALUATE_READS = ("linear_probe", "knn")
FINETUNE_READS = ("finetune",)
PERSONAL_READS = ("personal",)
REPORT_READS = ("title", "partition", "method")


@dataclass
class Stage:
    name: str
    kind: str
    cmd: str
    out: str                                   # the stage's output directory (holds meta.json)
    deps: list[str] = field(default_factory=list)      # artifacts of upstream stages
    upstream: list[str] = field(default_factory=list)  # names of those stages
    params: dict[str, list[str] | None] = field(default_factory=dict)  # file -> keys (None=all)
    code: list[str] = field(default_factory=list)      # project files its code imports
    gpu: bool = False
    # Small result files committed with the code (DVC outs with cache: false)
    results: list[str] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)

    @property
    def committed(self) -> list[str]:
        return self.results + self.metrics + self.plots


def data_dir(dataset: str) -> str:
    return f"{ARTIFACTS}/data/{dataset}"


def partition_dir(partition: str) -> str:
    return f"{ARTIFACTS}/partitions/{partition}"


def experiment_dir(experiment: str) -> str:
    return f"{ARTIFACTS}/experiments/{experiment}"


def results_dir(experiment: str) -> str:
    return f"{RESULTS}/experiments/{experiment}"


def report_dir(pipeline: str) -> str:
    return f"{RESULTS}/reports/{pipeline}"


def _entry(kind: str) -> str:
    return f"stages.{kind}"


class Dag:
    """The stages of one pipeline (or of some experiments), upstream first, validated against
    their params files."""

    def __init__(self, pipeline: str | None = None, root: Path = PARAMS_DIR,
                 experiments: list[str] | None = None, presets: Presets | None = None):
        """The stages of ``pipeline`` (from pipelines.yaml) with its report, or, with
        ``experiments``, just those experiments' stages (all a stage script needs)."""
        self.pipeline, self.root = pipeline, Path(root)
        self.presets = presets or Presets(self.root)
        self.row, self.column = "method", "partition"  # the report's pivot
        if experiments is None:
            pipelines = self.presets.pipelines()
            if pipeline not in pipelines.pipelines:
                raise P.ParamsError(f"{self.root / PIPELINES_FILE}: no pipeline '{pipeline}' "
                                    f"(known: {', '.join(pipelines.pipelines)})")
            spec = pipelines.spec(pipeline)
            self.row, self.column = spec.row, spec.column
            experiments = self.presets.pipeline_experiments(pipeline)
        self.experiments = experiments
        self.stages: dict[str, Stage] = {}
        self.of_experiment: dict[str, list[str]] = {}  # experiment -> its stages (shared too)
        self.content: dict[str, str] = {}  # per-experiment stage -> the key of its content
        self._owners: dict[tuple[str, str], str] | None = None
        for exp in self.experiments:
            self._add_experiment(exp)
        if pipeline is not None and not self.stages.get(f"report__{pipeline}"):
            self._add_report()

    # ------------------------------------------------------------------ stage scripts
    @classmethod
    def for_stage(cls, kind: str, name: str, root: Path = PARAMS_DIR) -> tuple["Dag", str]:
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
            raise P.ParamsError(f"experiment '{name}' has no stage '{kind}' (its stages: "
                                f"{', '.join(dag.of_experiment[name])})")
        return dag, mine[0]

    # ------------------------------------------------------------------ building
    def _add(self, stage: Stage) -> None:
        self.stages.setdefault(stage.name, stage)

    def _add_dataset(self, name: str) -> str:
        params = self.presets.load("dataset", name)
        stage = f"prepare_data__{name}"
        if stage in self.stages:
            return stage
        self._add(Stage(stage, "prepare_data", f"python -m stages.prepare_data {name}",
                        data_dir(name), params=self.presets.tracked("dataset", name, None),
                        code=code_files(_entry("prepare_data"))))
        return stage

    def check_data(self) -> None:
        """Before running: every data set a stale prepare stage will read must be there (the
        message says how to get it), so a missing one stops a front end before any stage."""
        for stage in self.stages.values():
            if stage.kind == "prepare_data" and why_stale(self, stage.name):
                name = stage.name.split("__", 1)[1]
                params = self.presets.load("dataset", name)
                problem = missing_data(params.name, params.data_root, params.download)
                if problem:
                    where = self.presets.resolve("dataset", name).where
                    raise P.ParamsError(f"{where}: data set not available: {problem}")

    def _add_partition(self, name: str) -> str:
        part = self.presets.load("partition", name)
        dataset = self.presets.load("dataset", part.dataset)
        check_partition_fits(part, self.presets.resolve("partition", name).where, dataset.name)
        up = self._add_dataset(part.dataset)
        stage = f"partition__{name}"
        self._add(Stage(stage, "partition", f"python -m stages.partition {name}",
                        partition_dir(name), deps=[data_dir(part.dataset)], upstream=[up],
                        params=self.presets.tracked("partition", name, None),
                        code=code_files(_entry("partition"))))
        return stage

    def _exp_stage(self, kind: str, exp_name: str, entry: str, reads: tuple[str, ...],
                   inputs: list[str], modules: list[str], gpu: bool) -> Stage:
        """A per-experiment stage reading ``inputs`` (names of upstream stages). It is named
        after the experiment that owns its content (:meth:`owner`), so experiments that differ
        only downstream of it share it."""
        reads = _with_name(reads)
        key = content_key(kind, self._values(exp_name, reads),
                          [self.content.get(u, u) for u in inputs])
        owner = self.owners().get((kind, key), exp_name)
        name = f"{kind}__{owner}"
        if name not in self.stages:
            self.content[name] = key
            cmd = f"python -m {entry} {owner}".replace("stages.method ",
                                                       f"stages.method {kind} ")
            self._add(Stage(name, kind, cmd, f"{experiment_dir(owner)}/{kind}",
                            deps=[self.stages[u].out for u in inputs], upstream=list(inputs),
                            params=self.presets.tracked("experiment", owner, reads),
                            code=code_files(*modules), gpu=gpu))
        self.of_experiment.setdefault(exp_name, []).append(name)
        return self.stages[name]

    def _values(self, exp_name: str, reads: tuple[str, ...]) -> dict:
        dump = self.presets.load("experiment", exp_name).model_dump(mode="json")
        return {r: lookup(dump, r) for r in reads}

    def _add_experiment(self, exp_name: str) -> None:
        exp = self.presets.load("experiment", exp_name)
        if self.column != "partition":
            try:
                P.setting(exp, self.column)
            except P.ParamsError as e:
                raise P.ParamsError(f"{self.root / PIPELINES_FILE}: pipelines.{self.pipeline}"
                                    f".column: {e} of '{exp_name}'") from None
        part = self.presets.load("partition", exp.partition)
        method = registry.get(exp.method.name)
        module = registry.module_of(method.name)
        sources = {DATA: f"prepare_data__{part.dataset}",
                   PARTITION: self._add_partition(exp.partition)}

        def add(kind, entry, reads, inputs, modules, gpu) -> Stage:
            stage = self._exp_stage(kind, exp_name, entry, reads,
                                    [sources[i] for i in inputs], modules, gpu)
            sources[kind] = stage.name
            return stage

        for step in method.steps_for(exp.method):
            stage = add(step.name, _entry("method"), step.reads, step.inputs,
                        [_entry("method"), module], step.gpu)
            stage.plots = [f"{results_dir(stage.out.split('/')[-2])}/{p}" for p in step.plots]
            stage.metrics = [f"{results_dir(stage.out.split('/')[-2])}/{m}"
                             for m in step.metrics]
        encoder_inputs = method.encoder_inputs_for(exp.method)
        if "personal" in method.evaluation_sections:
            personal = add("personal", _entry("personal"), PERSONAL_READS,
                           (PARTITION, *method.personal_inputs), [_entry("personal")], False)
            personal.metrics = [f"{results_dir(personal.out.split('/')[-2])}/metrics.json"]
        if "features" in method.evaluation_sections:
            add("features", _entry("features"), FEATURE_READS + method.encoder_reads,
                (DATA, *encoder_inputs), [_entry("features"), module], True)
            evaluate = add("evaluate", _entry("evaluate"), EVALUATE_READS, ("features",),
                           [_entry("evaluate")], True)
            evaluate.metrics = [f"{results_dir(evaluate.out.split('/')[-2])}/metrics.json"]
        if exp.finetune is not None:
            finetune = add("finetune", _entry("finetune"), FINETUNE_READS + method.encoder_reads,
                           (DATA, *encoder_inputs), [_entry("finetune"), module], True)
            finetune.metrics = [f"{results_dir(finetune.out.split('/')[-2])}/finetune.json"]
            finetune.plots = [f"{results_dir(finetune.out.split('/')[-2])}/finetune_epochs.tsv"]
        costs_inputs = method.costs_inputs_for(exp.method)
        if costs_inputs is not None:
            add("costs", _entry("costs"), method.costs_reads, (PARTITION, *costs_inputs),
                [_entry("costs"), module], False)

    def owners(self) -> dict[tuple[str, str], str]:
        """(stage kind, content key) -> the first experiment, by name, among every preset
        (files and grid members) whose stage of that kind has that content: the stage's owner,
        whichever pipeline runs it. Presets that do not validate own nothing."""
        if self._owners is None:
            self._owners = {}
            scout = Dag(None, self.root, experiments=[], presets=self.presets)
            scout._owners = {}
            for name in sorted(self.presets.names("experiment")):
                try:
                    scout._add_experiment(name)
                except P.ParamsError:
                    continue
            for name, key in scout.content.items():
                kind, owner = name.split("__", 1)
                self._owners.setdefault((kind, key), owner)
        return self._owners

    def _add_report(self) -> None:
        """The report reads every experiment's metrics, the meta and traffic of its method's
        steps, its costs, and the partitions' heat-maps."""
        deps, upstream, params, modules = [], [], {}, {_entry("report")}
        for exp in self.experiments:
            exp_params = self.presets.load("experiment", exp)
            method = registry.get(exp_params.method.name)
            steps = {st.name for st in method.steps_for(exp_params.method)}
            for name in self.of_experiment[exp]:
                s = self.stages[name]
                if s.kind != "features":
                    upstream.append(name)
                    # a method step's meta and traffic are read, besides any metrics it wrote
                    deps += [*s.metrics, s.out] if s.kind in steps else (s.metrics or [s.out])
            for file, keys in self.presets.tracked("experiment", exp, REPORT_READS).items():
                merged = params.get(file, [])
                params[file] = None if keys is None or merged is None else \
                    merged + [k for k in keys if k not in merged]
            modules.add(registry.module_of(method.name))
            if method.report_tables:
                modules.add(method.report_tables.partition(":")[0])
        parts = [s for s in self.stages.values() if s.kind == "partition"]
        deps += [s.out for s in parts]
        upstream += [s.name for s in parts]
        params[str(self.root / PIPELINES_FILE)] = [f"pipelines.{self.pipeline}"]
        out = report_dir(self.pipeline)
        self._add(Stage(f"report__{self.pipeline}", "report",
                        f"python -m stages.report {self.pipeline}",
                        f"{ARTIFACTS}/reports/{self.pipeline}", deps=deps, upstream=upstream,
                        params=params, code=code_files(*sorted(modules)),
                        results=[f"{out}/report.md", f"{out}/report.csv", f"{out}/report.json"],
                        plots=[f"{out}/curves.png"]))

    # ------------------------------------------------------------------ fingerprints
    def fingerprint_inputs(self, name: str) -> dict:
        """What a stage's output depends on, as both front ends see it: its command, the raw
        params values it reads, the hashes of the code it imports, and the output digests
        its upstream stages recorded."""
        s = self.stages[name]
        return {"cmd": s.cmd, "params": raw_values(s.params),
                "code": {c: hash_file(Path(c)) for c in s.code},
                "upstream": {u: recorded(self.stages[u], "output_digest") for u in s.upstream}}

    def fingerprint(self, name: str) -> str:
        payload = json.dumps(self.fingerprint_inputs(name), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()

    def param_values(self, s: Stage) -> dict:
        """What the stage ran with, for its meta.json: the raw values it reads."""
        return raw_values(s.params)


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


_FILE_HASHES: dict[tuple[str, int, int], str] = {}


def hash_file(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _FILE_HASHES:
        _FILE_HASHES[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _FILE_HASHES[key]


def output_digest(stage: Stage, out_dir: Path) -> str:
    """Hash of everything a stage wrote (its output folder but meta.json, metrics, plots)."""
    files = sorted(f for f in Path(out_dir).rglob("*") if f.is_file() and f.name != "meta.json")
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(out_dir)).encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    for extra in stage.committed:
        h.update(extra.encode())
        h.update(Path(extra).read_bytes() if Path(extra).exists() else b"")
    return h.hexdigest()


def recorded(stage: Stage, key: str) -> str | None:
    """A value the stage's last run recorded in its meta.json (None when it has not run)."""
    try:
        return json.loads((Path(stage.out) / "meta.json").read_text()).get(key)
    except (OSError, ValueError):
        return None


def why_stale(dag: Dag, name: str) -> list[str]:
    """Why a stage must run, by what changed since its last run (empty: up to date)."""
    stage = dag.stages[name]
    try:
        meta = json.loads((Path(stage.out) / "meta.json").read_text())
    except (OSError, ValueError):
        return ["not run yet"]
    if meta.get("fingerprint") == dag.fingerprint(name):
        return []
    old, new = meta.get("inputs", {}), dag.fingerprint_inputs(name)
    reasons = ["command changed"] if old.get("cmd") != new["cmd"] else []
    for file, values in new["params"].items():
        before = old.get("params", {}).get(file, {})
        keys = values if isinstance(values, dict) and isinstance(before, dict) else {}
        changed = [k for k in keys if before.get(k) != values[k]] if keys else (
            [] if before == values else ["(whole file)"])
        reasons += [f"params {file}: {k}" for k in changed]
    code = [f for f in new["code"] if old.get("code", {}).get(f) != new["code"][f]]
    reasons += [f"code {f}" for f in code]
    reasons += [f"input of {u} changed" for u, d in new["upstream"].items()
                if old.get("upstream", {}).get(u) != d]
    return reasons or ["its recorded fingerprint differs"]


def stale_stages(dag: Dag) -> dict[str, list[str]]:
    """Stages that must run, with why: what changed, or an upstream stage that must run."""
    stale: dict[str, list[str]] = {}
    for name, stage in dag.stages.items():  # upstream first
        reasons = why_stale(dag, name)
        reasons += [f"{u} will run" for u in stage.upstream if u in stale]
        if reasons:
            stale[name] = reasons
    return stale


def receipt(name: str) -> Path:
    return STAMPS / f"{name}.done"


def sync_receipts(dag: Dag) -> dict[str, list[str]]:
    """Snakemake's view of the DAG (see module doc): each stage's receipt exists, dated 1970,
    when the stage is up to date, and is removed when it must run (so Snakemake runs it and
    everything after it). Returns the stages that must run, with why."""
    STAMPS.mkdir(parents=True, exist_ok=True)
    stale = stale_stages(dag)
    for name in dag.stages:
        path = receipt(name)
        if name in stale:
            path.unlink(missing_ok=True)
        else:
            path.write_text("up to date\n")
            os.utime(path, (0, 0))
    return stale


# ---------------------------------------------------------------------- dvc.yaml
# The root dvc.yaml opens with a stage that checks the DAG's shape: it depends on params/ and on
# the code that builds the DAG, runs `python -m fedssl.pipeline check` (validate every active
# pipeline, regenerate any stale dvc.yaml and stop with a message if one was) and writes a file
# of constant content that every prepare stage depends on, so `dvc repro` always runs it first
# and stops before any stage when the params changed the DAG's shape. Only pipelines that were
# run (or asked for) have a dvc.yaml; the results of all runs are the root's metrics and plots.
DAG_STAGE = "dag"
DAG_CHECKED = EXTRA_PIPELINES_DIR / "dag.checked"


def active_pipelines(root: Path = PARAMS_DIR, presets: Presets | None = None,
                     also: tuple[str, ...] = ()) -> list[str]:
    """``default``, the pipelines that have a dvc.yaml, and ``also``, in the order of
    :func:`pipeline_order` (pipelines no longer in pipelines.yaml are dropped)."""
    return [p for p in pipeline_order(root, presets)
            if p == "default" or p in also or dvc_file(p).exists()]


def owners(root: Path = PARAMS_DIR, also: tuple[str, ...] = ()) -> dict[str, tuple[str, Stage]]:
    """Stage name -> (the pipeline whose dvc.yaml defines it, the stage). A shared stage is
    written into the first active pipeline that uses it (``default`` first); later pipelines
    depend on its outputs without redefining it."""
    owner: dict[str, tuple[str, Stage]] = {}
    presets = Presets(root)
    for pipe in active_pipelines(root, presets, also):
        for name, stage in Dag(pipe, root, presets=presets).stages.items():
            owner.setdefault(name, (pipe, stage))
    return owner


def pipeline_order(root: Path = PARAMS_DIR, presets: Presets | None = None) -> list[str]:
    names = list((presets or Presets(root)).pipelines().pipelines)
    return ["default"] + sorted(n for n in names if n != "default")


def dvc_file(pipeline: str) -> Path:
    return Path("dvc.yaml") if pipeline == "default" else EXTRA_PIPELINES_DIR / pipeline / "dvc.yaml"


def _dag_stage(root: Path) -> dict:
    modules = ["fedssl.pipeline", *[registry.module_of(m.name) for m in registry.all()]]
    return {"cmd": "python -m fedssl.pipeline check", "deps": [str(root), *code_files(*modules)],
            "outs": [{str(DAG_CHECKED): {"cache": False, "persist": True}}]}


def _entry_of(s: Stage, wdir: bool) -> dict:
    deps = s.code + s.deps + ([str(DAG_CHECKED)] if s.kind == "prepare_data" else [])
    entry = {"cmd": s.cmd, "deps": deps}
    if s.params:
        entry["params"] = [{f: list(keys)} if keys is not None else {f: None}
                           for f, keys in s.params.items()]
    committed = [{r: {"cache": False, "persist": True}} for r in s.results + s.metrics + s.plots]
    entry["outs"] = [{s.out: {"persist": True}}] + committed
    return {"wdir": "../..", **entry} if wdir else entry


def dvc_yaml(pipeline: str, owner: dict[str, tuple[str, Stage]], root: Path = PARAMS_DIR) -> str:
    stages = {DAG_STAGE: _dag_stage(root)} if pipeline == "default" else {}
    for name, (pipe, s) in owner.items():
        if pipe == pipeline:
            stages[name] = _entry_of(s, pipeline != "default")
    doc: dict = {"stages": stages}
    if pipeline == "default":  # every committed result, whichever pipeline wrote it
        doc["metrics"] = sorted(str(p) for p in RESULTS.glob("experiments/*/metrics.json"))
        doc["plots"] = sorted(str(p) for p in RESULTS.glob("reports/*/*.png"))
    header = ("# Generated by `python -m fedssl.pipeline write` from the DAG (fedssl/pipeline.py)"
              " and params/.\n# Do not edit by hand: a test fails when this file drifts.\n")
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return header + body.replace(": null\n", ":\n")


def generated_files(root: Path = PARAMS_DIR, also: tuple[str, ...] = ()) -> dict[Path, str]:
    """Every dvc.yaml of the active pipelines: path -> text."""
    owner = owners(root, also)
    return {dvc_file(p): dvc_yaml(p, owner, root) for p in active_pipelines(root, None, also)}


def write_all(root: Path = PARAMS_DIR, also: tuple[str, ...] = ()) -> list[Path]:
    """Regenerate the active pipelines' dvc.yaml files; returns those whose text changed."""
    changed = []
    for path, text in generated_files(root, also).items():
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(path)
    return changed


def check(root: Path = PARAMS_DIR) -> int:
    """The `dag` stage of DVC: validate every active pipeline, then regenerate the dvc.yaml
    files; when one changed, say so and fail, so DVC stops before running the old shape."""
    for pipe in active_pipelines(root):
        Dag(pipe, root).check_data()
    changed = write_all(root)
    if changed:
        print(f"the params changed the pipelines' shape: regenerated {', '.join(map(str, changed))}"
              f"; run `dvc repro` again to run the new shape", file=sys.stderr)
        return 1
    DAG_CHECKED.parent.mkdir(parents=True, exist_ok=True)
    DAG_CHECKED.write_text("The DAG of params/ was checked against the dvc.yaml files "
                           "(python -m fedssl.pipeline check).\n")
    return 0


# ---------------------------------------------------------------------- snakemake -> dvc
def commit_ran(pipeline: str = "default", root: Path = PARAMS_DIR) -> list[str]:
    """After a Snakemake run: bring the dvc.yaml files up to date (the pipeline just run
    becomes active, new results join the root's metrics) and record in dvc.lock the stages
    Snakemake ran, and the DAG check it did while planning, so DVC sees them as up to date."""
    if not Path(".dvc").is_dir():
        return []
    write_all(root, (pipeline,))
    check(root)
    names = sorted(set(RAN_LOG.read_text().split())) if RAN_LOG.exists() else []
    owner = owners(root)
    complete = [n for n in names if n in owner and all(Path(p).exists() for p in [
        owner[n][1].out, *owner[n][1].committed])]
    targets = [f"dvc.yaml:{DAG_STAGE}"] + [f"{dvc_file(owner[n][0])}:{n}" for n in complete]
    if targets and subprocess.run(["dvc", "commit", "--force", "--quiet", *targets]).returncode:
        print(f"warning: `dvc commit` failed; `dvc status` may list {', '.join(names)}",
              file=sys.stderr)
    RAN_LOG.unlink(missing_ok=True)
    return names


def accept(dag: Dag, names: list[str] | None = None) -> list[str]:
    """Declare stages up to date without running them: their recorded fingerprint becomes the
    current one (e.g. after an edit of code or params that cannot change their outputs, such
    as a comment). Only stages whose outputs exist; upstream first. Returns the stages accepted
    (then `dvc commit` them for DVC). The outputs are not checked: use with care."""
    accepted = []
    for name, stage in dag.stages.items():
        meta_path = Path(stage.out) / "meta.json"
        if (names and name not in names) or not meta_path.exists() or not why_stale(dag, name):
            continue
        meta = json.loads(meta_path.read_text())
        meta.update(fingerprint=dag.fingerprint(name), inputs=dag.fingerprint_inputs(name))
        meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True, default=float) + "\n")
        accepted.append(name)
    return accepted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedssl.pipeline",
                                 description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    write = sub.add_parser("write", help="regenerate dvc.yaml and pipelines/*/dvc.yaml of the "
                           "pipelines run so far (and of those named)")
    write.add_argument("pipelines", nargs="*", help="also write these pipelines' dvc.yaml")
    sub.add_parser("check", help="validate and regenerate; fail when the shape changed")
    sub.add_parser("commit", help="dvc-commit the stages Snakemake ran")
    acc = sub.add_parser("accept", help="declare stages up to date without running them "
                         "(after an edit that cannot change their outputs)")
    acc.add_argument("pipeline")
    acc.add_argument("stages", nargs="*", help="only these (default: every stale stage)")
    show = sub.add_parser("show", help="list a pipeline's stages")
    show.add_argument("pipeline", nargs="?", default="default")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "write":
            for p in write_all(also=tuple(args.pipelines)):
                print(f"wrote {p}")
        elif args.cmd == "check":
            return check()
        elif args.cmd == "commit":
            commit_ran()
        elif args.cmd == "accept":
            names = accept(Dag(args.pipeline), args.stages or None)
            print("accepted: " + (", ".join(names) or "nothing was stale"))
            if names and Path(".dvc").is_dir():
                owner = owners()
                subprocess.run(["dvc", "commit", "--force", "--quiet",
                                *[f"{dvc_file(owner[n][0])}:{n}" for n in names if n in owner]])
        else:
            for name in Dag(args.pipeline).stages:
                print(name)
    except P.ParamsError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
