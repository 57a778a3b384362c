"""Params validation, generated files kept in sync, and the DAG's shape."""
from __future__ import annotations

from pathlib import Path

import pytest

from fedssl import params as P
from fedssl.pipeline import Dag, dvc_file, dvc_yaml, pipeline_order
from tests.fixtures import REPO, make_tiny_project, run


def test_json_schemas_are_up_to_date():
    for name, text in P.json_schemas().items():
        path = REPO / "schemas" / name
        assert path.exists() and path.read_text() == text, \
            f"{path} is stale: run `make generate`"


def test_dvc_files_are_generated_from_the_dag(monkeypatch):
    monkeypatch.chdir(REPO)
    for pipe in pipeline_order():
        assert (REPO / dvc_file(pipe)).read_text() == dvc_yaml(pipe), \
            f"{dvc_file(pipe)} is stale: run `make generate`"


def test_every_shipped_params_file_is_valid(monkeypatch):
    monkeypatch.chdir(REPO)
    for pipe in pipeline_order():
        dag = Dag(pipe)
        assert f"report__{pipe}" in dag.stages
    for kind, sub in P.SUBDIRS.items():
        for path in (REPO / "params" / sub).glob("*.yaml"):
            P.load_file(path, P.SCHEMAS[kind])


def test_shared_upstream_stages_exist_once(monkeypatch):
    monkeypatch.chdir(REPO)
    dag = Dag("default")
    kinds = [s.kind for s in dag.stages.values()]
    assert kinds.count("prepare_data") == 1 and kinds.count("partition") == 1
    assert kinds.count("pretrain") == len(dag.experiments) >= 3
    assert {s.name for s in dag.stages.values() if s.gpu} == {
        f"{k}__{e}" for k in ("pretrain", "features", "evaluate") for e in dag.experiments}


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    root = make_tiny_project(tmp_path, git=False)
    monkeypatch.chdir(root)
    return root


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize("file, old, new, field", [
    ("experiments/tiny_simclr.yaml", "temperature: 0.5", "temperature: 0.5\n  temprature: 1",
     "pretrain.temprature"),
    ("experiments/tiny_simclr.yaml", "rounds: 2", "rounds: two", "pretrain.rounds"),
    ("partitions/tiny_dir05_m3.yaml", "alpha: 0.5", "alpha: 0", "scheme.dirichlet.alpha"),
    ("partitions/tiny_dir05_m3.yaml", "alpha: 0.5", "alpha: -0.1", "scheme.dirichlet.alpha"),
    ("partitions/tiny_dir05_m3.yaml", "num_clients: 3", "num_clients: 70000", "num_clients"),
    ("experiments/tiny_simclr.yaml", "crop_scale: [0.5, 1.0]", "crop_scale: [0.9, 0.5]",
     "crop_scale"),
])
def test_bad_params_name_file_and_field(tiny, file, old, new, field):
    edit(tiny / "params" / file, old, new)
    with pytest.raises(P.ParamsError) as err:
        Dag("default")
    message = str(err.value)
    assert file in message and field in message, message


def test_a_stage_with_bad_params_stops_before_compute(tiny):
    edit(tiny / "params" / "partitions" / "tiny_dir05_m3.yaml", "alpha: 0.5", "alpha: 0")
    proc = run(["python", "-m", "stages.prepare_data", "tiny"], tiny, check=False)
    assert proc.returncode == 2
    assert "tiny_dir05_m3.yaml" in proc.stderr and "alpha" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tiny / "artifacts" / "data").exists()


def test_missing_data_set_says_how_to_get_it(tiny):
    (tiny / "params" / "datasets" / "tiny.yaml").write_text(
        "name: fashion_mnist\ndata_root: nowhere\ndownload: false\n")
    proc = run(["python", "-m", "stages.prepare_data", "tiny"], tiny, check=False)
    assert proc.returncode == 2
    assert "apt-get install dataset-fashion-mnist" in proc.stderr
    assert not (tiny / "artifacts" / "data" / "tiny").exists()


def test_unknown_pipeline_is_named(tiny):
    with pytest.raises(P.ParamsError, match="no pipeline 'nope'"):
        Dag("nope")
