"""The DVC front end: ``dvc.yaml`` files generated from the DAG, and recording in ``dvc.lock``
what Snakemake ran, so either front end sees what the other did.

The root dvc.yaml opens with a stage that checks the DAG's shape: it depends on params/ and on
the code that builds the DAG, runs `python -m fedssl.pipeline check` (validate every active
pipeline, regenerate any stale dvc.yaml and stop with a message if one was) and writes a file
of constant content that every prepare stage depends on, so `dvc repro` always runs it first
and stops before any stage when the params changed the DAG's shape. Only pipelines that were
run (or asked for) have a dvc.yaml; each stage declares its metrics and plots (the loss
over rounds or epochs, drawn by `dvc plots show`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from fedssl import evaluations
from fedssl import params as P
from fedssl.data.catalog import datasets
from fedssl.methods import registry
from fedssl.plan.codegraph import code_files
from fedssl.plan.dag import Dag, Stage
from fedssl.plan.freshness import RAN_LOG, check_data
from fedssl.presets import PARAMS_DIR, Presets
from fedssl.stage.record import PLAN_RECORDS, record_path, record_text
from fedssl.strategies import choices as strategy_choices

EXTRA_PIPELINES_DIR = Path("pipelines")
DAG_STAGE = "dag"
DAG_CHECKED = EXTRA_PIPELINES_DIR / "dag.checked"


def active_pipelines(
    root: Path = PARAMS_DIR, presets: Presets | None = None, also: tuple[str, ...] = ()
) -> list[str]:
    """``default``, the pipelines that have a dvc.yaml, and ``also``, in the order of
    :func:`pipeline_order` (pipelines no longer in pipelines.yaml are dropped)."""
    return [
        p
        for p in pipeline_order(root, presets)
        if p == "default" or p in also or dvc_file(p).exists()
    ]


def owners(
    root: Path = PARAMS_DIR, also: tuple[str, ...] = ()
) -> dict[str, tuple[str, Stage, Dag]]:
    """Stage name -> (the pipeline whose dvc.yaml defines it, the stage, that pipeline's DAG).
    A shared stage stays
    in the dvc.yaml that defines it already, so running one pipeline never moves another's
    stages (and their dvc.lock records); a new one goes to the first active pipeline that
    uses it (``default`` first). Later pipelines depend on its outputs without redefining it."""
    presets = Presets(root)
    dags = {p: Dag(p, root, presets=presets) for p in active_pipelines(root, presets, also)}
    defined = {n: p for p in reversed(dags) for n in defined_stages(p) if n in dags[p].stages}
    owner: dict[str, tuple[str, Stage, Dag]] = {}
    for pipe, dag in dags.items():
        for name, stage in dag.stages.items():
            if defined.get(name, pipe) == pipe:
                owner.setdefault(name, (pipe, stage, dag))
    return owner


def defined_stages(pipeline: str) -> list[str]:
    """The stages the pipeline's dvc.yaml defines now (none when it has none)."""
    path = dvc_file(pipeline)
    if not path.exists():
        return []
    return list((yaml.safe_load(path.read_text()) or {}).get("stages") or {})


def pipeline_order(root: Path = PARAMS_DIR, presets: Presets | None = None) -> list[str]:
    names = list((presets or Presets(root)).pipelines().pipelines)
    return ["default"] + sorted(n for n in names if n != "default")


def dvc_file(pipeline: str) -> Path:
    return (
        Path("dvc.yaml") if pipeline == "default" else EXTRA_PIPELINES_DIR / pipeline / "dvc.yaml"
    )


def _dag_stage(root: Path) -> dict:
    """The DAG check: it reads params/ and the planner's code, with the declarations it finds
    by name (the methods', the strategies', the evaluations', the data sets')."""
    modules = [
        "fedssl.pipeline",
        *[registry.module_of(m.name) for m in registry.all()],
        *strategy_choices.modules(),
        *evaluations.modules(),
        *dict.fromkeys(spec.module for spec in datasets().values()),
    ]
    return {
        "cmd": "python -m fedssl.pipeline check",
        "deps": [str(root), *code_files(*modules)],
        "outs": [{str(DAG_CHECKED): {"cache": False, "persist": True}}],
    }


def _entry_of(s: Stage, wdir: bool) -> dict:
    deps = [str(record_path(s.name)), *s.code, *s.deps]
    deps += [str(DAG_CHECKED)] if s.kind == "prepare_data" else []
    entry = {"cmd": s.cmd, "deps": deps}
    if s.params:
        entry["params"] = [
            {f: list(keys)} if keys is not None else {f: None} for f, keys in s.params.items()
        ]
    kept = {"cache": False, "persist": True}  # committed in git, kept in place before a rerun
    # a copy each: one dict twice in a stage would be written as a YAML anchor and alias
    entry["outs"] = [{s.out: {"persist": True}}] + [{r: dict(kept)} for r in s.results]
    if s.metrics:
        entry["metrics"] = [{m: dict(kept)} for m in s.metrics]
    if s.plots:
        entry["plots"] = [{p: {**kept, **plot_axes(p)}} for p in s.plots]
    return {"wdir": "../..", **entry} if wdir else entry


# a step's log (by the end of its name) -> the column across and the column drawn (None: DVC's
# default, the last column)
PLOT_AXES = (
    ("rounds.tsv", "round", "loss"),
    ("linear_epochs.tsv", "epoch", "test_top1"),  # the linear probe: its test top-1 per epoch
    ("_epochs.tsv", "epoch", "loss"),
    ("steps.tsv", "step", "loss"),
    ("choices.tsv", "round", None),
    ("mse_curves.tsv", "iteration", None),
)


def plot_axes(path: str) -> dict:
    """How `dvc plots show` draws a step's log: its loss over rounds, epochs or steps, the
    linear probe's test top-1 over its epochs (a figure is shown as it is)."""
    name = Path(path).name
    if name.startswith("grow_") and name.endswith(".tsv"):  # LW-FedSSL's growth stages
        name = "rounds.tsv"
    for end, x, y in PLOT_AXES:
        if name.endswith(end):
            return {"template": "linear", "x": x, **({"y": y} if y else {})}
    return {}


def dvc_yaml(
    pipeline: str, owner: dict[str, tuple[str, Stage, Dag]], root: Path = PARAMS_DIR
) -> str:
    stages = {DAG_STAGE: _dag_stage(root)} if pipeline == "default" else {}
    for name, (pipe, s, _) in owner.items():
        if pipe == pipeline:
            stages[name] = _entry_of(s, pipeline != "default")
    # each stage declares its own metrics and plots: the root's `dvc metrics show` and `dvc
    # plots show` show the default pipeline (and the pipelines run here); others by path
    doc: dict = {"stages": stages}
    header = (
        "# Generated by `python -m fedssl.pipeline write` from the DAG (fedssl/plan/)"
        " and params/.\n# Do not edit by hand: a test fails when this file drifts.\n"
    )
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return header + body.replace(": null\n", ":\n")


def generated_files(root: Path = PARAMS_DIR, also: tuple[str, ...] = ()) -> dict[Path, str]:
    """Every dvc.yaml of the active pipelines and the plan record of each of their stages:
    path -> text."""
    owner = owners(root, also)
    files = {dvc_file(p): dvc_yaml(p, owner, root) for p in active_pipelines(root, None, also)}
    files.update((record_path(n), record_text(dag.record(n))) for n, (_, _, dag) in owner.items())
    return files


def write_all(root: Path = PARAMS_DIR, also: tuple[str, ...] = ()) -> list[Path]:
    """Regenerate the active pipelines' dvc.yaml files and their stages' plan records, and
    remove the records of stages no longer in them; returns the files whose text changed."""
    changed = []
    files = generated_files(root, also)
    for path, text in files.items():
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(path)
    for path in sorted(PLAN_RECORDS.glob("*.json")):
        if path not in files:
            path.unlink()
            changed.append(path)
    return changed


def check(root: Path = PARAMS_DIR) -> int:
    """The `dag` stage of DVC: validate every active pipeline, then regenerate the dvc.yaml
    files; when one changed, say so and fail, so DVC stops before running the old shape. A
    data set the default pipeline needs must be there; one only another pipeline needs is a
    warning (that pipeline's prepare stage stops with the same message), so a paper pipeline
    planned on a machine without its data never blocks the default one."""
    for pipe in active_pipelines(root):
        dag = Dag(pipe, root)
        try:
            check_data(dag)
        except P.ParamsError as e:
            if pipe == "default":
                raise
            print(f"warning: pipeline {pipe}: {e}", file=sys.stderr)
    changed = [p for p in write_all(root) if p.name == "dvc.yaml"]  # records are stage deps
    if changed:
        print(
            f"the params changed the pipelines' shape: regenerated {', '.join(map(str, changed))}"
            f"; run `dvc repro` again to run the new shape",
            file=sys.stderr,
        )
        return 1
    DAG_CHECKED.parent.mkdir(parents=True, exist_ok=True)
    DAG_CHECKED.write_text(
        "The DAG of params/ was checked against the dvc.yaml files "
        "(python -m fedssl.pipeline check).\n"
    )
    return 0


# ---------------------------------------------------------------------- snakemake -> dvc
def commit_ran(
    pipeline: str = "default", root: Path = PARAMS_DIR, succeeded: bool = True
) -> list[str]:
    """After a Snakemake run: bring the dvc.yaml files up to date (the pipeline just run
    becomes active, new results join the root's metrics) and record in dvc.lock the stages
    Snakemake ran and, when the run ``succeeded``, the DAG check it did while planning, so DVC
    sees them as up to date. A failed run leaves the check as it was: the params it failed
    with (a bad edit) are not recorded, so reverting them leaves DVC nothing to do."""
    if not Path(".dvc").is_dir():
        return []
    names = sorted(set(RAN_LOG.read_text().split())) if RAN_LOG.exists() else []
    if not (succeeded or names):
        return []  # failed before any stage finished: no pipeline's DVC state changes
    write_all(root, (pipeline,))
    if succeeded:
        check(root)
    owner = owners(root)
    complete = [
        n
        for n in names
        if n in owner and all(Path(p).exists() for p in [owner[n][1].out, *owner[n][1].committed])
    ]
    targets = [f"dvc.yaml:{DAG_STAGE}"] if succeeded else []
    targets += [f"{dvc_file(owner[n][0])}:{n}" for n in complete]
    if targets and dvc_commit(targets):
        print(
            f"warning: `dvc commit` failed; `dvc status` may list {', '.join(names)}",
            file=sys.stderr,
        )
    RAN_LOG.unlink(missing_ok=True)
    return names


# ---------------------------------------------------------------------- relock
def relock(dvcfile: str = "dvc.yaml") -> list[str]:
    """Record in ``dvcfile``'s lock the code each stage now runs, the outputs kept as the lock
    has them: after edits that cannot change a stage's outputs (the byte-identical check of
    every method's chain passed), so a fresh clone's ``dvc status`` lists no changed code. A
    stage whose params values changed is refused: its committed results need a rerun. Returns
    the stages relocked."""
    from dvc.repo import Repo

    changed = []
    with Repo() as repo, repo.lock:
        stages = [s for s in repo.index.stages if s.path_in_repo == dvcfile and s.cmd]
        stale = [
            f"{s.name}: {dep}"
            for s in stages
            if s.name != DAG_STAGE  # the check reads all params: it reruns in a second
            for dep in s.deps
            if dep.exists and type(dep).__name__ == "ParamsDependency" and dep.status()
        ]
        if stale:
            raise P.ParamsError(f"{dvcfile}: params changed, rerun: {'; '.join(stale)}")
        for stage in stages:
            if any(dep.exists and dep.status() for dep in stage.deps):
                for dep in stage.deps:
                    if dep.exists:  # an upstream output a fresh clone lacks keeps its hash
                        dep.save()
                stage.dump(update_pipeline=False)
                changed.append(stage.name)
    return changed


def dvc_commit(targets: list[str]) -> int:
    """``dvc commit --force`` of ``targets`` (``dvc.yaml:stage``), saying each stage as it is
    recorded (:mod:`fedssl.plan.dvccommit`); returns its exit status."""
    print(f"dvc commit: recording {len(targets)} stages in dvc.lock", file=sys.stderr, flush=True)
    return subprocess.run([sys.executable, "-m", "fedssl.plan.dvccommit", *targets]).returncode
