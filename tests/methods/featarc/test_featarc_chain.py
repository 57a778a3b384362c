"""FeatARC's stages on a tiny project (BatchNorm CNN, C = 2, the projection aligned as in the
smoke runs), in process: the probes read the cluster model serving the most data, and
``clusters.pt`` keeps every cluster model with the assignment the round log counts. Also one of
``benchmarks/same_outputs.py``'s chains (a refactor must leave its outputs the same)."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from tests.fixtures import TINY_PROBES, run_pretrain_step_chain, tiny_chain_project

pytestmark = pytest.mark.usefixtures("one_thread")
EXPERIMENT = """\
title: FeatARC
partition: tiny_dir05_m3
method:
  name: featarc
  model: {arch: small_cnn, norm: bn, channels_per_group: 4, width: 4, proj_hidden: 16, proj_dim: 16}
  federation: {rounds: 2, local_epochs: 1, batch_size: 32, lr: 0.001}
  clusters: 2
  augment: {crop_scale: [0.5, 1.0], jitter_p: 0.0, grayscale_p: 0.0}
  seed: 0
""" + TINY_PROBES.replace("{{", "{").replace("}}", "}")


def test_the_featarc_chain_runs_on_a_tiny_project(tmp_path, monkeypatch):
    root = tiny_chain_project(tmp_path, {"tiny_featarc": EXPERIMENT}, "arc", ["tiny_featarc"])
    rows = run_pretrain_step_chain(root, monkeypatch, "arc", "tiny_featarc", "featarc")
    assert rows["tiny_featarc"]["row"] == "FeatARC"
    out = root / "artifacts/experiments/tiny_featarc/pretrain"
    saved = torch.load(out / "clusters.pt", weights_only=True)
    clusters, assignment = saved["clusters"], saved["assignment"]
    assert sorted(clusters) == ["cluster0", "cluster1"] and len(assignment) == 3
    log = (root / "results/experiments/tiny_featarc/rounds.tsv").open()
    last = list(csv.DictReader(log, delimiter="\t"))[-1]
    assert last["clients_per_cluster"] == f"{assignment.count(0)}/{assignment.count(1)}"
    # the probes read the cluster model serving the most training samples
    served = json.loads((out / "meta.json").read_text())["served"]
    best = f"cluster{served.index(max(served))}"
    model = torch.load(out / "model.pt", weights_only=True)["model"]
    assert model.keys() == {k[len("net.") :] for k in clusters[best]}
    assert all(torch.equal(model[k[len("net.") :]], v) for k, v in clusters[best].items())
