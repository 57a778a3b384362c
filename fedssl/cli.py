"""The ``fedssl`` command: one front door to the pipelines, the presets and the project's tools.

fedssl run [PIPELINE] [EXPERIMENT | STAGE]... [KEY=VALUE]... [SNAKEMAKE ARGS]...
fedssl list pipelines|experiments|methods [FILTER] [-v]
fedssl show EXPERIMENT            # resolved params and the stages it runs (YAML)
fedssl times PIPELINE             # each stage's wall time and peak memory (TSV)
fedssl export | report | board | costs | recheck | flower | flower-sim | codegraph | pipeline
       | schemas | docs | advise
                                  # the project's tools (``fedssl VERB -h``)
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import yaml

from fedssl.methods import registry
from fedssl.plan.dag import Dag
from fedssl.plan.freshness import receipt
from fedssl.plan.layout import LOGS, results_dir
from fedssl.presets import (
    ParamsError,
    Presets,
    deep_merge,
    derived_file,
    derived_from,
    model_of,
    write_derived,
)
from fedssl.stage.context import main_guard
from fedssl.stage.record import did_you_mean

# Snakemake options that say how much to run at once; without one, `fedssl run` runs on all
# cores with the one GPU slot the training stages ask for (as `make run` does)
PARALLELISM = ("--cores", "-c", "--jobs", "-j", "--profile", "--workflow-profile")
# Snakemake options whose values are stage names: a stage name after one stays its value
RULE_VALUED = ("--until", "-U", "--omit-from", "-O", "--forcerun", "-R", "--prioritize", "-P")
WIDTH, MORE = 100, " ... (-v)"  # `fedssl list` fits a terminal; -v gives whole lines
RULE_LIKE = re.compile(r"[A-Za-z_][\w-]*")  # a word Snakemake reads as a rule (not a file)

# verb -> (module, its entry point, what it does): the tools the command hands its arguments to
TOOLS = {
    "export": ("fedssl.export", "run", "an experiment's trained encoder as safetensors + card"),
    "report": ("fedssl.reporting.report", "main", "rewrite committed reports (render)"),
    "board": ("fedssl.reporting.board.write", "main", "the benchmark board: render, budget"),
    "costs": ("fedssl.projected_costs", "main", "projected full-scale client costs of presets"),
    "recheck": ("fedssl.plan.recheck", "main", "rerun committed pipelines and compare"),
    "flower": (
        "fedssl.flower.__main__",
        "main",
        "a Flower deployment with TLS and authentication: credentials | superlink | "
        "supernode | connect | submit",
    ),
    "flower-sim": ("stages.flower", "run", "a method's federated step in Flower's simulation"),
    "codegraph": ("fedssl.plan.codegraph", "main", "the import graph: cycles, a module's deps"),
    "pipeline": ("fedssl.pipeline", "main", "write / check / commit / accept / show the DAG"),
    "schemas": ("fedssl.experiment", "main", "write schemas/ from the params models"),
    "docs": ("fedssl.reporting.docs", "main", "refill the docs' results pages from the reports"),
    "advise": (
        "fedssl.reporting.board.advise",
        "main",
        "the board's lines that fit a budget on a partition, ranked, with what is resolved",
    ),
}


# ---------------------------------------------------------------------------- list
def list_pipelines(presets: Presets) -> list[str]:
    pipelines = presets.pipelines()

    def entry(e: str | dict[str, list[str]]) -> str:
        return e if isinstance(e, str) else ", ".join(f"{g}[{' '.join(ls)}]" for g, ls in e.items())

    return [
        f"{name}: {', '.join(map(entry, pipelines.spec(name).experiments))}"
        for name in pipelines.pipelines
    ]


def list_experiments(presets: Presets) -> list[str]:
    """Every experiment preset: its files, then the grid members (with their grid)."""
    members = presets.grid_members("experiment")
    return [
        f"{name}  (grid {members[name][0]})" if name in members else name
        for name in presets.names("experiment")
    ]


def method_labels(presets: Presets) -> dict[str, list[str]]:
    """Each method's row labels over every experiment preset (its variants, as reports name
    them)."""
    labels: dict[str, set[str]] = {}
    for name in presets.names("experiment"):
        p = presets.load("experiment", name).method
        labels.setdefault(p.name, set()).add(registry.get(p.name).row_label(p))
    return {m: sorted(x for x in v if x) for m, v in labels.items()}


def list_methods(presets: Presets) -> list[str]:
    labels = method_labels(presets)
    lines = []
    for m in registry.all():
        steps = ", ".join(s.name for s in m.steps) or "(steps depend on its params)"
        evaluation = ", ".join(m.evaluation_sections) or "its own steps"
        exportable = "exports its encoder" if m.encoder_builder else "no encoder to export"
        variants = [x for x in labels.get(m.name, []) if x != m.label]
        lines.append(
            f"{m.name}: {m.label or '(reference rows)'}; {exportable}; steps: {steps}; "
            f"evaluated by: {evaluation}"
            + (f"; report rows: {', '.join(variants)}" if variants else "")
        )
    return lines


def cropped(line: str, width: int = WIDTH) -> str:
    """The line, or as many of its words as fit with ``MORE`` after them."""
    if len(line) <= width:
        return line
    return line[: width - len(MORE) + 1].rsplit(" ", 1)[0].rstrip(" ,;:") + MORE


def listing(what: str, lines: list[str], pattern: str | None, verbose: bool) -> list[str]:
    """The lines holding ``pattern`` (whole lines are searched), each cropped to a terminal's
    width unless ``verbose``; none is an error that names the nearest names."""
    found = matching(lines, pattern)
    if not found and lines:
        words = {w for x in lines for w in re.findall(r"[\w-]+", x.lower())}
        near = did_you_mean(pattern.lower(), sorted(words))
        raise ParamsError(f"no line of `fedssl list {what}` holds '{pattern}'{near}")
    return found if verbose else [cropped(x) for x in found]


def matching(lines: list[str], pattern: str | None) -> list[str]:
    """The lines that hold ``pattern``, in any case; a glob (``*?[``) matches a line's name."""
    if not pattern:
        return lines
    pattern = pattern.lower()
    if any(c in pattern for c in "*?["):
        return [x for x in lines if fnmatch.fnmatch(re.split("[: ]", x)[0].lower(), pattern)]
    return [x for x in lines if pattern in x.lower()]


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
@dataclass
class RunArgs:
    """``fedssl run``'s arguments, sorted: what is the command's own, what goes to Snakemake."""

    pipeline: str | None = None
    experiments: list[str] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)
    overrides: dict[str, object] = field(default_factory=dict)  # dotted key -> value
    snakemake: list[str] = field(default_factory=list)
    # bare words that name no target of ours: (word, the option before it, words since it)
    unknown: list[tuple[str, str | None, int]] = field(default_factory=list)


def is_override(arg: str) -> bool:
    """``KEY=VALUE`` whose first key is a section of the experiment model (``linear_probe.lr=
    0.05``), not a Snakemake value such as ``gpu=1``."""
    key = arg.split("=", 1)[0]
    return "=" in arg and key.split(".")[0] in model_of("experiment").model_fields


def parse_value(text: str):
    """A value as YAML reads it, and a number in any notation as a number (YAML 1.1 reads
    ``1e-6`` as a string)."""
    if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", text.strip()):
        return float(text)
    return yaml.safe_load(text)


def sort_run_args(presets: Presets, args: list[str]) -> RunArgs:
    """Targets and overrides in any order among Snakemake's arguments. A name after a
    Snakemake option is that option's value unless it names a pipeline, an experiment or a
    stage (``-n evaluate__x``; ``--until evaluate__x`` keeps it)."""
    pipelines = set(presets.pipelines().pipelines)
    experiments = set(presets.names("experiment"))
    out, after_option, since = RunArgs(), None, 0
    for arg in args:
        if arg.startswith("-"):
            out.snakemake.append(arg)
            after_option, since = (None if "=" in arg else arg), 0
            continue
        since += 1
        ours = after_option not in RULE_VALUED or "=" in arg  # no stage name holds a '='
        if ours and arg in pipelines and out.pipeline is None:
            out.pipeline = arg
        elif ours and arg in experiments:
            out.experiments.append(arg)
        elif ours and is_override(arg):
            key, value = arg.split("=", 1)
            out.overrides[key] = parse_value(value)
        elif ours and "__" in arg and after_option not in ("--config", "-C"):
            out.stages.append(arg)
        else:
            out.snakemake.append(arg)
            if ours and RULE_LIKE.fullmatch(arg) and arg != "all":
                out.unknown.append((arg, after_option, since - 1))
    return out


@cache
def snakemake_options() -> dict:
    """Snakemake's options by name, as its own parser reads them (imported only when a word
    is in doubt: it takes seconds)."""
    from snakemake.cli import get_argument_parser

    return {o: a for a in get_argument_parser()._actions for o in a.option_strings}


def option_value(option: str | None, position: int) -> bool:
    """Whether the word ``position`` words after ``option`` is that option's value."""
    if option is None:
        return False
    action = snakemake_options().get(option)
    if action is None:  # not Snakemake's: its own error will say so
        return True
    return action.nargs in ("*", "+") or (action.nargs != 0 and position == 0)


def check_targets(presets: Presets, pipeline: str, args: RunArgs) -> None:
    """A word that names no pipeline, experiment or stage stops the run in one line, with the
    names nearest it (Snakemake would take it for a rule and fail with a traceback)."""
    for word, option, position in args.unknown:
        if not option_value(option, position):
            names = [*presets.pipelines().pipelines, *presets.names("experiment")]
            raise ParamsError(
                f"'{word}' is no pipeline, experiment or stage{did_you_mean(word, names)}: "
                "`fedssl list pipelines`, `fedssl list experiments`"
            )
    if args.stages:
        stages = Dag(pipeline, presets.root, presets=presets).stages
        for stage in args.stages:
            if stage not in stages:
                raise ParamsError(
                    f"no stage '{stage}' in pipeline '{pipeline}'{did_you_mean(stage, stages)}"
                    f": `fedssl pipeline show {pipeline}` lists them"
                )


def pipeline_of(presets: Presets, experiments: list[str]) -> str:
    """The default pipeline if it runs every experiment named, else the first that does."""
    names = list(presets.pipelines().pipelines)
    for name in ["default", *names]:
        if set(experiments) <= set(presets.pipeline_experiments(name)):
            return name
    raise SystemExit(f"error: no pipeline of params/pipelines.yaml runs {', '.join(experiments)}")


def nested(overrides: dict[str, object]) -> dict:
    tree: dict = {}
    for key, value in overrides.items():
        for part in reversed(key.split(".")):
            value = {part: value}
        tree = deep_merge(tree, value)
    return tree


def derive(presets: Presets, experiments: list[str], overrides: dict) -> list[str]:
    """Each experiment's override run (``EXP@<hash>``), recorded and validated first (as a
    params file is: the field and the value named)."""
    names = []
    for base in experiments:
        name = write_derived(base, nested(overrides))
        try:
            presets.load("experiment", name)
        except ParamsError:
            derived_file(name).unlink()
            raise
        names.append(name)
    return names


def derived_targets(presets: Presets, derived: list[str], stages: list[str]) -> list[str]:
    """The stages of the override runs: all of them, or those of the kinds named."""
    dag = Dag(None, presets.root, experiments=derived, presets=presets)
    kinds = {s.split("__", 1)[0] for s in stages}
    return [
        s for d in derived for s in dag.of_experiment[d] if not kinds or dag.stages[s].kind in kinds
    ]


def snakemake_command(
    pipeline: str, args: list[str], targets: list[str] = (), derived: list[str] = ()
) -> list[str]:
    """``snakemake`` with the targets first (an option such as ``--resources`` takes every
    word after it), the user's arguments, and ``--config pipeline=... [derived=...]`` last
    (config items the user gave are kept in it)."""
    config, rest, i = [f"pipeline={pipeline}"], [], 0
    config += [f"derived={','.join(derived)}"] if derived else []
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
    return ["snakemake", *targets, *defaults, *rest, "--config", *config]


def run_pipeline(presets: Presets, argv: list[str]) -> int:
    args = sort_run_args(presets, argv)
    pipeline = args.pipeline or (
        pipeline_of(presets, args.experiments) if args.experiments else "default"
    )
    check_targets(presets, pipeline, args)
    targets = list(args.stages)
    if args.experiments:  # an experiment stands for every stage it runs
        dag = Dag(None, presets.root, experiments=args.experiments, presets=presets)
        for exp in args.experiments:
            targets += [s for s in dag.of_experiment[exp] if s not in targets]
    derived = []
    if args.overrides:  # runs of their own, beside the presets' (whose results stay)
        scope = args.experiments or [s.split("__", 1)[1] for s in args.stages]
        scope = sorted(set(scope or presets.pipeline_experiments(pipeline)))
        derived = derive(presets, scope, args.overrides)
        targets = derived_targets(presets, derived, [] if args.experiments else args.stages)
        sets = " ".join(f"{k}={v}" for k, v in args.overrides.items())
        for name in derived:
            print(
                f"override run {name}: {derived_from(name)} with {sets}; results in "
                f"{results_dir(name)} (the preset's and dvc.lock stay as they are)",
                file=sys.stderr,
            )
    cmd = snakemake_command(pipeline, args.snakemake, targets, derived)
    print("$ " + " ".join(cmd), file=sys.stderr)
    started = time.time()
    code = subprocess.run(cmd).returncode
    for line in failures(started) if code else []:  # last, under Snakemake's own report
        print(line, file=sys.stderr)
    return code


def failures(started: float) -> list[str]:
    """One line per stage that this run started and did not finish (its log is newer than
    ``started``, its receipt is not): the stage's own last error line (a stage says what
    went wrong in one line, which Snakemake's report leaves twenty lines above its end)."""
    lines = []
    for log in sorted(LOGS.glob("*.log")):
        done = receipt(log.stem)
        if log.stat().st_mtime < started or (done.exists() and done.stat().st_mtime >= started):
            continue
        said = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
        last = next(
            (x for x in reversed(said) if x.startswith("error: ")), said[-1] if said else ""
        )
        why = last.removeprefix("error: ") or "no output"
        lines.append(f"error: stage {log.stem} failed: {why} (log: {log})")
    return lines


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
    from fedssl.stage.context import run_record

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
def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return f"fedssl {installed('fedssl')}"
    except PackageNotFoundError:
        return "fedssl (not installed)"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fedssl",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--version", action="version", version=version())
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="VERB")
    sub.add_parser(
        "run",
        help="run a pipeline through Snakemake: [PIPELINE] [EXPERIMENT|STAGE]... "
        "[KEY=VALUE]... [SNAKEMAKE ARGS]...",
    )
    ls = sub.add_parser("list", help="list pipelines, experiments (grid members too) or methods")
    ls.add_argument("what", choices=("pipelines", "experiments", "methods"))
    ls.add_argument("filter", nargs="?", help="only lines holding it (a glob with * ? [ ])")
    ls.add_argument(
        "-v", "--verbose", action="store_true", help=f"whole lines (else cropped to {WIDTH})"
    )
    sh = sub.add_parser("show", help="an experiment's effective params and its stages (YAML)")
    sh.add_argument("experiment")
    tm = sub.add_parser("times", help="each stage's wall time and peak memory (TSV)")
    tm.add_argument("pipeline")
    tm.add_argument("--out", help="file to write (default: print)")
    tm.add_argument("--note", default="", help="comment lines above (the machine, ...)")
    for verb, (_, _, what) in TOOLS.items():
        sub.add_parser(verb, help=what, add_help=False)
    return ap


RUN_HELP = """\
usage: fedssl run [PIPELINE] [EXPERIMENT | STAGE]... [KEY=VALUE]... [SNAKEMAKE ARGS]...

Run a pipeline of params/pipelines.yaml (default: 'default') through Snakemake, in any order:
  PIPELINE      a pipeline (default: the default pipeline, or the first that runs the
                experiments named)
  EXPERIMENT    every stage of that experiment (and what it needs)
  STAGE         one stage, e.g. evaluate__fmnist_fedsimclr (and what it needs)
  KEY=VALUE     override a setting of the experiments named (all of the pipeline's when none
                is), validated as a params file is, e.g. linear_probe.lr=0.05; runs as
                an experiment of its own, EXPERIMENT@<hash> (results/experiments/ under
                that id, the overrides in its meta.json); the preset's results and dvc.lock
                stay as they were
  other words   go to snakemake (-n: dry run, --cores N, --profile ...); without --cores
                or --resources it runs on all cores with one GPU slot
"""


def run(argv: list[str]) -> int:
    if argv[:1] == ["run"]:  # every argument after it is Snakemake's or a target, even -n
        if argv[1:2] in (["-h"], ["--help"]):
            print(RUN_HELP, end="")
            return 0
        return run_pipeline(Presets(), argv[1:])
    if argv[:1] and argv[0] in TOOLS:
        module, entry, _ = TOOLS[argv[0]]
        sys.argv[0] = f"fedssl {argv[0]}"
        return getattr(importlib.import_module(module), entry)(argv[1:]) or 0
    args = parser().parse_args(argv)
    presets = Presets()
    if args.cmd == "list":
        lines = {
            "pipelines": list_pipelines,
            "experiments": list_experiments,
            "methods": list_methods,
        }[args.what](presets)
        print("\n".join(listing(args.what, lines, args.filter, args.verbose)))
    elif args.cmd == "show":
        print(show_params(presets, args.experiment), end="", flush=True)
        print(show_stages(presets, args.experiment), end="")  # planning takes a while
    elif args.cmd == "times":
        text = stage_times(Dag(args.pipeline), args.note)
        if args.out:
            Path(args.out).write_text(text)
        else:
            print(text, end="")
    return 0


def main() -> None:
    """The console script: errors in params or data are one message and exit 2; a reader
    that closes the pipe early (``| head``) ends it quietly."""
    code = 0

    def body(argv: list[str]) -> None:
        nonlocal code
        code = run(argv)

    try:
        main_guard(body)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        code = 0
    sys.exit(code)


if __name__ == "__main__":
    main()
