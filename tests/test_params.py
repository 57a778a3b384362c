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


def add_variant(root: Path, name: str, body: str) -> None:
    (root / "params" / "experiments" / f"{name}.yaml").write_text(body)
    with open(root / "params" / "pipelines.yaml", "a") as f:
        f.write(f"  variants: [{name}]\n")


def test_extends_merges_over_the_base_and_tracks_every_file(tiny):
    add_variant(tiny, "tiny_simclr_t01", "extends: tiny_simclr\ntitle: cooler\n"
                "pretrain: {temperature: 0.1}\n")
    base = P.load_preset("experiment", "tiny_simclr")
    child = P.load_preset("experiment", "tiny_simclr_t01")
    assert child.pretrain.temperature == 0.1 and child.title == "cooler"
    assert child.pretrain.model_dump(exclude={"temperature"}) == base.pretrain.model_dump(
        exclude={"temperature"})  # nested mappings merge: the rest of `pretrain` is inherited
    assert child.model == base.model and child.linear_probe == base.linear_probe
    stage = Dag("variants").stages["pretrain__tiny_simclr_t01"]
    assert stage.params == {  # DVC params: each file with the keys it sets itself
        "params/experiments/tiny_simclr_t01.yaml": ["pretrain", "extends"],
        "params/experiments/tiny_simclr.yaml": ["partition", "model", "pretrain"]}
    # an edit of the base reruns the variant (same fingerprint inputs as a plain file)
    before = Dag("variants").fingerprint("pretrain__tiny_simclr_t01")
    edit(tiny / "params/experiments/tiny_simclr.yaml", "rounds: 2", "rounds: 3")
    assert Dag("variants").fingerprint("pretrain__tiny_simclr_t01") != before


@pytest.mark.parametrize("body, message", [
    ("extends: nope\n", "no preset 'nope'"),
    ("extends: tiny_loop\n", "cycle tiny_loop -> tiny_loop"),
    ("extends: tiny_simclr\npretrain: {temperature: -1}\n", "pretrain.temperature"),
    ("extends: [tiny_simclr]\n", "expected the name of a preset"),
])
def test_bad_extends_is_named(tiny, body, message):
    add_variant(tiny, "tiny_loop", body)
    with pytest.raises(P.ParamsError, match=message) as err:
        Dag("variants")
    assert "tiny_loop.yaml" in str(err.value)


def test_deep_merge_replaces_lists_and_scalars():
    assert P.deep_merge({"a": {"b": 1, "c": [1, 2]}, "d": 1},
                       {"a": {"c": [3]}, "d": {"e": 2}}) == {"a": {"b": 1, "c": [3]},
                                                              "d": {"e": 2}}


def test_a_sweep_pipeline_names_its_column_and_bad_paths_are_named(tiny):
    with open(tiny / "params" / "pipelines.yaml", "a") as f:
        f.write("  sweep: {column: pretrain.temperature, experiments: [tiny_simclr]}\n")
    dag = Dag("sweep")
    assert dag.column == "pretrain.temperature" and dag.experiments == ["tiny_simclr"]
    assert dag.stages["report__sweep"].params["params/pipelines.yaml"] == ["pipelines.sweep"]
    assert Dag("default").column == "partition"
    edit(tiny / "params" / "pipelines.yaml", "pretrain.temperature", "pretrain.temprature")
    with pytest.raises(P.ParamsError, match="pipelines.sweep.column: no setting "
                                            "'pretrain.temprature'"):
        Dag("sweep")
