"""MFCL Tab. 2's supervised rows on a tiny project, in process: the ``train`` step of FedAvg,
MOON and FSL (global accuracy, model, traffic), the shared probes on the global encoder, the
costs stage and the report with the global-accuracy pivot beside the probe columns; then
Snakemake plans the same DAG and finds nothing to do."""

from __future__ import annotations

import json

import pytest
import torch

from tests.fixtures import TINY_PROBES, make_tiny_project, run
from tests.methods.mpfedcon.test_mpfedcon_chain import run_in_process

EXPERIMENT = (
    """\
title: {variant}
partition: tiny_dir05_m3
method:
  name: supervised
  variant: {variant}
  model: {{arch: small_cnn, norm: bn, channels_per_group: 4, width: 4, proj_hidden: 16,
          proj_dim: 8}}
  rounds: 2
  local_epochs: 1
  batch_size: 32
  lr: 0.05
  mu: {mu}
  augment: crop_flip
  seed: 0
"""
    + TINY_PROBES
)

FSL = """\
title: FSL
partition: tiny_dir05_m3
method:
  name: fsl
  model: {arch: small_cnn, norm: bn, channels_per_group: 4, width: 4}
  cut: 2
  rounds: 2
  batch_size: 32
  lr: 0.05
  seed: 0
features: {layer: backbone, train_size: null, batch_size: 256}
linear_probe: {epochs: 5, lr: 0.01, weight_decay: 0.0, batch_size: 64, standardize: true, seed: 0}
knn: {k: 5, temperature: 0.1}
"""

pytestmark = pytest.mark.usefixtures("one_thread")


def test_supervised_chain_runs_end_to_end_on_a_tiny_project(tmp_path, monkeypatch):
    from fedssl.plan.dag import Dag

    root = make_tiny_project(tmp_path, git=False)
    params = root / "params"
    names = {"tiny_fedavg": ("fedavg", 0.0), "tiny_moon": ("moon", 1.0)}
    for name, (variant, mu) in names.items():
        (params / "experiments" / f"{name}.yaml").write_text(
            EXPERIMENT.format(variant=variant, mu=mu)
        )
    (params / "experiments" / "tiny_fsl.yaml").write_text(FSL)
    with open(params / "pipelines.yaml", "a") as f:
        f.write(f"  sup: [{', '.join(names)}, tiny_fsl]\n")
    monkeypatch.chdir(root)
    monkeypatch.setenv("FEDSSL_DEVICE", "cpu")
    dag = Dag("sup")
    kinds = [s.kind for s in dag.stages.values() if s.name.endswith("__tiny_moon")]
    assert kinds == ["train", "features", "evaluate", "costs"]
    assert dag.stages["train__tiny_moon"].metrics == ["results/experiments/tiny_moon/global.json"]
    assert "fedssl/methods/supervised/costs.py" not in dag.stages["train__tiny_moon"].code
    run_in_process(dag)

    results, exp = root / "results" / "experiments", root / "artifacts" / "experiments"
    top1 = json.loads((results / "tiny_moon" / "global.json").read_text())["global_top1"]
    log = (results / "tiny_moon" / "rounds.tsv").read_text().splitlines()
    assert log[0].split("\t")[-1] == "global_top1" and len(log) == 3
    assert float(log[-1].split("\t")[-1]) == top1  # the final round's entry
    saved = torch.load(exp / "tiny_moon" / "train" / "model.pt", weights_only=True)
    assert saved["classes"] == 4 and "output.weight" in saved["model"]
    comm = json.loads((exp / "tiny_moon" / "train" / "communication.json").read_text())
    sizes = sum(v.numel() * v.element_size() for v in saved["model"].values())
    assert all(c["bytes_up"] == c["bytes_down"] == 2 * sizes for c in comm["per_client"])

    report = json.loads((root / "results/reports/sup/report.json").read_text())
    rows = {r["experiment"]: r for r in report["rows"]}
    assert rows["tiny_moon"]["row"] == "MOON (μ=1)" and rows["tiny_fedavg"]["row"] == "FedAvg"
    assert rows["tiny_fsl"]["row"] == "FSL" and rows["tiny_fsl"]["arch"] == "small_cnn/cut2"
    fsl = json.loads((exp / "tiny_fsl" / "train" / "communication.json").read_text())
    assert all(c["up_by_kind"]["smashed_data"] > 0 for c in fsl["per_client"])
    assert (results / "tiny_fsl" / "global.json").exists()
    for r in rows.values():
        assert {"global_top1", "linear_top1", "knn_top1"} <= set(r)
        assert all(float(r[c]) > 0 for c in ("client_MB_sent", "beta_GFLOPs", "peak_step_MB"))
    assert "global" in report["tables"]
    out = run(["snakemake", "-n", "--cores", "1", "--config", "pipeline=sup"], root).stdout
    assert "Nothing to be done" in out
