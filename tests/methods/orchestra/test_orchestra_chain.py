"""Orchestra's stages on a tiny project (BatchNorm CNN, as the smoke runs), in process: a
clustering-only round 0 before the training rounds, the global centroids unit rows, and the
costs counting the ledger's rounds. Also one of ``benchmarks/same_outputs.py``'s chains (a
refactor must leave its outputs the same)."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from tests.fixtures import TINY_PROBES, run_pretrain_step_chain, tiny_chain_project

pytestmark = pytest.mark.usefixtures("one_thread")
EXPERIMENT = """\
title: Orchestra
partition: tiny_dir05_m3
method:
  name: orchestra
  model: {arch: small_cnn, norm: bn, channels_per_group: 4, width: 4, proj_hidden: 16, proj_dim: 8}
  federation: {rounds: 2, local_epochs: 1, batch_size: 16, lr: 0.01}
  global_clusters: 6
  local_clusters: 4
  memory_size: 32
  seed: 0
""" + TINY_PROBES.replace("{{", "{").replace("}}", "}")


def test_the_orchestra_chain_runs_on_a_tiny_project(tmp_path, monkeypatch):
    root = tiny_chain_project(tmp_path, {"tiny_orchestra": EXPERIMENT}, "orch", ["tiny_orchestra"])
    rows = run_pretrain_step_chain(root, monkeypatch, "orch", "tiny_orchestra", "orchestra")
    assert rows["tiny_orchestra"]["row"] == "Orchestra"
    log = (root / "results/experiments/tiny_orchestra/rounds.tsv").open()
    losses = [float(r["loss"]) for r in csv.DictReader(log, delimiter="\t")]
    assert len(losses) == 3 and losses[0] == 0.0 and all(v > 0 for v in losses[1:])
    art = root / "artifacts/experiments/tiny_orchestra"
    model = torch.load(art / "pretrain/model.pt", weights_only=True)["model"]
    assert torch.allclose(model["centroids"].norm(dim=1), torch.ones(6), atol=1e-5)
    costs = json.loads((art / "costs/costs.json").read_text())["per_client"]
    assert [c["rounds"] for c in costs] == [3, 3, 3]
