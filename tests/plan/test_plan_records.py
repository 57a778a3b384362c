"""The plan as data: `pipeline write` leaves one record per stage (pipelines/plan/), each a
dependency of its stage in dvc.yaml, and the stage runtime runs by its record, not the DAG: a
stale one (params edited since) is made anew and replaces it, and a stage of no written
pipeline plans its own without writing one."""

from __future__ import annotations

import json

import pytest
import yaml

from fedssl.stage.record import record_path, record_text
from tests.fixtures import make_tiny_project


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = make_tiny_project(tmp_path, git=False)
    monkeypatch.chdir(root)
    return root


def test_every_stage_has_its_record_and_depends_on_it(project):
    from fedssl.methods import registry
    from fedssl.plan.dag import Dag

    dag = Dag("default")
    records = {p.stem for p in (project / "pipelines/plan").glob("*.json")}
    assert records == set(dag.stages)
    stages = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    for name in dag.stages:
        assert stages[name]["deps"][0] == str(record_path(name))
        record = json.loads(record_path(name).read_text())
        assert record == dag.record(name) and record["command"] == stages[name]["cmd"]
        assert "fedssl/plan/dag.py" not in record["code"]
    pretrain = json.loads(record_path("pretrain__tiny_simclr").read_text())
    assert pretrain["method"] == "fedsimclr" and pretrain["gpu"] is True
    exp = dag.presets.load("experiment", "tiny_simclr")
    hooks = registry.get("fedsimclr").hooks(exp.method, "pretrain")
    assert pretrain["hooks"] == hooks and hooks[0].endswith(":pretrain")
    assert pretrain["inputs"]["partition__tiny_dir05_m3"] == {
        "kind": "partition",
        "out": "artifacts/partitions/tiny_dir05_m3",
    }


def test_the_stage_runs_by_its_record(project):
    from fedssl.stage.context import StageContext

    path = record_path("partition__tiny_dir05_m3")
    record = json.loads(path.read_text())
    record["outputs"]["out"] = "artifacts/elsewhere"  # no DAG says so: only the record
    path.write_text(record_text(record))
    ctx = StageContext("partition", "tiny_dir05_m3")
    assert str(ctx.output_dir) == "artifacts/elsewhere"
    assert ctx.input("prepare_data") == project.joinpath("artifacts/data/tiny").relative_to(project)


def test_the_prepare_stage_reads_its_data_set_from_its_record(project):
    """Where the data set is read from and which reader reads it are the record's (the
    planner resolved them from the params and the registry): moved in the record alone, the
    stage reads there, and its error names that folder."""
    from fedssl.stage.base import StageFailed
    from stages import prepare_data

    path = record_path("prepare_data__tiny")
    record = json.loads(path.read_text())
    assert record["dataset"] == {"name": "fashion_mnist", "root": "raw", "download": False}
    assert record["hooks"] == ["fedssl.data.sets.fashion_mnist:FASHION_MNIST"]
    record["dataset"]["root"] = "elsewhere"
    path.write_text(record_text(record))
    with pytest.raises(StageFailed, match=f"fashion_mnist not found at {project}/elsewhere"):
        prepare_data.run(["tiny"])
    assert not (project / "artifacts/data/tiny").exists()


def test_a_record_the_params_moved_on_from_is_made_anew(project):
    from fedssl.stage.context import StageContext

    path = record_path("partition__tiny_dir05_m3")
    before = json.loads(path.read_text())
    partition = project / "params/partitions/tiny_dir05_m3.yaml"
    partition.write_text(partition.read_text().replace("seed: 0", "seed: 1"))
    ctx = StageContext("partition", "tiny_dir05_m3")
    after = json.loads(path.read_text())
    assert after["params_digest"] != before["params_digest"]
    assert ctx.record == after and ctx.presets.load("partition", ctx.name).seed == 1


def test_a_stage_of_no_written_pipeline_plans_its_own_record(project):
    from fedssl.stage.context import StageContext

    (project / "params/experiments/tiny_random_w8.yaml").write_text(
        "extends: tiny_random\ntitle: Random init, width 8\nmethod: {model: {width: 8}}\n"
    )
    ctx = StageContext("features", "tiny_random_w8")
    assert ctx.stage_name == "features__tiny_random_w8"
    assert ctx.input("pretrain").as_posix() == "artifacts/experiments/tiny_random_w8/pretrain"
    assert not record_path("features__tiny_random_w8").exists()


def test_the_report_record_keeps_the_pipelines_order_of_experiments():
    """The record is written with sorted keys; the report's rows follow the pipeline's list
    (params/pipelines.yaml), which the record keeps as ``order``."""
    from fedssl.plan.dag import Dag
    from fedssl.stage.record import record_path
    from tests.fixtures import REPO

    dag = Dag("default")
    plan = json.loads((REPO / record_path("report__default")).read_text())["pipeline"]
    assert (
        plan["order"]
        == dag.experiments
        == ["fmnist_fedsimclr", "fmnist_random_init", "fmnist_pixels"]
    )
    assert list(plan["experiments"]) != plan["order"]  # what the sorted keys alone would give
