"""FeatARC through the stage runner on a tiny project: pretrain, the shared features and
evaluate stages on the cluster model serving the most data, its costs, the report; and a
killed pretrain resumes to the uninterrupted run's outputs byte for byte (assignments and the
clients' last models live in the checkpoint)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.fixtures import (
    TINY_PROBES,
    assert_a_killed_stage_resumes,
    run_pretrain_step_chain,
    tiny_chain_project,
)

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.timeout(600)]

TINY_FEATARC = (
    """\
title: FeatARC
partition: tiny_dir05_m3
method:
  name: featarc
  model: {{arch: small_cnn, norm: bn, channels_per_group: 4, width: 4, proj_hidden: 16,
          proj_dim: 16}}
  rounds: {rounds}
  local_epochs: 1
  batch_size: 32
  lr: 0.001
  clusters: 2
  seed: 0
"""
    + TINY_PROBES
)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return tiny_chain_project(
        tmp_path_factory.mktemp("featarc"),
        {
            "tiny_featarc": TINY_FEATARC.format(rounds=1),
            "tiny_featarc_long": TINY_FEATARC.format(rounds=3),
        },
        "feat",
        ["tiny_featarc", "tiny_simclr"],
    )


def test_featarc_runs_end_to_end_through_the_stages(project, monkeypatch):
    rows = run_pretrain_step_chain(project, monkeypatch, "feat", "tiny_featarc", "featarc")
    assert "tiny_featarc" in rows
    out = project / "artifacts" / "experiments" / "tiny_featarc" / "pretrain"
    clusters = torch.load(out / "clusters.pt", weights_only=True)
    assert set(clusters["clusters"]) == {"cluster0", "cluster1"}
    assert clusters["assignment"] == [0, 1, 0]  # round 0: client k starts from cluster k mod C
    comm = json.loads((out / "communication.json").read_text())
    assert all(c["bytes_down"] == 2 * c["bytes_up"] > 0 for c in comm["per_client"])


def test_a_killed_featarc_pretrain_resumes_to_the_uninterrupted_outputs(
    project, capsys, monkeypatch
):
    assert_a_killed_stage_resumes(
        project, "pretrain", "tiny_featarc_long", "round 1/3", capsys, monkeypatch
    )
