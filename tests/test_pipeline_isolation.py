"""Running one pipeline never disturbs another's DVC state: a Snakemake run that fails before
any of its stages finished leaves no pipeline file and no record behind."""

from __future__ import annotations

import subprocess

from tests.fixtures import make_tiny_project
from tests.test_frontends import offline_env


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
