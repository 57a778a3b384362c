"""Running one pipeline never disturbs another's DVC state: a Snakemake run that fails before
any of its stages finished leaves no pipeline file and no record behind."""

from __future__ import annotations

import subprocess

from tests.fixtures import make_tiny_project
from tests.plan.test_frontends import offline_env


def test_a_pipeline_that_failed_before_any_stage_leaves_dvc_as_it_was(tmp_path):
    project = make_tiny_project(tmp_path)
    with open(project / "params/pipelines.yaml", "a") as f:
        f.write("  solo: [tiny_random]\n")
    dataset = project / "params/datasets/tiny.yaml"
    dataset.write_text("name: fashion_mnist\ndata_root: nowhere\ndownload: true\n")
    before = sorted(p.relative_to(project) for p in project.glob("**/dvc.*"))
    proc = subprocess.run(
        ["snakemake", "--cores", "1", "--config", "pipeline=solo"],
        cwd=project,
        env=offline_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "could not be downloaded" in proc.stdout + proc.stderr
    assert not (project / "pipelines/solo").exists()
    assert sorted(p.relative_to(project) for p in project.glob("**/dvc.*")) == before


def test_data_another_pipeline_lacks_never_blocks_the_default_one(tmp_path):
    """The DVC `dag` check: a data set missing for another pipeline is a warning naming it;
    one the default pipeline needs still stops it."""
    from tests.fixtures import run, tiny_experiment

    project = make_tiny_project(tmp_path, git=False)
    params = project / "params"
    (params / "datasets/gone.yaml").write_text(
        "name: fashion_mnist\ndata_root: nowhere\ndownload: false\n"
    )
    partition = (params / "partitions/tiny_dir05_m3.yaml").read_text()
    (params / "partitions/gone_m3.yaml").write_text(partition.replace("tiny", "gone"))
    (params / "experiments/gone_random.yaml").write_text(
        tiny_experiment("Random init", "small_cnn", "none").replace("tiny_dir05_m3", "gone_m3")
    )
    with open(params / "pipelines.yaml", "a") as f:
        f.write("  elsewhere: [gone_random]\n")
    run(["python", "-m", "fedssl.pipeline", "write", "elsewhere"], project)

    proc = run(["python", "-m", "fedssl.pipeline", "check"], project)
    assert "warning: pipeline elsewhere: params/datasets/gone.yaml: data set not available" in (
        proc.stderr
    )
    (params / "datasets/tiny.yaml").write_text(
        "name: fashion_mnist\ndata_root: nowhere\ndownload: false\n"
    )
    proc = run(["python", "-m", "fedssl.pipeline", "check"], project, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("params/datasets/tiny.yaml: data set not available")


def test_a_pipeline_run_later_never_takes_another_pipelines_stages(tmp_path, monkeypatch):
    """A stage two pipelines share stays in the dvc.yaml of the one that ran first, with its
    dvc.lock record, even when the later one sorts first: nothing DVC knew becomes stale."""
    from fedssl.plan.dvcfile import write_all

    project = make_tiny_project(tmp_path, git=False)
    (project / "params/experiments/tiny_random_w8.yaml").write_text(
        "extends: tiny_random\ntitle: Random init, width 8\nmethod: {model: {width: 8}}\n"
    )
    with open(project / "params/pipelines.yaml", "a") as f:
        f.write("  early: [tiny_random_w8]\n  late: [tiny_random_w8]\n")
    monkeypatch.chdir(project)
    write_all(also=("late",))  # `late` ran first
    late = (project / "pipelines/late/dvc.yaml").read_text()
    assert "\n  features__tiny_random_w8:\n" in late
    write_all(also=("early",))
    assert (project / "pipelines/late/dvc.yaml").read_text() == late
    early = (project / "pipelines/early/dvc.yaml").read_text()
    assert "features__tiny_random_w8:" not in early and "\n  report__early:\n" in early
