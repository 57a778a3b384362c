"""The `fedssl` command on a tiny project with a grid: what it lists, shows and runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from fedssl.cli import snakemake_command
from tests.fixtures import make_tiny_project, run

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
