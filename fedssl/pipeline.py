"""The DAG: the one place that says which stages exist, what each runs, reads and writes.

The Snakefile builds its rules from :class:`Dag`; ``dvc.yaml`` (and one file per extra pipeline
under ``pipelines/``) is generated from it by ``python -m fedssl.pipeline write`` and a test
fails when the checked-in files drift from it. Stages come from the experiments' methods (the
registry in :mod:`fedssl.methods`) plus the shared ones: prepare data, partition, features,
evaluate, costs, report.

What decides a rerun is the same for both front ends: a stage's command, the raw params keys it
reads in every layer of its presets (:meth:`fedssl.presets.Presets.tracked`), the code its entry
modules import (:mod:`fedssl.codegraph`) and its inputs. DVC compares these itself. For
Snakemake, every stage has a *fingerprint*: a hash of the same command, params values and code,
and of the *output digests* its upstream stages recorded in their ``meta.json``. A stage records
the fingerprint it ran with in its own ``meta.json``. Before Snakemake plans, :func:`sync_stamps`
marks a stage stale when its recorded fingerprint differs from the expected one, or when an
upstream stage is stale, and gives each stage a stamp file (an input of its rule) dated *now*
if stale and 1970 otherwise; data inputs of up-to-date stages are ``ancient``. So Snakemake
reruns what changed, whoever ran it last, and file times restored by ``dvc checkout`` do not
matter. This module imports no torch: planning stays cheap.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fedssl import params as P
from fedssl.codegraph import code_files
from fedssl.methods import registry
from fedssl.methods.base import DATA, PARTITION
from fedssl.presets import (PARAMS_DIR, PIPELINES_FILE, Presets, check_partition_fits, lookup,
                            raw_values)

ARTIFACTS = Path("artifacts")
RESULTS = Path("results")  # small result files committed with the code (DVC, cache: false)
STAMPS = ARTIFACTS / ".stamps"
RAN_LOG = STAMPS / "ran-by-snakemake"
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
        self.presets.load("dataset", name)
        stage = f"prepare_data__{name}"
        self._add(Stage(stage, "prepare_data", f"python -m stages.prepare_data {name}",
                        data_dir(name), params=self.presets.tracked("dataset", name, None),
                        code=code_files(_entry("prepare_data"))))
        return stage

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
            for name in self.of_experiment[exp]:
                s = self.stages[name]
                if s.kind != "features":
                    upstream.append(name)
                    deps += s.metrics or [s.out]
            for file, keys in self.presets.tracked("experiment", exp, REPORT_READS).items():
                merged = params.get(file, [])
                params[file] = None if keys is None or merged is None else \
                    merged + [k for k in keys if k not in merged]
            modules.add(registry.module_of(self.presets.load("experiment", exp).method.name))
        parts = [s for s in self.stages.values() if s.kind == "partition"]
        deps += [s.out for s in parts]
        upstream += [s.name for s in parts]
        params[str(self.root / PIPELINES_FILE)] = [f"pipelines.{self.pipeline}"]
        out = report_dir(self.pipeline)
        self._add(Stage(f"report__{self.pipeline}", "report",
                        f"python -m stages.report {self.pipeline}",
                        f"{ARTIFACTS}/reports/{self.pipeline}", deps=deps, upstream=upstream,
                        params=params, code=code_files(*sorted(modules)),
                        results=[f"{out}/report.md", f"{out}/report.csv"]))

    # ------------------------------------------------------------------ fingerprints
    def fingerprint(self, name: str) -> str:
        s = self.stages[name]
        payload = {"cmd": s.cmd, "params": raw_values(s.params),
                   "code": {c: hash_file(Path(c)) for c in s.code},
                   "upstream": {u: recorded(self.stages[u], "output_digest")
                                for u in s.upstream}}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

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


def stale_stages(dag: Dag) -> set[str]:
    """Stages whose recorded fingerprint is not the expected one, and everything downstream."""
    stale: set[str] = set()
    for name, stage in dag.stages.items():  # upstream first
        if (any(u in stale for u in stage.upstream)
                or recorded(stage, "fingerprint") != dag.fingerprint(name)):
            stale.add(name)
    return stale


def sync_stamps(dag: Dag) -> tuple[dict[str, str], set[str]]:
    """Date each stage's stamp file (see module doc); returns (stage name -> stamp path, the
    stale stages). A stale stamp also gets new content: Snakemake ignores a newer input whose
    checksum matches the one it recorded."""
    STAMPS.mkdir(parents=True, exist_ok=True)
    stale = stale_stages(dag)
    stamps = {}
    for name in dag.stages:
        path = STAMPS / name
        if name in stale:
            path.write_text(f"stale since {time.time_ns()}\n")
        else:
            path.touch()
            os.utime(path, (0, 0))
        stamps[name] = str(path)
    return stamps, stale


# ---------------------------------------------------------------------- dvc.yaml
def owners(root: Path = PARAMS_DIR) -> dict[str, tuple[str, Stage]]:
    """Stage name -> (the pipeline whose dvc.yaml defines it, the stage). A shared stage is
    written into the first pipeline that uses it (``default`` first); later pipelines depend on
    its outputs without redefining it."""
    owner: dict[str, tuple[str, Stage]] = {}
    presets = Presets(root)
    for pipe in pipeline_order(root, presets):
        for name, stage in Dag(pipe, root, presets=presets).stages.items():
            owner.setdefault(name, (pipe, stage))
    return owner


def pipeline_order(root: Path = PARAMS_DIR, presets: Presets | None = None) -> list[str]:
    names = list((presets or Presets(root)).pipelines().pipelines)
    return ["default"] + sorted(n for n in names if n != "default")


def dvc_file(pipeline: str) -> Path:
    return Path("dvc.yaml") if pipeline == "default" else EXTRA_PIPELINES_DIR / pipeline / "dvc.yaml"


def dvc_yaml(pipeline: str, owner: dict[str, tuple[str, Stage]]) -> str:
    stages = {}
    for name, (pipe, s) in owner.items():
        if pipe != pipeline:
            continue
        entry = {"cmd": s.cmd, "deps": s.code + s.deps}
        if s.params:
            entry["params"] = [{f: list(keys)} if keys is not None else {f: None}
                               for f, keys in s.params.items()]
        entry["outs"] = [s.out] + [{r: {"cache": False}} for r in s.results]
        if s.metrics:
            entry["metrics"] = [{m: {"cache": False}} for m in s.metrics]
        if s.plots:
            entry["plots"] = [{p: {"cache": False}} for p in s.plots]
        if pipeline != "default":
            entry = {"wdir": "../..", **entry}
        stages[name] = entry
    header = ("# Generated by `python -m fedssl.pipeline write` from the DAG (fedssl/pipeline.py)"
              " and params/.\n# Do not edit by hand: a test fails when this file drifts.\n")
    body = yaml.safe_dump({"stages": stages}, sort_keys=False, default_flow_style=False,
                          allow_unicode=True)
    return header + body.replace(": null\n", ":\n")


def generated_files(root: Path = PARAMS_DIR) -> dict[Path, str]:
    """Every dvc.yaml the DAG generates: path -> text."""
    owner = owners(root)
    return {dvc_file(pipe): dvc_yaml(pipe, owner) for pipe in pipeline_order(root)}


def write_all(root: Path = PARAMS_DIR) -> list[Path]:
    written = []
    for path, text in generated_files(root).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


# ---------------------------------------------------------------------- snakemake -> dvc
def commit_ran(root: Path = PARAMS_DIR) -> list[str]:
    """Record in dvc.lock the stages Snakemake just ran, so DVC sees them as up to date."""
    if not RAN_LOG.exists() or not Path(".dvc").is_dir():
        return []
    names = sorted(set(RAN_LOG.read_text().split()))
    owner = owners(root)
    complete = [n for n in names if n in owner and all(Path(p).exists() for p in [
        owner[n][1].out, *owner[n][1].committed])]
    targets = [f"{dvc_file(owner[n][0])}:{n}" for n in complete]
    if targets and subprocess.run(["dvc", "commit", "--force", "--quiet", *targets]).returncode:
        print(f"warning: `dvc commit` failed; `dvc status` may list {', '.join(names)}",
              file=sys.stderr)
    RAN_LOG.unlink()
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedssl.pipeline",
                                 description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("write", help="regenerate dvc.yaml (and pipelines/*/dvc.yaml)")
    sub.add_parser("commit", help="dvc-commit the stages Snakemake ran")
    show = sub.add_parser("show", help="list a pipeline's stages")
    show.add_argument("pipeline", nargs="?", default="default")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "write":
            for p in write_all():
                print(f"wrote {p}")
        elif args.cmd == "commit":
            commit_ran()
        else:
            for name in Dag(args.pipeline).stages:
                print(name)
    except P.ParamsError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
