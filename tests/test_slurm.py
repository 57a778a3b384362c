"""Opt-in (`make test-slurm`, which installs Debian's slurm-wlm and the Snakemake SLURM
executor plugin): the default pipeline of a tiny project runs through a real one-node SLURM
cluster on localhost (slurmctld + slurmd, tests/slurm/local_cluster.sh), every stage a SLURM
job, and ends with the same results as a local run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.fixtures import REPO, make_tiny_project, run

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        os.environ.get("FEDSSL_SLURM_TEST") != "1",
        reason="opt-in: make test-slurm (needs root, slurm-wlm, the plugin)",
    ),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("slurm")
    script = REPO / "tests" / "slurm" / "local_cluster.sh"
    subprocess.run([script, "start", state], check=True)
    yield state
    subprocess.run([script, "stop", state], check=False)


def test_the_default_pipeline_runs_as_slurm_jobs(cluster, tmp_path):
    root = make_tiny_project(tmp_path / "project")
    shutil.copytree(REPO / "tests" / "slurm" / "profile", root / "slurm_profile")
    proc = run(["snakemake", "--workflow-profile", "slurm_profile"], root)
    out = proc.stdout + proc.stderr
    submitted = out.count("has been submitted with SLURM jobid")
    assert submitted == 13, out[-3000:]  # every stage of the tiny default pipeline
    metrics = json.loads((root / "results/experiments/tiny_pixels/metrics.json").read_text())
    assert metrics["linear_top1"] == 100.0
    assert "Nothing to be done" in run(["snakemake", "-n"], root).stdout
    assert json.loads(run(["dvc", "status", "--json"], root).stdout or "{}") == {}
