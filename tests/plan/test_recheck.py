"""`python -m fedssl.plan.recheck`: a sample of a pipeline's stages rerun through Snakemake,
their committed result files compared with git's HEAD (the real reruns are slow: a tiny
pipeline runs twice)."""

from __future__ import annotations

import json

import pytest

from tests.fixtures import REPO, made_tiny_project, run

pytestmark = pytest.mark.timeout(900)


def test_a_dry_run_says_what_it_would_rerun_and_claims_nothing(monkeypatch, capsys):
    from fedssl.plan.recheck import main

    monkeypatch.chdir(REPO)
    assert main(["-n", "default"]) == 0
    out = capsys.readouterr().out
    assert "default: would rerun fmnist_fedsimclr (pretrain__fmnist_fedsimclr," in out
    assert "would compare  results/experiments/fmnist_fedsimclr/metrics.json" in out
    assert "reproduced" not in out and "same" not in out
    # its round log, its probe's metrics, its probe's curve and its per-image predictions
    assert "would compare  results/experiments/fmnist_fedsimclr/linear_epochs.tsv" in out
    assert "would compare  results/experiments/fmnist_fedsimclr/predictions.npz" in out
    assert out.endswith("nothing ran, nothing compared (4 committed files would be)\n")


def test_stages_two_pipelines_share_run_once(monkeypatch, capsys):
    """mfcl_smoke and tn_question sample the same experiment's stages: the second pipeline
    compares the files the first one's rerun left instead of running them again."""
    from fedssl.plan.recheck import main

    monkeypatch.chdir(REPO)
    assert main(["-n", "mfcl_smoke", "tn_question"]) == 0
    out = capsys.readouterr().out
    assert "mfcl_smoke: would rerun smoke_mfcl_tn_dir001 (pretrain__smoke_mfcl," in out
    assert "tn_question: tnq_twin_s0's stages were rerun above (mfcl_smoke); compared again" in out
    assert out.count("would compare  results/experiments/smoke_mfcl/metrics.json") == 1


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = made_tiny_project(tmp_path_factory.mktemp("recheck"))
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
    assert "identical  results/experiments/tiny_simclr/metrics.json" in proc.stdout
    assert "identical  results/experiments/tiny_simclr/rounds.tsv" in proc.stdout


@pytest.mark.slow
def test_a_committed_number_the_code_no_longer_produces_is_named(project):
    metrics = project / "results/experiments/tiny_simclr/metrics.json"
    true = json.loads(metrics.read_text())
    metrics.write_text(json.dumps({**true, "linear_top1": true["linear_top1"] + 1.0}))
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "stale"], project)
    proc = recheck(project)
    assert proc.returncode == 1
    assert "differs beyond the spread  results/experiments/tiny_simclr/metrics.json" in proc.stdout
    assert "linear_top1:" in proc.stdout  # the metric past its tolerance, named
    assert json.loads(metrics.read_text()) == true  # the rerun wrote what the code gives


def test_a_metric_within_its_spread_is_told_apart_from_one_beyond(tmp_path, monkeypatch):
    """Tolerances come from the committed results: the median SD over an experiment's seeds
    (x 2 sqrt 2) and the largest fp32 -> bf16 twin gap; a change inside them is 'within the
    spread', one past them names the metric."""
    from fedssl.plan import recheck as rc

    runs = {
        "exp_s0": {"linear_top1": 70.0, "knn_top1": 71.0},
        "exp_s1": {"linear_top1": 71.0, "knn_top1": 71.0},
        "twin": {"linear_top1": 70.0, "knn_top1": 70.0},
        "twin_bf16": {"linear_top1": 70.5, "knn_top1": 70.25},
    }
    for name, metrics in runs.items():
        (tmp_path / "experiments" / name).mkdir(parents=True)
        (tmp_path / "experiments" / name / "metrics.json").write_text(json.dumps(metrics))
    monkeypatch.setattr(rc, "RESULTS", tmp_path)
    monkeypatch.setattr(rc, "method_of", lambda name: "m")
    rc.spread.cache_clear()
    try:
        # SD of (70, 71) = 0.707 -> 2 sqrt 2 x 0.707 = 2.0; the twins' gaps 0.5 and 0.25
        assert rc.tolerance("exp_s0", "linear_top1") == pytest.approx(2.0)
        assert rc.tolerance("exp_s0", "knn_top1") == pytest.approx(0.25)
        old = {"linear_top1": 70.0, "knn_top1": 71.0}
        inside = {"linear_top1": 71.9, "knn_top1": 70.8}
        assert rc.judge_metrics("exp_s0", old, inside) == ("within the spread", [])
        verdict, beyond = rc.judge_metrics("exp_s0", old, {**inside, "knn_top1": 70.5})
        assert verdict == "differs beyond the spread"
        assert beyond == ["knn_top1: 71 -> 70.5 (tolerance 0.25)"]
    finally:
        rc.spread.cache_clear()


def test_a_metric_added_since_is_an_addition_and_a_metric_gone_is_named():
    """A rerun that gives every committed metric again and one more (a metric the code gained
    later) is 'same numbers'; one that no longer gives a committed metric differs."""
    from fedssl.plan.recheck import judge_metrics

    old = {"personal_top1": 41.5, "partition": "shards2"}
    assert judge_metrics("x", old, {**old, "rounds_to_target": 21}) == (
        "same numbers",
        ["adds rounds_to_target"],
    )
    verdict, named = judge_metrics("x", {**old, "knn_top1": 3.0}, old)
    assert verdict == "differs beyond the spread" and named == ["knn_top1: 3 -> absent"]


def test_a_log_is_judged_by_the_values_it_committed():
    """Old round logs kept timing columns the engine now leaves out, and logs gain columns: the
    committed values are what must come out again, each to its last digit."""
    from fedssl.plan.recheck import judge_table

    old = "round\tloss\tseconds\n1\t0.50\t3.1\n2\t0.25\t3.0\n"
    new = "round\tloss\talive_base\n1\t0.50\t8\n2\t0.25\t7\n"
    assert judge_table(old, new) == ("same numbers", ["adds column alive_base"])
    moved = new.replace("0.25", "0.2500001")
    assert judge_table(old, moved) == ("differs", ["row 2: loss 0.25 -> 0.2500001"])
    assert judge_table(old, "round\tseconds\n1\t3\n2\t3\n")[0] == "differs"  # loss gone
    assert judge_table(old, new.rsplit("2\t", 1)[0]) == ("differs", ["2 rows -> 1"])
