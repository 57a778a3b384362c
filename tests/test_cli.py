"""The `fedssl` command on a tiny project with a grid: what it lists, shows and runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from fedssl.cli import snakemake_command
from tests.fixtures import REPO, make_tiny_project, run

pytestmark = pytest.mark.timeout(600)

# probe lr on an axis of labels -> values; the model width on an overlaid axis of partial presets
GRIDS = """\
axes:
  plr: {lr05: 0.05, lr10: 0.1}
experiments:
  tiny_sweep:
    name: tiny_simclr_{variant}_{plr}
    extends: tiny_simclr
    axes:
      variant: {wide: {method: {model: {width: 8}}}, narrow: {method: {model: {width: 2}}}}
    overlays: [variant]
    set: {title: "FedSimCLR {variant}", linear_probe: {lr: "{plr.value}"}}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = make_tiny_project(tmp_path_factory.mktemp("cli"), git=False)
    (root / "params" / "grids.yaml").write_text(GRIDS)
    return root


def fedssl(project, *args, check=True) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "fedssl.cli", *args], project, check=check)


def test_list_names_pipelines_experiments_with_grid_members_and_methods(project):
    assert fedssl(project, "list", "pipelines").stdout.splitlines() == [
        "default: tiny_simclr, tiny_random, tiny_pixels"
    ]
    experiments = fedssl(project, "list", "experiments").stdout.splitlines()
    assert experiments[:3] == ["tiny_pixels", "tiny_random", "tiny_simclr"]
    assert "tiny_simclr_narrow_lr10  (grid tiny_sweep)" in experiments
    assert len(experiments) == 3 + 4
    methods = {
        line.split(":")[0]: line for line in fedssl(project, "list", "methods").stdout.splitlines()
    }
    assert {"fedsimclr", "mfcl", "cpcfl", "none", "mocosfl"} <= set(methods)
    assert "steps: pretrain, export, rserver" in methods["mfcl"]
    assert "no encoder to export" in methods["cpcfl"]


def test_list_fits_a_terminal_and_v_gives_whole_lines():
    def lines(*args):
        return run([sys.executable, "-m", "fedssl.cli", "list", *args], REPO).stdout.splitlines()

    for what in ("pipelines", "experiments", "methods"):
        brief, whole = lines(what), lines(what, "-v")
        assert len(brief) == len(whole) and max(map(len, brief)) <= 100, what
        for short, line in zip(brief, whole):
            assert short == line or (
                short.endswith(" ... (-v)") and line.startswith(short[: -len(" ... (-v)")])
            )
    assert max(len(x) for x in lines("methods", "-v")) > 300  # MpFedcon's report rows


def test_show_gives_a_grid_members_effective_params_and_its_stages(project):
    doc = yaml.safe_load(fedssl(project, "show", "tiny_simclr_wide_lr10").stdout)
    assert doc["defined_in"] == ["params/grids.yaml", "params/experiments/tiny_simclr.yaml"]
    assert doc["grid"] == {"name": "tiny_sweep", "axes": {"variant": "wide", "plr": "lr10"}}
    p = doc["params"]
    assert p["linear_probe"]["lr"] == 0.1  # the axis value
    assert p["method"]["model"]["width"] == 8  # the overlay
    assert p["method"]["model"]["norm"] == "gn"  # from the preset it extends
    assert p["title"] == "FedSimCLR wide"
    assert p["finetune"] is None  # a default (no finetune section)
    # the two probe lrs share one pretraining, named after the first member
    assert doc["stages"] == {
        "pretrain__tiny_simclr_wide_lr05": {
            "kind": "pretrain",
            "out": "artifacts/experiments/tiny_simclr_wide_lr05/pretrain",
            "shared_with": "tiny_simclr_wide_lr05",
        },
        "features__tiny_simclr_wide_lr05": {
            "kind": "features",
            "out": "artifacts/experiments/tiny_simclr_wide_lr05/features",
            "shared_with": "tiny_simclr_wide_lr05",
        },
        "evaluate__tiny_simclr_wide_lr10": {
            "kind": "evaluate",
            "out": "artifacts/experiments/tiny_simclr_wide_lr10/evaluate",
        },
        "costs__tiny_simclr_wide_lr05": {
            "kind": "costs",
            "out": "artifacts/experiments/tiny_simclr_wide_lr05/costs",
            "shared_with": "tiny_simclr_wide_lr05",
        },
    }


def test_show_of_an_unknown_experiment_names_the_file(project):
    proc = fedssl(project, "show", "tiny_nothing", check=False)
    assert proc.returncode == 2
    assert "params/experiments/tiny_nothing.yaml: no such params file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_mistyped_name_is_one_line_with_the_names_nearest_it(project):
    """A pipeline, an experiment or a stage misspelt (before or after a Snakemake flag) stops
    before Snakemake, which would fail on it with a long traceback; so do a method's name in
    a params file and a filter that matches nothing."""
    for args, message in [
        (["run", "defualt", "-n"], "'defualt' is no pipeline, experiment or stage "
         "(did you mean 'default'?)"),
        (["run", "-n", "tiny_simclrr"], "(did you mean 'tiny_simclr'?)"),
        (["run", "evaluate__tiny_pixel", "-n"], "no stage 'evaluate__tiny_pixel' in pipeline "
         "'default' (did you mean 'evaluate__tiny_pixels'"),
        (["show", "tiny_simclrr"], "(did you mean 'tiny_simclr'?)"),
        (["list", "methods", "fedsimlcr"], "(did you mean 'fedsimclr'?)"),
    ]:  # fmt: skip
        proc = fedssl(project, *args, check=False)
        assert (proc.returncode, proc.stdout) == (2, ""), args
        assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    # a Snakemake option's value is no target
    assert fedssl(project, "run", "-n", "--cores", "1", "--rerun-triggers", "mtime").returncode == 0
    # a method misspelt in a params file: the nearest methods first
    bad = project / "params/experiments/tiny_bad.yaml"
    bad.write_text("extends: tiny_simclr\nmethod: {name: fedsimcl}\n")
    try:
        proc = fedssl(project, "show", "tiny_bad", check=False)
    finally:
        bad.unlink()
    assert proc.returncode == 2
    assert "method: 'fedsimcl' is not a known name (did you mean 'fedsimclr'" in proc.stderr


def test_a_dry_run_leaves_the_working_tree_as_it_was(tmp_path):
    """Planning a pipeline whose stages were never written (here its report) writes nothing
    git sees: the plan records are written when jobs run (a dry run once left one per stage,
    69 untracked files for `fedssl run mfcl_smoke -n`)."""
    root = make_tiny_project(tmp_path / "p")
    with open(root / "params/pipelines.yaml", "a") as f:
        f.write("  pixels_only: [tiny_pixels]\n")
    run(["git", "add", "-A"], root)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "clone"], root)
    status = ["git", "status", "--porcelain", "--untracked-files=all"]
    assert run(status, root).stdout == ""
    fedssl(root, "run", "pixels_only", "-n")
    fedssl(root, "run", "tiny_simclr", "-n")
    assert run(status, root).stdout == ""
    fedssl(root, "run", "pixels_only", "-c1")  # a run writes the records its jobs read
    assert (root / "pipelines/plan/report__pixels_only.json").is_file()


def test_run_calls_snakemake_on_the_pipeline(project):
    proc = fedssl(project, "run", "default", "-n")
    assert "$ snakemake --cores all --resources gpu=1 -n --config pipeline=default" in proc.stderr
    jobs = set(re.findall(r"^(\w+__\w+)\s+\d+$", proc.stdout, re.M))
    assert {"pretrain__tiny_simclr", "evaluate__tiny_pixels", "report__default"} <= jobs
    assert not (project / "artifacts" / "experiments").exists()  # a dry run


def test_snakemake_command_keeps_targets_and_config_items():
    assert snakemake_command("mfcl", ["-n", "evaluate__x", "--config", "gpus=0"]) == [
        "snakemake",
        "--cores",
        "all",
        "--resources",
        "gpu=1",
        "-n",
        "evaluate__x",
        "--config",
        "pipeline=mfcl",
        "gpus=0",
    ]
    assert snakemake_command("default", ["-c2", "--resources", "gpu=0"]) == [
        "snakemake",
        "-c2",
        "--resources",
        "gpu=0",
        "--config",
        "pipeline=default",
    ]
    assert snakemake_command("default", ["--workflow-profile", "profiles/slurm"])[:3] == [
        "snakemake",
        "--resources",
        "gpu=1",
    ]


def test_export_of_an_untrained_experiment_says_which_stage_to_run(project):
    proc = fedssl(project, "export", "tiny_random", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "run its stage 'prepare_data__tiny' first" in proc.stderr
    proc = fedssl(project, "export", "tiny_sweep_nothing", check=False)
    assert proc.returncode == 2 and "no such params file" in proc.stderr


def test_times_lists_each_stage_run_once_with_its_wall_time_and_memory(project):
    """`fedssl times`: one line per stage that has a run record, under the first experiment
    that lists it; a shared stage is not counted twice; stages never run are left out."""
    runs = project / "artifacts" / ".runs"
    runs.mkdir(parents=True, exist_ok=True)
    records = {
        "pretrain__tiny_simclr": {"wall_seconds": 12.345, "peak_memory_bytes": 300 * 2**20},
        "evaluate__tiny_simclr": {"wall_seconds": 2.0, "precision": "bf16"},
    }
    for stage, record in records.items():
        (runs / f"{stage}.json").write_text(json.dumps({"stage": stage, **record}))
    out = project / "times.tsv"
    fedssl(project, "times", "default", "--note", "2 cores\nnothing beside", "--out", str(out))
    lines = out.read_text().splitlines()
    assert lines[:3] == [
        "# 2 cores",
        "# nothing beside",
        "experiment\tstage\twall_seconds\tresumed_from_round\tprecision\tpeak_MiB",
    ]
    assert sorted(lines[3:]) == [
        "tiny_simclr\tevaluate\t2.00\t\tbf16\t",
        "tiny_simclr\tpretrain\t12.35\t\t\t300",
    ]


# ------------------------------------------------------------------ one command (as in the README)
def test_run_sorts_targets_overrides_and_snakemake_words_in_any_order(project):
    from fedssl.cli import sort_run_args
    from fedssl.presets import Presets

    args = sort_run_args(
        Presets(project / "params"),
        ["-n", "evaluate__tiny_pixels", "linear_probe.lr=0.05", "--cores", "2", "tiny_simclr"]
        + ["default", "--resources", "gpu=0", "--until", "features__tiny_simclr", "knn.k=5"],
    )
    assert args.pipeline == "default"
    assert args.experiments == ["tiny_simclr"] and args.stages == ["evaluate__tiny_pixels"]
    assert args.overrides == {"linear_probe.lr": 0.05, "knn.k": 5}
    assert args.snakemake == [
        "-n", "--cores", "2", "--resources", "gpu=0", "--until", "features__tiny_simclr",
    ]  # fmt: skip
    # the targets go first: `--resources gpu=1` would take every word after it
    assert snakemake_command("default", ["-n"], ["evaluate__x"])[:2] == ["snakemake", "evaluate__x"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return make_tiny_project(tmp_path_factory.mktemp("cli_runs"), git=False)


def metrics_of(root, experiment: str) -> dict:
    return json.loads((root / f"results/experiments/{experiment}/metrics.json").read_text())


def test_run_a_stage_then_an_override_that_is_validated_and_recorded(runs):
    """`fedssl run evaluate__X` runs that stage and what it needs (the wrapper once put it
    after `--resources`, which swallowed it); `KEY=VALUE` changes it for one run, is checked
    as a params file is, and runs as an experiment of its own (`tiny_pixels@<hash>`), with
    the overrides in its records; the preset's result stays, and a plain run has nothing to do."""
    fedssl(runs, "run", "evaluate__tiny_pixels", "--cores", "1")
    plain = metrics_of(runs, "tiny_pixels")
    assert not (runs / "artifacts/experiments/tiny_simclr").exists()  # only what it needs

    bad = fedssl(runs, "run", "tiny_pixels", "linear_probe.lr=-1", "--cores", "1", check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "with the command line's overrides: invalid parameters" in bad.stderr
    assert "linear_probe.lr: Input should be greater than 0" in bad.stderr
    assert "$ snakemake" not in bad.stderr  # stopped before running anything
    assert not list((runs / "artifacts/.overrides").glob("*"))  # nor kept the bad run

    # a probe that barely trains: one epoch at a learning rate of 1e-6, on the stage named
    args = ["linear_probe.epochs=1", "evaluate__tiny_pixels", "linear_probe.lr=1e-6", "-c1"]
    derived = "tiny_pixels@" + fedssl(runs, "run", *args).stderr.split("tiny_pixels@")[1][:8]
    meta = json.loads((runs / f"artifacts/experiments/{derived}/evaluate/meta.json").read_text())
    assert meta["overrides"] == {"linear_probe": {"epochs": 1, "lr": 1e-6}}
    record = json.loads((runs / f"artifacts/.runs/evaluate__{derived}.json").read_text())
    assert record["overrides"] == meta["overrides"]
    assert metrics_of(runs, derived)["linear_top1"] < plain["linear_top1"] - 20
    assert metrics_of(runs, "tiny_pixels") == plain

    again = fedssl(runs, "run", "tiny_pixels", "--cores", "1")  # without: the preset, as it was
    assert "Nothing to be done" in again.stdout + again.stderr
    meta = json.loads((runs / "artifacts/experiments/tiny_pixels/evaluate/meta.json").read_text())
    assert "overrides" not in meta


LIST_EXPERIMENTS = f"{sys.executable} -m fedssl.cli list experiments"


def test_version_and_a_reader_that_stops_early():
    version = run([sys.executable, "-m", "fedssl.cli", "--version"], REPO).stdout
    assert re.fullmatch(r"fedssl \d+\.\d+\.\d+\S*\n", version)
    # 1,400 experiments: more than one pipe buffer, so the reader leaves before the end
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f"set -o pipefail; {sys.executable} -m fedssl.cli list experiments | head -1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == "bench_cpcfl\n"


def test_list_filters_and_names_every_row_label_the_reports_use():
    def lines(*args):
        return run([sys.executable, "-m", "fedssl.cli", "list", *args], REPO).stdout.splitlines()

    methods = "\n".join(lines("methods", "-v"))
    for label in ("SCAFFOLD (canonical, η_g=1)", "Ditto (λ=1)", "MOON (μ=1)", "FedProx (μ=0.01)"):
        assert label in methods
    assert [x.split(":")[0] for x in lines("methods", "scaffold")] == ["mpfedcon"]
    assert lines("experiments", "smoke_mfcl_*_dir001") == [
        f"smoke_mfcl_{n}_dir001  (grid smoke_mfcl)" for n in ("tn", "gn", "bn")
    ]
    assert lines("pipelines", "DEFAULT") == [
        "default: fmnist_fedsimclr, fmnist_random_init, fmnist_pixels"
    ]


def test_the_tools_are_verbs(project):
    helps = {v: fedssl(project, v, "-h").stdout for v in ("report", "board", "costs", "recheck")}
    assert all(text.startswith(f"usage: fedssl {v}") for v, text in helps.items())
    deps = fedssl(project, "codegraph", "deps", "fedssl.stage.progress").stdout.split()
    assert deps == ["fedssl/__init__.py", "fedssl/stage/__init__.py", "fedssl/stage/progress.py"]
    shown = fedssl(project, "pipeline", "show", "default").stdout
    assert "evaluate__tiny_pixels" in shown
    assert fedssl(project, "docs", "--check", check=False).returncode == 0  # no docs/: none stale
