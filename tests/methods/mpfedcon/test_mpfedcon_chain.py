"""MpFedcon's stages on a tiny project, in process: partition with per-party test splits, the
``train`` step of three variants, the shared ``personal`` stage, the leakage ``attack`` step
(metrics, MSE curves, picture) and the report with the paper-layout tables; then Snakemake plans
the same DAG and finds nothing to do."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from tests.fixtures import make_tiny_project, run

PARTITION = """\
dataset: tiny
num_clients: 3
seed: 0
scheme: {kind: shards, classes_per_client: 2}
client_tests: {per_client: 12}
"""

EXPERIMENT = """\
title: {variant}
partition: tiny_shards
method:
  name: mpfedcon
  variant: {variant}
  net: {{base: cnn, conv_channels: [4, 8], kernel_size: 5, hidden: [16], projection: [16, 8]}}
  federation: {{rounds: 3, client_fraction: 1.0, batch_size: 16, lr: 0.1}}
  head_epochs: 1
  body_epochs: 1
  mu: 1.0
  finetune_epochs: 2
  augment: crop_flip
  seed: {seed}
personal: {{last_rounds: 2, checkpoints: [0.5, 1.0], target: 40}}
"""

LEAKAGE = """\
title: leakage
partition: tiny_shards
method:
  name: gradient_leakage
  fc_hidden: [12]
  label_images: 6
  recon_images: 1
  recon_label_images: 2
  iterations: 4
  lbfgs_max_iter: 4
  dlg_label_iterations: 2
  settings:
    - {label: full, hidden_fc: 0}
    - {label: cl1_at1, hidden_fc: 1, assumed_fc: 1}
    - {label: g1e_2, noise: {kind: gaussian, variance: 1.0e-2}}
"""


def run_in_process(dag) -> None:
    import importlib

    for stage in dag.stages.values():
        _, _, module, *args = stage.cmd.split()
        importlib.import_module(module).run(args)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_mpfedcon_chain_runs_end_to_end_on_a_tiny_project(tmp_path, monkeypatch):
    from fedssl.plan.dag import Dag

    root = make_tiny_project(tmp_path, git=False)
    params = root / "params"
    (params / "partitions" / "tiny_shards.yaml").write_text(PARTITION)
    names = []
    for variant, seed in (("fedrep", 0), ("mpfedcon", 0), ("mpfedcon", 1), ("fedavg_ft", 0)):
        name = f"tiny_{variant}_{seed}"
        (params / "experiments" / f"{name}.yaml").write_text(
            EXPERIMENT.format(variant=variant, seed=seed)
        )
        names.append(name)
    (params / "experiments" / "tiny_leakage.yaml").write_text(LEAKAGE)
    with open(params / "pipelines.yaml", "a") as f:
        f.write(f"  mpf: [{', '.join(names)}, tiny_leakage]\n")
    monkeypatch.chdir(root)
    monkeypatch.setenv("FEDSSL_DEVICE", "cpu")
    dag = Dag("mpf")
    assert [s.kind for s in dag.stages.values() if s.name.endswith("tiny_mpfedcon_0")] == [
        "train",
        "personal",
        "costs",
    ]
    assert dag.stages["attack__tiny_leakage"].metrics == [
        "results/experiments/tiny_leakage/metrics.json"
    ]
    assert "fedssl/methods/mpfedcon/tables.py" not in dag.stages["train__tiny_mpfedcon_0"].code
    assert "fedssl/methods/mpfedcon/tables.py" in dag.stages["report__mpf"].code
    run_in_process(dag)

    exp = root / "artifacts" / "experiments"
    with np.load(exp / "tiny_mpfedcon_0" / "train" / "personal.npz") as z:
        assert z["accuracy"].shape == (3, 3) and z["choice"].shape == (0, 0)
        assert len(z["labels"]) == 3 * 12 == len(z["probs"])
    comm = json.loads((exp / "tiny_mpfedcon_0" / "train" / "communication.json").read_text())
    assert all(set(c["up_by_kind"]) == {"model", "centres"} for c in comm["per_client"])
    models = torch.load(exp / "tiny_mpfedcon_0" / "train" / "models.pt", weights_only=True)
    assert set(models["clients"]) == {0, 1, 2}
    assert all(
        k.startswith("net.projector.") or k.startswith("net.output.") for k in models["clients"][0]
    )
    metrics = json.loads((root / "results/experiments/tiny_fedrep_0/metrics.json").read_text())
    assert {"personal_last2", "personal_last2_at_2", "rounds_to_target"} <= set(metrics)

    report = json.loads((root / "results/reports/mpf/report.json").read_text())
    tables = report["tables"]
    assert {"mpfedcon_tab1", "mpfedcon_tab2", "mpfedcon_tab3", "leakage_tiny_leakage"} <= set(
        tables
    )
    tab1 = tables["mpfedcon_tab1"]
    # rows in the paper's order; MpFedcon's two seeds share one cell (mean ± std)
    assert tab1.index("| FedAvg+FT") < tab1.index("| FedRep") < tab1.index("| MpFedcon (μ=1)")
    assert "±" in tab1.split("| MpFedcon (μ=1)")[1].split("\n")[0]
    rows = {r["experiment"]: r for r in report["rows"]}
    assert rows["tiny_fedrep_0"]["round_MB_up"] > 0
    assert "round_MB_up_centres" not in rows["tiny_fedrep_0"]
    assert rows["tiny_mpfedcon_0"]["round_MB_up_centres"] > 0
    # client FLOPs from the costs stage: MpFedcon's body step also runs the anchor
    gflops = {k: float(rows[f"tiny_{k}_0"]["client_GFLOPs"]) for k in ("fedrep", "mpfedcon")}
    assert 0 < gflops["fedrep"] < gflops["mpfedcon"]
    leak = json.loads((root / "results/experiments/tiny_leakage/metrics.json").read_text())
    assert leak["idlg_label_hit_full"] == 1.0  # the label rule never misses on full gradients
    assert leak["idlg_label_blind_full"] is False
    assert "cl=1" in leak["about_cl1_at1"]
    assert (root / "results/experiments/tiny_leakage/reconstructions.png").stat().st_size > 1000
    with open(root / "results/experiments/tiny_leakage/mse_curves.tsv") as f:
        curves = list(csv.DictReader(f, delimiter="\t"))
    assert len(curves) == 4 and "idlg_full" in curves[0] and "dlg_g1e_2" in curves[0]
    # Snakemake plans the same DAG and sees it all done
    out = run(["snakemake", "-n", "--cores", "1", "--config", "pipeline=mpf"], root).stdout
    assert "Nothing to be done" in out
