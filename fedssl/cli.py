"""The ``fedssl`` command: a front door to the existing front ends (it replaces none of them).

fedssl list pipelines|experiments|methods
fedssl show EXPERIMENT            # resolved params (extends, grid axes and overlays,
                                  # defaults) as YAML, and the stages it runs
fedssl run [PIPELINE] [SNAKEMAKE ARGS...]   # snakemake ... --config pipeline=PIPELINE
fedssl export EXPERIMENT [--out DIR]        # python -m fedssl.export
fedssl flower COMMAND ...                   # python -m fedssl.flower: a Flower deployment
fedssl times PIPELINE [--out FILE] [--note TEXT]  # each stage's wall time and peak memory
                                  # from its last run's record (artifacts/.runs), as a TSV
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

from fedssl.export import run as export_command
from fedssl.methods import registry
from fedssl.plan.dag import Dag
from fedssl.presets import Presets
from fedssl.stage import main_guard

# Snakemake options that say how much to run at once; without one, `fedssl run` runs on all
# cores with the one GPU slot the training stages ask for (as `make run` does)
PARALLELISM = ("--cores", "-c", "--jobs", "-j", "--profile", "--workflow-profile")


# ---------------------------------------------------------------------------- list
def list_pipelines(presets: Presets) -> list[str]:
    pipelines = presets.pipelines()
    return [
        f"{name}: {', '.join(pipelines.spec(name).experiments)}" for name in pipelines.pipelines
    ]


def list_experiments(presets: Presets) -> list[str]:
    """Every experiment preset: its files, then the grid members (with their grid)."""
    members = presets.grid_members("experiment")
    return [
        f"{name}  (grid {members[name][0]})" if name in members else name
        for name in presets.names("experiment")
    ]


def list_methods() -> list[str]:
    lines = []
    for m in registry.all():
        steps = ", ".join(s.name for s in m.steps) or "(steps depend on its params)"
        evaluation = ", ".join(m.evaluation_sections) or "its own steps"
        exportable = "exports its encoder" if m.encoder_builder else "no encoder to export"
        lines.append(
            f"{m.name}: {m.label or '(reference rows)'}; steps: {steps}; "
            f"evaluated by: {evaluation}; {exportable}"
        )
    return lines


# ---------------------------------------------------------------------------- show
def show_params(presets: Presets, experiment: str) -> str:
    """The experiment's effective params, where they come from, and its grid axes (YAML)."""
    resolved = presets.resolve("experiment", experiment)
    doc: dict = {
        "experiment": experiment,
        "defined_in": list(dict.fromkeys(str(layer.file) for layer in resolved.layers)),
    }
    members = presets.grid_members("experiment")
    if experiment in members:
        grid, axes = members[experiment]
        doc["grid"] = {"name": grid, "axes": axes}
    doc["params"] = presets.load("experiment", experiment).model_dump(mode="json")
    return yaml.safe_dump(doc, sort_keys=False, width=100)


def show_stages(presets: Presets, experiment: str) -> str:
    """The stages the experiment runs (YAML): a stage it shares is named after the experiment
    that owns its content."""
    dag = Dag(None, presets.root, experiments=[experiment], presets=presets)
    stages = {}
    for name in dag.of_experiment[experiment]:
        stage, owner = dag.stages[name], name.split("__", 1)[1]
        stages[name] = {
            "kind": stage.kind,
            "out": stage.out,
            **({"shared_with": owner} if owner != experiment else {}),
        }
    return yaml.safe_dump({"stages": stages}, sort_keys=False, width=100)


# ---------------------------------------------------------------------------- run
def snakemake_command(pipeline: str, args: list[str]) -> list[str]:
    """``snakemake`` with the user's arguments and ``--config pipeline=...`` last (config
    items the user gave are kept in it; stage names as targets stay before it)."""
    config, rest, i = [f"pipeline={pipeline}"], [], 0
    while i < len(args):
        if args[i] in ("--config", "-C"):
            i += 1
            while i < len(args) and not args[i].startswith("-"):
                config.append(args[i])
                i += 1
        else:
            rest.append(args[i])
            i += 1
    given = {a.split("=", 1)[0] for a in rest}
    defaults = []
    if not given & set(PARALLELISM) and not any(
        a[:2] in ("-c", "-j") and a[2:].isdigit() for a in rest
    ):
        defaults += ["--cores", "all"]
    if "--resources" not in given and "--res" not in given:
        defaults += ["--resources", "gpu=1"]
    return ["snakemake", *defaults, *rest, "--config", *config]


def run_pipeline(presets: Presets, args: list[str]) -> int:
    pipeline = "default"
    if args and not args[0].startswith("-"):
        if args[0] in presets.pipelines().pipelines:
            pipeline, args = args[0], args[1:]
    cmd = snakemake_command(pipeline, args)
    print("$ " + " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd).returncode


# ---------------------------------------------------------------------------- times
TIMES_COLUMNS = (
    "experiment",
    "stage",
    "wall_seconds",
    "resumed_from_round",
    "precision",
    "peak_MiB",
)


def stage_times(dag: Dag, note: str = "") -> str:
    """A TSV of each stage of the pipeline that has a run record: its experiment (the first
    that lists it), wall seconds of its last run (a resumed stage counts its last part only:
    the round it resumed from says so), precision and peak memory; ``note`` (the machine,
    what ran beside) as comment lines above."""
    from fedssl.stage import run_record

    lines = [f"# {line}" for line in note.splitlines()] + ["\t".join(TIMES_COLUMNS)]
    seen = set()
    for exp in dag.experiments:
        for stage in dag.of_experiment[exp]:
            record = run_record(stage)
            if stage in seen or not record:
                continue
            seen.add(stage)
            row = (
                exp,
                dag.stages[stage].kind,
                f"{record['wall_seconds']:.2f}",
                str(record.get("resumed_from_round", "")),
                record.get("precision", ""),
                f"{record['peak_memory_bytes'] / 2**20:.0f}"
                if "peak_memory_bytes" in record
                else "",
            )
            lines.append("\t".join(row))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- command line
def run(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="fedssl", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="list pipelines, experiments (grid members too) or methods")
    ls.add_argument("what", choices=("pipelines", "experiments", "methods"))
    sh = sub.add_parser("show", help="an experiment's effective params and its stages (YAML)")
    sh.add_argument("experiment")
    sub.add_parser(
        "run",
        help="[PIPELINE] [SNAKEMAKE ARGS...]: run a pipeline (default: "
        "'default') through Snakemake; the arguments after it go to snakemake "
        "(e.g. -n, a stage name)",
    )
    ex = sub.add_parser("export", help="write an experiment's trained encoder (safetensors + card)")
    ex.add_argument("experiment")
    ex.add_argument("--out", help="folder to write (default: artifacts/exports/<experiment>)")
    tm = sub.add_parser("times", help="each stage's wall time and peak memory (TSV)")
    tm.add_argument("pipeline")
    tm.add_argument("--out", help="file to write (default: print)")
    tm.add_argument("--note", default="", help="comment lines above (the machine, ...)")
    sub.add_parser(
        "flower",
        help="credentials | superlink | supernode | connect | submit: a Flower deployment "
        "with TLS and authentication (= python -m fedssl.flower)",
    )
    if argv[:1] == ["run"]:  # every argument after it is Snakemake's, even -h
        sys.exit(run_pipeline(Presets(), argv[1:]))
    if argv[:1] == ["flower"]:  # its own subcommands and options
        from fedssl.flower.__main__ import main as flower

        return flower(argv[1:])
    args = ap.parse_args(argv)
    presets = Presets()
    if args.cmd == "list":
        lines = {
            "pipelines": lambda: list_pipelines(presets),
            "experiments": lambda: list_experiments(presets),
            "methods": list_methods,
        }[args.what]()
        print("\n".join(lines))
    elif args.cmd == "show":
        print(show_params(presets, args.experiment), end="", flush=True)
        print(show_stages(presets, args.experiment), end="")  # planning takes a while
    elif args.cmd == "times":
        text = stage_times(Dag(args.pipeline), args.note)
        if args.out:
            Path(args.out).write_text(text)
        else:
            print(text, end="")
    else:
        export_command([args.experiment, *(["--out", args.out] if args.out else [])])


def main() -> None:
    """The console script (errors in params or data: one message, exit 2)."""
    main_guard(run)


if __name__ == "__main__":
    main()
