"""The DAG: the one place that says which stages exist, what each runs, reads and writes.

The Snakefile builds its rules from :func:`build_dag`; ``dvc.yaml`` (and one file per extra
pipeline under ``pipelines/``) is generated from it by ``python -m fedssl.pipeline write`` and a
test fails when the checked-in files drift from it.

Reruns are decided by content, not file times, the way DVC decides them. Every stage has a
*fingerprint*: a hash of its command, its validated params, the code it depends on and the
*output digests* of its upstream stages (a hash of what they wrote, recorded in their
``meta.json``). A stage records the fingerprint it ran with in its own ``meta.json``. Before
Snakemake plans, :func:`sync_stamps` marks a stage stale when its recorded fingerprint differs
from the expected one, or when an upstream stage is stale, and gives each stage a stamp file (an
input of its rule) dated *now* if stale and 1970 otherwise. The data inputs of up-to-date stages
are ``ancient`` (Snakemake ignores their times; those of stale stages are not, so that Snakemake
carries a rerun downstream). So Snakemake reruns what changed, whoever ran it last (Snakemake or
DVC), and file times restored by ``dvc checkout`` do not matter.
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
from fedssl.data.sources import TRAIN_SIZES

ARTIFACTS = Path("artifacts")
STAMPS = ARTIFACTS / ".stamps"
RAN_LOG = STAMPS / "ran-by-snakemake"
EXTRA_PIPELINES_DIR = Path("pipelines")

# Code each kind of stage depends on (a change reruns it in both front ends). Plumbing such as
# params.py or runtime.py is left out on purpose: touching it should not invalidate every result.
CODE = {
    "prepare_data": ["stages/prepare_data.py", "fedssl/data/sources.py", "fedssl/data/store.py"],
    "partition": ["stages/partition.py", "fedssl/data/partition.py"],
    "pretrain": ["stages/pretrain.py", "fedssl/methods", "fedssl/fl", "fedssl/models",
                 "fedssl/losses.py", "fedssl/data/augment.py"],
    "features": ["stages/features.py", "fedssl/eval/probes.py", "fedssl/models"],
    "evaluate": ["stages/evaluate.py", "fedssl/eval/probes.py"],
    "report": ["stages/report.py", "fedssl/report.py"],
    # MFCL (its phase 1 is the pretrain stage; names stay pretrain__/features__/...)
    "export": ["stages/export.py", "fedssl/methods/mfcl.py", "fedssl/models/autoencoder.py",
               "fedssl/models/norms.py", "fedssl/data/augment.py"],
    "rserver": ["stages/rserver.py", "fedssl/methods/mfcl.py", "fedssl/models/rserver.py",
                "fedssl/optim.py", "fedssl/losses.py"],
    "costs": ["stages/costs.py", "fedssl/costs.py", "fedssl/models", "fedssl/methods"],
}
GPU_KINDS = {"pretrain", "features", "evaluate", "export", "rserver"}
# Which top-level keys of an experiment file each per-experiment stage reads.
EXPERIMENT_KEYS = {"pretrain": ["partition", "model", "pretrain"],
                   "features": ["model", "features"],
                   "evaluate": ["linear_probe", "knn"],
                   "report": ["title"],
                   "costs": ["partition", "model", "pretrain"]}
# MFCL experiments: the network lives in the `mfcl` section (no `model`).
MFCL_KEYS = {"pretrain": ["partition", "pretrain", "mfcl"],
             "export": ["partition", "pretrain", "mfcl"],
             "rserver": ["mfcl"],
             "features": ["mfcl", "features"],
             "costs": ["partition", "pretrain", "mfcl"]}
# Methods whose per-client costs get a `costs` stage.
COSTED_METHODS = {"fedsimclr", "mfcl"}


@dataclass
class Stage:
    name: str
    kind: str
    cmd: str
    out: str                                   # the stage's output directory (holds meta.json)
    deps: list[str] = field(default_factory=list)      # artifacts of upstream stages
    upstream: list[str] = field(default_factory=list)  # names of those stages
    params: dict[str, list[str]] = field(default_factory=dict)  # file -> keys ([] = all)
    metrics: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)

    @property
    def code(self) -> list[str]:
        return CODE[self.kind]

    @property
    def gpu(self) -> bool:
        return self.kind in GPU_KINDS


def data_dir(dataset: str) -> str:
    return f"{ARTIFACTS}/data/{dataset}"


def partition_dir(partition: str) -> str:
    return f"{ARTIFACTS}/partitions/{partition}"


def experiment_dir(experiment: str) -> str:
    return f"{ARTIFACTS}/experiments/{experiment}"


def report_dir(pipeline: str) -> str:
    return f"{ARTIFACTS}/report" if pipeline == "default" else f"{ARTIFACTS}/report-{pipeline}"


class Dag:
    """The stages of one pipeline, upstream first, validated against their params files."""

    def __init__(self, pipeline: str | None, root: Path = P.PARAMS_DIR,
                 experiments: list[str] | None = None):
        """The stages of ``pipeline`` (from pipelines.yaml), or, with ``experiments``, just
        those experiments' stages (no report): all a single stage script needs."""
        self.pipeline, self.root = pipeline, Path(root)
        self.row, self.column = "method", "partition"  # the report's pivot
        if experiments is None:
            pipelines = P.load_pipelines(self.root)
            if pipeline not in pipelines.pipelines:
                raise P.ParamsError(f"{self.root / 'pipelines.yaml'}: no pipeline '{pipeline}' "
                                    f"(known: {', '.join(pipelines.pipelines)})")
            spec = pipelines.spec(pipeline)
            experiments, self.row, self.column = spec.experiments, spec.row, spec.column
        self.experiments = experiments
        self.stages: dict[str, Stage] = {}
        for exp in self.experiments:
            self._add_experiment(exp)
        if pipeline is not None:
            self._add_report()

    @classmethod
    def containing(cls, stage_name: str, root: Path = P.PARAMS_DIR) -> "Dag":
        """The DAG of the first pipeline that has this stage (what a stage script runs in)."""
        for pipe in pipeline_order(root):
            dag = cls(pipe, root)
            if stage_name in dag.stages:
                return dag
        raise P.ParamsError(f"no pipeline in {root / 'pipelines.yaml'} has a stage "
                            f"'{stage_name}': add its experiment to a pipeline there")

    def _params(self, kind: str, name: str, keys: list[str] | None = None) -> dict:
        """What a stage reads of a preset, as DVC params entries: the preset file and every
        preset it extends, each with the keys it sets itself (None = all; `extends` itself
        too, so that pointing a preset elsewhere reruns the stage)."""
        entries = {}
        for path, raw in P.preset_chain(P.preset_path(kind, name, self.root)):
            if keys is None:
                entries[str(path)] = []
                continue
            own = [k for k in keys if k in raw] + ([P.EXTENDS] if P.EXTENDS in raw else [])
            if own:
                entries[str(path)] = own
        return entries

    def _add(self, stage: Stage) -> None:
        self.stages.setdefault(stage.name, stage)

    def _add_experiment(self, exp_name: str) -> None:
        exp = P.load_preset("experiment", exp_name, self.root)
        if self.column != "partition":
            try:
                P.setting(exp, self.column)
            except P.ParamsError as e:
                raise P.ParamsError(f"{self.root / 'pipelines.yaml'}: pipelines.{self.pipeline}"
                                    f".column: {e} of '{exp_name}'") from None
        part = P.load_preset("partition", exp.partition, self.root)
        dataset = P.load_preset("dataset", part.dataset, self.root)
        P.check_partition_fits(part, P.preset_path("partition", exp.partition, self.root),
                               TRAIN_SIZES[dataset.name])
        ds, pt, ex = data_dir(part.dataset), partition_dir(exp.partition), experiment_dir(exp_name)
        self._add(Stage(f"prepare_data__{part.dataset}", "prepare_data",
                        f"python -m stages.prepare_data {part.dataset}", ds,
                        params=self._params("dataset", part.dataset)))
        self._add(Stage(f"partition__{exp.partition}", "partition",
                        f"python -m stages.partition {exp.partition}", pt, deps=[ds],
                        upstream=[f"prepare_data__{part.dataset}"],
                        params=self._params("partition", exp.partition)))
        up_data, up_part = f"prepare_data__{part.dataset}", f"partition__{exp.partition}"
        mfcl = exp.pretrain.method == "mfcl"
        if mfcl:  # phase 1 -> export -> rServer; features read the client and rServer modules
            chain = [("pretrain", [ds, pt], [up_data, up_part]),
                     ("export", [ds, pt, f"{ex}/pretrain"],
                      [up_data, up_part, f"pretrain__{exp_name}"]),
                     ("rserver", [f"{ex}/export"], [f"export__{exp_name}"]),
                     ("features", [ds, f"{ex}/pretrain", f"{ex}/rserver"],
                      [f"pretrain__{exp_name}", f"rserver__{exp_name}", up_data])]
        else:
            chain = [("pretrain", [ds, pt], [up_data, up_part]),
                     ("features", [ds, f"{ex}/pretrain"], [f"pretrain__{exp_name}", up_data])]
        chain.append(("evaluate", [f"{ex}/features"], [f"features__{exp_name}"]))
        if exp.pretrain.method in COSTED_METHODS:
            cost_deps = [pt, f"{ex}/pretrain"] + ([f"{ex}/export"] if mfcl else [])
            cost_up = [up_part, f"pretrain__{exp_name}"] + ([f"export__{exp_name}"] if mfcl
                                                             else [])
            chain.append(("costs", cost_deps, cost_up))
        for kind, deps, upstream in chain:
            keys = MFCL_KEYS[kind] if mfcl and kind in MFCL_KEYS else EXPERIMENT_KEYS[kind]
            stage = Stage(f"{kind}__{exp_name}", kind, f"python -m stages.{kind} {exp_name}",
                          f"{ex}/{kind}", deps=deps, upstream=upstream,
                          params=self._params("experiment", exp_name, keys))
            if kind == "pretrain":
                stage.plots = [f"{ex}/rounds.tsv"]
            if kind == "rserver":
                stage.plots = [f"{ex}/rserver_epochs.tsv"]
            if kind == "evaluate":
                stage.metrics = [f"{ex}/metrics.json"]
            self._add(stage)

    def _add_report(self) -> None:
        deps, upstream, params = [], [], {}
        for exp in self.experiments:
            deps += [f"{experiment_dir(exp)}/metrics.json", f"{experiment_dir(exp)}/pretrain"]
            upstream += [f"evaluate__{exp}", f"pretrain__{exp}"]
            if f"costs__{exp}" in self.stages:
                deps.append(f"{experiment_dir(exp)}/costs")
                upstream.append(f"costs__{exp}")
            params.update(self._params("experiment", exp, EXPERIMENT_KEYS["report"]))
        parts = sorted({s.out for s in self.stages.values() if s.kind == "partition"})
        deps += parts
        upstream += [f"partition__{Path(p).name}" for p in parts]
        params[str(self.root / "pipelines.yaml")] = [f"pipelines.{self.pipeline}"]
        self._add(Stage(f"report__{self.pipeline}", "report",
                        f"python -m stages.report {self.pipeline}", report_dir(self.pipeline),
                        deps=deps, upstream=upstream, params=params))

    # ------------------------------------------------------------------ fingerprints
    def fingerprint(self, name: str) -> str:
        s = self.stages[name]
        payload = {"cmd": s.cmd, "params": self.param_values(s),
                   "code": {c: hash_path(Path(c)) for c in s.code},
                   "upstream": {u: recorded(self.stages[u], "output_digest") for u in s.upstream}}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    def param_values(self, s: Stage) -> dict:
        values = {}
        for file, keys in s.params.items():
            if Path(file).name == "pipelines.yaml":  # the report's layout
                spec = P.load_pipelines(self.root).spec(self.pipeline)
                values[file] = spec.model_dump(mode="json")
                continue
            kind = "dataset" if "/datasets/" in file else (
                "partition" if "/partitions/" in file else "experiment")
            model = P.load_file(Path(file), P.SCHEMAS[kind]).model_dump(mode="json")
            values[file] = {k: model[k] for k in keys if k != P.EXTENDS} if keys else model
        return values


def hash_path(path: Path) -> str:
    """Content hash of a file, or of every .py file under a folder."""
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def output_digest(stage: Stage, out_dir: Path) -> str:
    """Hash of everything a stage wrote (its output folder but meta.json, metrics, plots)."""
    files = sorted(f for f in Path(out_dir).rglob("*") if f.is_file() and f.name != "meta.json")
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(out_dir)).encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    for extra in stage.metrics + stage.plots:
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
        if (recorded(stage, "fingerprint") != dag.fingerprint(name)
                or any(u in stale for u in stage.upstream)):
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
def owners(root: Path = P.PARAMS_DIR) -> dict[str, tuple[str, Stage]]:
    """Stage name -> (the pipeline whose dvc.yaml defines it, the stage). A shared stage is
    written into the first pipeline that uses it (``default`` first); later pipelines depend on
    its outputs without redefining it."""
    owner: dict[str, tuple[str, Stage]] = {}
    for pipe in pipeline_order(root):
        for name, stage in Dag(pipe, root).stages.items():
            owner.setdefault(name, (pipe, stage))
    return owner


def pipeline_order(root: Path = P.PARAMS_DIR) -> list[str]:
    names = list(P.load_pipelines(root).pipelines)
    return ["default"] + sorted(n for n in names if n != "default")


def dvc_file(pipeline: str) -> Path:
    return Path("dvc.yaml") if pipeline == "default" else EXTRA_PIPELINES_DIR / pipeline / "dvc.yaml"


def dvc_yaml(pipeline: str, root: Path = P.PARAMS_DIR) -> str:
    owner = owners(root)
    dag = Dag(pipeline, root)
    stages = {}
    for name, s in dag.stages.items():
        if owner[name][0] != pipeline:
            continue
        entry = {"cmd": s.cmd, "deps": s.code + s.deps}
        if s.params:
            entry["params"] = [{f: list(keys)} if keys else {f: None} for f, keys in s.params.items()]
        entry["outs"] = [s.out]
        if s.metrics:
            entry["metrics"] = [{m: {"cache": False}} for m in s.metrics]
        if s.plots:
            entry["plots"] = [{p: {"cache": False}} for p in s.plots]
        if pipeline != "default":
            entry = {"wdir": "../..", **entry}
        stages[name] = entry
    header = ("# Generated by `python -m fedssl.pipeline write` from fedssl/pipeline.py and "
              "params/.\n# Do not edit by hand: a test fails when this file drifts.\n")
    body = yaml.safe_dump({"stages": stages}, sort_keys=False, default_flow_style=False)
    return header + body.replace(": null\n", ":\n")


def write_all(root: Path = P.PARAMS_DIR) -> list[Path]:
    written = []
    for pipe in pipeline_order(root):
        path = dvc_file(pipe)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dvc_yaml(pipe, root))
        written.append(path)
    return written


# ---------------------------------------------------------------------- snakemake -> dvc
def record_ran(name: str) -> None:
    STAMPS.mkdir(parents=True, exist_ok=True)
    with open(RAN_LOG, "a") as f:
        f.write(name + "\n")


def commit_ran(root: Path = P.PARAMS_DIR) -> list[str]:
    """Record in dvc.lock the stages Snakemake just ran, so DVC sees them as up to date."""
    if not RAN_LOG.exists() or not Path(".dvc").is_dir():
        return []
    names = sorted(set(RAN_LOG.read_text().split()))
    owner = owners(root)
    complete = [n for n in names if n in owner and all(Path(p).exists() for p in [
        owner[n][1].out, *owner[n][1].metrics, *owner[n][1].plots])]
    targets = [f"{dvc_file(owner[n][0])}:{n}" for n in complete]
    if targets and subprocess.run(["dvc", "commit", "--force", "--quiet", *targets]).returncode:
        print(f"warning: `dvc commit` failed; `dvc status` may list {', '.join(names)}",
              file=sys.stderr)
    RAN_LOG.unlink()
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedssl.pipeline", description=__doc__.split(
        "\n")[0])
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
