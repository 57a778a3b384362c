"""Snakemake and DVC driving the real stages on a tiny project: both front ends agree on what is
up to date, an edited param reruns only its stage and what depends on it, and restored file
times (as after `dvc checkout`) rerun nothing."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from tests.fixtures import make_tiny_project, run

pytestmark = pytest.mark.timeout(900)


def planned_jobs(project: Path) -> set[str]:
    """Jobs a Snakemake dry run would execute (the `all` target excluded)."""
    out = run(["snakemake", "-n", "--cores", "1"], project).stdout
    return {m.group(1) for m in re.finditer(r"^(\w+__\w+)\s+\d+$", out, re.M)}


def dvc_stale(project: Path) -> set[str]:
    out = run(["dvc", "status", "--json"], project).stdout
    return set(json.loads(out or "{}"))


def set_probe_lr(project: Path, exp: str, lr: float) -> None:
    path = project / "params" / "experiments" / f"{exp}.yaml"
    text = re.sub(r"(linear_probe: \{epochs: \d+, lr: )[0-9.]+", rf"\g<1>{lr}", path.read_text())
    path.write_text(text)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = make_tiny_project(tmp_path_factory.mktemp("project"))
    run(["python", "-m", "fedssl.pipeline", "write"], root)
    run(["snakemake", "--cores", "2", "--resources", "gpu=1"], root)
    return root


def test_snakemake_runs_every_stage_and_reports(project):
    report = (project / "artifacts" / "report" / "report.csv").read_text().splitlines()
    assert report[0].startswith("experiment,title,partition,method")
    rows = {line.split(",")[0]: line.split(",") for line in report[1:]}
    assert set(rows) == {"tiny_simclr", "tiny_random", "tiny_pixels"}
    metrics = json.loads((project / "artifacts/experiments/tiny_pixels/metrics.json").read_text())
    assert metrics["linear_top1"] == 100.0  # the toy classes are linearly separable in pixels
    rounds = (project / "artifacts/experiments/tiny_simclr/rounds.tsv").read_text().splitlines()
    assert len(rounds) == 3  # header + 2 rounds
    assert (project / "artifacts/report/partition_tiny_dir05_m3.png").read_bytes()[:4] == \
        b"\x89PNG"


def test_dvc_sees_nothing_to_do_after_snakemake(project):
    assert dvc_stale(project) == set()
    assert planned_jobs(project) == set()


def test_param_edit_reruns_only_downstream_in_both_front_ends(project):
    set_probe_lr(project, "tiny_simclr", 0.05)
    assert planned_jobs(project) == {"evaluate__tiny_simclr", "report__default"}
    assert dvc_stale(project) == {"evaluate__tiny_simclr"}  # DVC learns about report later
    run(["dvc", "repro"], project)
    assert dvc_stale(project) == set()
    assert planned_jobs(project) == set()  # what DVC ran, Snakemake does not redo


def test_restored_file_times_rerun_nothing(project):
    restored = time.time() - 60  # as `dvc checkout` leaves them: all files freshly written,
    for path in sorted((project / "artifacts").rglob("*"), reverse=True):
        os.utime(path, (restored, restored))
    for path in (project / "artifacts" / "data").rglob("*"):
        os.utime(path, (restored + 30, restored + 30))  # the data set newest of all
    assert planned_jobs(project) == set()
    assert dvc_stale(project) == set()


def evaluated_lr(project: Path, exp: str) -> float:
    meta = json.loads((project / f"artifacts/experiments/{exp}/evaluate/meta.json").read_text())
    return meta["params"][f"params/experiments/{exp}.yaml"]["linear_probe"]["lr"]


def test_one_stage_by_name_in_both_front_ends(project):
    """The probe on toy data scores 100% whatever the lr, so metrics.json comes out identical and
    the report, which reads only that, stays up to date, in both front ends."""
    set_probe_lr(project, "tiny_random", 0.03)
    run(["snakemake", "--cores", "1", "evaluate__tiny_random"], project)
    assert evaluated_lr(project, "tiny_random") == 0.03
    assert planned_jobs(project) == set() and dvc_stale(project) == set()
    set_probe_lr(project, "tiny_random", 0.04)
    run(["dvc", "repro", "--single-item", "evaluate__tiny_random"], project)
    assert evaluated_lr(project, "tiny_random") == 0.04
    assert planned_jobs(project) == set() and dvc_stale(project) == set()


def test_invalid_params_stop_snakemake_before_any_job(project):
    path = project / "params" / "experiments" / "tiny_simclr.yaml"
    good = path.read_text()
    try:
        path.write_text(good.replace("temperature: 0.5", "temperature: -1"))
        proc = run(["snakemake", "-n", "--cores", "1"], project, check=False)
        assert proc.returncode != 0
        assert "tiny_simclr.yaml" in proc.stdout + proc.stderr
        assert "pretrain.temperature" in proc.stdout + proc.stderr
    finally:
        path.write_text(good)


def test_an_extending_experiment_follows_its_base_in_both_front_ends(project):
    """`extends`: a variant inherits its base's settings; editing an inherited one reruns the
    variant in Snakemake and DVC alike, and restoring it makes both see nothing to do."""
    (project / "params/experiments/tiny_random_k3.yaml").write_text(
        "extends: tiny_random\ntitle: Random init, 3-NN\nknn: {k: 3}\n")
    with open(project / "params" / "pipelines.yaml", "a") as f:
        f.write("  variants: [tiny_random_k3]\n")
    run(["python", "-m", "fedssl.pipeline", "write"], project)
    config = ["--config", "pipeline=variants"]
    run(["snakemake", "--cores", "2", "--resources", "gpu=1", *config], project)

    def stale() -> tuple[set[str], set[str]]:
        out = run(["snakemake", "-n", "--cores", "1", *config], project).stdout
        planned = {m.group(1) for m in re.finditer(r"^(\w+__\w+)\s+\d+$", out, re.M)}
        status = run(["dvc", "status", "--json", "pipelines/variants/dvc.yaml"], project).stdout
        return planned, {k.split(":")[-1] for k in json.loads(status or "{}")}

    assert stale() == (set(), set())
    base = project / "params/experiments/tiny_random.yaml"
    good = base.read_text()
    try:
        base.write_text(good.replace("batch_size: 256}", "batch_size: 128}"))
        planned, dvc = stale()
        assert planned == {"features__tiny_random_k3", "evaluate__tiny_random_k3",
                           "report__variants"}
        assert dvc == {"features__tiny_random_k3"}  # DVC reports the first stale stage
    finally:
        base.write_text(good)
    assert stale() == (set(), set())
