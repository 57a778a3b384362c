"""The `flower` stage writes the simulator stage's files: a method's federated step of a tiny
project run as a Flower app (Flower's simulation engine, one SuperNode per client) leaves the
same model, round log, byte ledger and meta.json, byte for byte, as `stages.method`, so the
probes, costs and report downstream read it unchanged. FedRep's output holds every party's
personal layers and personalised accuracy (mirrored from the clients); FedEMA's round log
lacks only the diagnostics its clients record."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest

from fedssl.stage.context import run_record
from fedssl.stage.runtime import StageFailed
from tests.fixtures import in_project, make_tiny_project, output_files, run_stage
from tests.methods.mpfedcon.test_mpfedcon_chain import EXPERIMENT as MPF
from tests.methods.mpfedcon.test_mpfedcon_chain import PARTITION as SHARDS
from tests.methods.test_method_contract import experiment

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = make_tiny_project(tmp_path_factory.mktemp("flower"), git=False)
    params = root / "params"
    (params / "partitions" / "tiny_shards.yaml").write_text(SHARDS)
    (params / "experiments" / "tiny_fedrep.yaml").write_text(
        MPF.format(variant="fedrep", seed=0).replace("rounds: 3", "rounds: 2")
    )
    (params / "experiments" / "tiny_scaffold.yaml").write_text(
        MPF.format(variant="scaffold", seed=0)
    )
    (params / "experiments" / "tiny_fedema.yaml").write_text(experiment("fedema", tau=0.7))
    return root


def test_a_step_that_does_not_map_is_refused_before_any_compute(project):
    import stages.flower

    with in_project(project):
        with pytest.raises(StageFailed, match="cannot run step 'pretrain' as a Flower app"):
            stages.flower.run(["pretrain", "tiny_random"])


def rows(tsv: bytes, drop=()) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k not in drop}
        for r in csv.DictReader(io.StringIO(tsv.decode()), delimiter="\t")
    ]


def without_digest(meta: bytes) -> dict:
    """meta.json less what covers the round log's bytes (its digest and the log's file hash),
    which differ where the simulator logs client-side columns a Flower server cannot see."""
    record = {k: v for k, v in json.loads(meta).items() if k != "output_digest"}
    files = record.get("files", {})
    record["files"] = {k: v for k, v in files.items() if not k.endswith("rounds.tsv")}
    return record


@pytest.mark.parametrize(
    "step, experiment, client_side",
    [
        ("pretrain", "tiny_simclr", ()),
        ("train", "tiny_fedrep", ()),
        ("pretrain", "tiny_fedema", ("divergence", "decay")),
    ],
)
def test_the_flower_stage_writes_the_simulator_stage_files(
    project, monkeypatch, step, experiment, client_side
):
    pytest.importorskip("flwr")
    import stages.flower

    monkeypatch.setenv("FEDSSL_DEVICE", "cpu")
    with in_project(project) as planned_stage:
        planned = planned_stage(step, experiment)
        for name in planned.spec.upstream:
            run_stage(type(planned)(planned.dag, name), upstream=True)
        run_stage(planned)
        expected = output_files(planned)
        shutil.rmtree(planned.spec.out)
        for path in expected:
            Path(path).unlink(missing_ok=True)
        stages.flower.run([step, experiment])
        got = output_files(planned)
        record = run_record(planned.name)
    assert record["engine"].startswith("flower") and record["resumed_from_round"] == 0
    assert got.keys() == expected.keys()
    for path, content in expected.items():
        if client_side and path.endswith("rounds.tsv"):
            assert rows(got[path]) == rows(content, client_side), path
        elif client_side and path.endswith("meta.json"):  # its digest covers the round log
            assert without_digest(got[path]) == without_digest(content), path
        else:
            assert got[path] == content, path


def test_scaffold_is_refused_before_the_simulation_starts(project, monkeypatch):
    pytest.importorskip("flwr")
    import stages.flower

    monkeypatch.setenv("FEDSSL_DEVICE", "cpu")
    with in_project(project) as planned_stage:
        planned = planned_stage("train", "tiny_scaffold")
        for name in planned.spec.upstream:
            run_stage(type(planned)(planned.dag, name), upstream=True)
        with pytest.raises(StageFailed, match="'scaffold' cannot run as a Flower app"):
            stages.flower.run(["train", "tiny_scaffold"])
