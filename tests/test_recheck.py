"""`python -m fedssl.plan.recheck`: a sample of a pipeline's stages rerun through Snakemake,
their committed result files compared with git's HEAD (the real reruns are slow: a tiny
pipeline runs twice)."""

from __future__ import annotations

import json

import pytest

from tests.fixtures import REPO, make_tiny_project, run

pytestmark = pytest.mark.timeout(900)


def test_a_dry_run_says_what_it_would_rerun_and_claims_nothing(monkeypatch, capsys):
    from fedssl.plan.recheck import main

    monkeypatch.chdir(REPO)
    assert main(["-n", "default"]) == 0
    out = capsys.readouterr().out
    assert "default: would rerun fmnist_fedsimclr (pretrain__fmnist_fedsimclr," in out
    assert "would compare  results/experiments/fmnist_fedsimclr/metrics.json" in out
    assert "reproduced" not in out and "same" not in out
    assert out.endswith("nothing ran, nothing compared (2 committed files would be)\n")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = make_tiny_project(tmp_path_factory.mktemp("recheck"))
    run(["snakemake", "--cores", "2", "--resources", "gpu=1"], root)
    run(["git", "add", "-A"], root)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "results"], root)
    return root


def recheck(project):
    return run(
        [
            "python",
            "-m",
            "fedssl.plan.recheck",
            "default",
            "--experiment",
            "tiny_simclr",
            "--cores",
            "2",
        ],
        project,
        check=False,
    )


@pytest.mark.slow
def test_committed_results_that_the_code_produces_pass(project):
    proc = recheck(project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "same  results/experiments/tiny_simclr/metrics.json" in proc.stdout
    assert "same  results/experiments/tiny_simclr/rounds.tsv" in proc.stdout


@pytest.mark.slow
def test_a_committed_number_the_code_no_longer_produces_is_named(project):
    metrics = project / "results/experiments/tiny_simclr/metrics.json"
    true = json.loads(metrics.read_text())
    metrics.write_text(json.dumps({**true, "linear_top1": true["linear_top1"] + 1.0}))
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "stale"], project)
    proc = recheck(project)
    assert proc.returncode == 1
    assert "differs  results/experiments/tiny_simclr/metrics.json" in proc.stdout
    assert json.loads(metrics.read_text()) == true  # the rerun wrote what the code gives
