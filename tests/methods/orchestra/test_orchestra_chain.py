"""Orchestra through the stage runner on a tiny project: pretrain, the shared features and
evaluate stages on its global encoder, its costs, the report; and a killed pretrain resumes to
the uninterrupted run's outputs byte for byte (the client memories live in the checkpoint)."""

from __future__ import annotations

import json

import pytest

from tests.fixtures import (
    TINY_PROBES,
    assert_a_killed_stage_resumes,
    run_pretrain_step_chain,
    tiny_chain_project,
)

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.timeout(600)]

TINY_ORCHESTRA = (
    """\
title: Orchestra
partition: tiny_dir05_m3
method:
  name: orchestra
  model: {{arch: small_cnn, norm: bn, channels_per_group: 4, width: 4, proj_hidden: 16,
          proj_dim: 8}}
  rounds: {rounds}
  local_epochs: 1
  batch_size: 32
  lr: 0.01
  global_clusters: 6
  local_clusters: 4
  memory_size: 48
  seed: 0
"""
    + TINY_PROBES
)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return tiny_chain_project(
        tmp_path_factory.mktemp("orchestra"),
        {
            "tiny_orchestra": TINY_ORCHESTRA.format(rounds=1),
            "tiny_orchestra_long": TINY_ORCHESTRA.format(rounds=3),
        },
        "orch",
        ["tiny_orchestra", "tiny_simclr"],
    )


def test_orchestra_runs_end_to_end_through_the_stages(project, monkeypatch):
    rows = run_pretrain_step_chain(project, monkeypatch, "orch", "tiny_orchestra", "orchestra")
    assert rows["tiny_orchestra"]["round_MB_up"] > 0
    out = project / "artifacts" / "experiments" / "tiny_orchestra"
    comm = json.loads((out / "pretrain" / "communication.json").read_text())
    for client in comm["per_client"]:
        assert client["rounds"] == 2  # round 0 (clustering only) and the training round
        assert set(client["up_by_kind"]) == {"model", "centroids"}
        assert client["up_by_kind"]["centroids"] > client["down_by_kind"]["centroids"] > 0


def test_a_killed_orchestra_pretrain_resumes_to_the_uninterrupted_outputs(
    project, capsys, monkeypatch
):
    # round 0 clusters only: three training rounds are four
    assert_a_killed_stage_resumes(
        project, "pretrain", "tiny_orchestra_long", "round 1/4", capsys, monkeypatch
    )
