"""A method is a plugin: one module dropped into fedssl/methods/ (here tests/toy_method.py),
one params entry and a pipeline line, and both front ends run it; the engine and shared
stages take it from the registry without any other file knowing about it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import REPO, make_tiny_project, run

pytestmark = pytest.mark.timeout(900)

TOY_EXPERIMENT = """\
title: Toy autoencoder
partition: tiny_dir05_m3
method: {name: toy, dim: 6, rounds: 2, lr: 0.01, seed: 0}
features: {layer: backbone, train_size: null, batch_size: 256}
linear_probe: {epochs: 5, lr: 0.01, weight_decay: 0.0, batch_size: 64, standardize: true, seed: 0}
knn: {k: 5, temperature: 0.1}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = make_tiny_project(tmp_path_factory.mktemp("plugin"))
    before = {p.relative_to(root): p.read_bytes() for p in (root / "fedssl").rglob("*.py")}
    shutil.copy(REPO / "tests" / "toy_method.py", root / "fedssl" / "methods" / "toy.py")
    (root / "params" / "experiments" / "tiny_toy.yaml").write_text(TOY_EXPERIMENT)
    with open(root / "params" / "pipelines.yaml", "a") as f:
        f.write("  toy: [tiny_toy, tiny_pixels]\n")
    after = {p.relative_to(root): p.read_bytes() for p in (root / "fedssl").rglob("*.py")}
    changed = {p for p in after if before.get(p) != after[p]}
    assert changed == {Path("fedssl/methods/toy.py")}  # the only library file touched
    run(["python", "-m", "fedssl.pipeline", "write"], root)
    return root


def test_the_toy_method_runs_through_snakemake(project):
    run(["snakemake", "--cores", "2", "--resources", "gpu=1", "--config", "pipeline=toy"], project)
    rows = (project / "results/reports/toy/report.csv").read_text().splitlines()
    toy = dict(
        zip(rows[0].split(","), next(r.split(",") for r in rows if r.startswith("tiny_toy")))
    )
    assert toy["row"] == "Toy AE" and toy["arch"] == "linear-6" and toy["rounds"] == "2"
    assert toy["parameters"] == str(784 * 6 + 6 + 6 * 784 + 784)
    log = (project / "results/experiments/tiny_toy/rounds.tsv").read_text().splitlines()
    losses = [float(line.split("\t")[2]) for line in log[1:]]
    assert len(losses) == 2 and losses[1] < losses[0]
    feats = json.loads((project / "artifacts/experiments/tiny_toy/features/meta.json").read_text())
    assert feats["dim"] == 6
    status = run(["dvc", "status", "--json", "pipelines/toy/dvc.yaml"], project).stdout
    assert set(json.loads(status or "{}")) <= {"dag"}  # DVC sees what Snakemake ran as done


EXPORT_AND_LOAD = """
import torch
from fedssl.export import export, load_encoder
from fedssl.stage.context import StageContext

out = export("tiny_toy")
ctx = StageContext("features", "tiny_toy")
ctx.device = torch.device("cpu")
x = torch.rand(4, 1, 28, 28)
assert torch.equal(load_encoder(out)(x), ctx.method.encoder(ctx)(x))
assert torch.equal(torch.export.load(out / "encoder.pt2").module()(x), load_encoder(out)(x))
"""


def test_the_toy_methods_encoder_exports_and_loads_back(project):
    """The how-to's method declares its `encoder_builder`, so `fedssl export` takes it away
    (without one the export is refused), with no warning printed."""
    card = run([sys.executable, "-m", "fedssl.cli", "export", "tiny_toy"], project)
    assert card.stderr == ""
    info = json.loads((project / "artifacts/exports/tiny_toy/encoder.json").read_text())
    assert info["builder"]["function"] == "fedssl.methods.toy:untrained_encoder"
    assert info["architecture"]["feature_dim"] == 6
    run([sys.executable, "-c", EXPORT_AND_LOAD], project)


def test_the_toy_method_reruns_through_dvc_after_a_param_edit(project):
    path = project / "params/experiments/tiny_toy.yaml"
    path.write_text(path.read_text().replace("dim: 6", "dim: 5"))
    status = json.loads(run(["dvc", "status", "--json", "pipelines/toy/dvc.yaml"], project).stdout)
    assert set(status) - {"dag"} == {
        f"pipelines/toy/dvc.yaml:{s}"
        for s in ("fit__tiny_toy", "features__tiny_toy", "report__toy")
    }  # each reads `method`
    run(["dvc", "repro", "pipelines/toy/dvc.yaml"], project)
    feats = json.loads((project / "artifacts/experiments/tiny_toy/features/meta.json").read_text())
    assert feats["dim"] == 5
    out = run(["snakemake", "-n", "--cores", "1", "--config", "pipeline=toy"], project).stdout
    assert "Nothing to be done" in out


def test_a_bad_toy_param_is_named_with_its_method(project):
    path = project / "params/experiments/tiny_toy.yaml"
    good = path.read_text()
    try:
        path.write_text(good.replace("dim: 5", "dim: -1").replace("dim: 6", "dim: -1"))
        proc = subprocess.run(
            ["snakemake", "-n", "--cores", "1", "--config", "pipeline=toy"],
            cwd=project,
            capture_output=True,
            text=True,
        )
        assert proc.returncode != 0 and "method.toy.dim" in proc.stdout + proc.stderr
    finally:
        path.write_text(good)
