"""Opt-in (`make test-slurm`, which installs Debian's slurm-wlm and the Snakemake SLURM
executor plugin): the default pipeline of a tiny project runs through a real one-node SLURM
cluster on localhost (slurmctld + slurmd, tests/slurm/local_cluster.sh), every stage a SLURM
job, and ends with the same results as a local run."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from tests.fixtures import REPO, make_tiny_project, opt_in, run

pytestmark = opt_in(
    "slurm", "FEDSSL_SLURM_TEST", "make test-slurm (needs root, slurm-wlm, the plugin)", 1800
)


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
    snakemake = subprocess.Popen(
        ["snakemake", "--workflow-profile", "slurm_profile"],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    refused = dvc_while_held(root)
    out = snakemake.communicate()[0]
    assert snakemake.returncode == 0, out[-3000:]
    # the SLURM run held the project's run lock: a DVC run meanwhile was refused in one line
    assert refused.returncode != 0, refused.stdout[-2000:]
    assert "not run: a snakemake run is in progress" in refused.stderr
    submitted = out.count("has been submitted with SLURM jobid")
    assert submitted == 13, out[-3000:]  # every stage of the tiny default pipeline
    metrics = json.loads((root / "results/experiments/tiny_pixels/metrics.json").read_text())
    assert metrics["linear_top1"] == 100.0
    assert "Nothing to be done" in run(["snakemake", "-n"], root).stdout
    assert json.loads(run(["dvc", "status", "--json"], root).stdout or "{}") == {}
    lock = json.loads((root / "artifacts/.locks/run.lock").read_text() or "null")
    assert lock is None  # the finished run let go of it


def dvc_while_held(root, timeout: float = 600.0) -> subprocess.CompletedProcess:
    """Once the Snakemake run holds the run lock, a `dvc repro` of the first stage."""
    lock = root / "artifacts/.locks/run.lock"
    deadline = time.monotonic() + timeout
    while not (lock.exists() and lock.read_text().strip()):
        assert time.monotonic() < deadline, "the SLURM run never took the run lock"
        time.sleep(0.5)
    return run(
        ["dvc", "repro", "--force", "--single-item", "prepare_data__tiny"], root, check=False
    )
