"""The federated BYOL family end to end on a tiny project, in process: each method's `pretrain`
step, the shared probes on its global encoder, its client costs and the report; then a killed
FedEMA `pretrain` resumes (its clients' targets, divergences and autoscalers included) to
byte-identical outputs."""

from __future__ import annotations

import csv
import json

import pytest

from tests.fixtures import (
    TINY_PROBES,
    assert_a_killed_stage_resumes,
    run_pretrain_step_chain,
    tiny_chain_project,
)

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.timeout(600)]

EXPERIMENT = (
    """\
title: {title}
partition: tiny_dir05_m3
method:
  name: {name}
  model: {{arch: small_cnn, norm: gn, channels_per_group: 4, width: 4,
          proj_hidden: 16, proj_dim: 8}}
  rounds: 3
  local_epochs: 1
  batch_size: 32
  lr: 0.05
  augment: {{crop_scale: [0.5, 1.0], jitter_p: 0.0, grayscale_p: 0.0}}
{extra}  seed: 0
"""
    + TINY_PROBES
)
METHODS = {
    "tiny_fedbyol": ("FedBYOL", "fedbyol", ""),
    "tiny_fedema": ("FedEMA", "fedema", "  tau: 0.7\n"),
    "tiny_fedu": ("FedU", "fedu", "  dapu_threshold: 0.4\n"),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    experiments = {
        name: EXPERIMENT.format(title=title, name=method, extra=extra)
        for name, (title, method, extra) in METHODS.items()
    }
    return tiny_chain_project(
        tmp_path_factory.mktemp("fedbyol"), experiments, "byol", list(METHODS)
    )


def test_the_family_runs_through_the_stage_runner(project, monkeypatch):
    rows = run_pretrain_step_chain(project, monkeypatch, "byol", "tiny_fedema", "fedbyol")
    assert {rows[n]["row"] for n in METHODS} == {"FedBYOL", "FedEMA", "FedU"}
    for name in METHODS:
        assert 0 <= rows[name]["linear_top1"] <= 100 and 0 <= rows[name]["knn_top1"] <= 100
        assert float(rows[name]["client_MB_sent"]) == pytest.approx(
            6 * rows[name]["round_MB_up"], rel=5e-3
        )  # 3 rounds, the online network and predictor each way
        assert float(rows[name]["beta_GFLOPs"]) > 0
        comm = json.loads(
            (project / f"artifacts/experiments/{name}/pretrain/communication.json").read_text()
        )
        assert all(set(c["up_by_kind"]) == {"encoder", "predictor"} for c in comm["per_client"])
    with open(project / "results/experiments/tiny_fedema/rounds.tsv") as f:
        log = list(csv.DictReader(f, delimiter="\t"))
    assert [r["decay"] for r in log][:2] == ["", "0.7"]  # the autoscaler's first decay is τ
    with open(project / "results/experiments/tiny_fedu/rounds.tsv") as f:
        assert "local_predictor" in next(csv.DictReader(f, delimiter="\t"))


def test_a_killed_fedema_pretrain_resumes_to_the_uninterrupted_outputs(
    project, capsys, monkeypatch
):
    assert_a_killed_stage_resumes(
        project, "pretrain", "tiny_fedema", "round 1/", capsys, monkeypatch
    )
