"""The `flower` stage writes the simulator stage's files: FedSimCLR's pretraining of a tiny
project run as a Flower app (Flower's simulation engine, one SuperNode per client) leaves the
same model, round log, byte ledger and meta.json, byte for byte, as `stages.method`, so the
probes, costs and report downstream read it unchanged."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fedssl.runtime import StageFailed
from fedssl.stage import run_record
from tests.fixtures import in_project, make_tiny_project, output_files, run_stage

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_tiny_project(tmp_path_factory.mktemp("flower"), git=False)


def test_a_method_without_flower_steps_is_refused_before_any_compute(project):
    import stages.flower

    with in_project(project):
        with pytest.raises(StageFailed, match="cannot run step 'pretrain' as a Flower app"):
            stages.flower.run(["pretrain", "tiny_random"])


def test_the_flower_stage_writes_the_simulator_stage_files(project, monkeypatch):
    pytest.importorskip("flwr")
    import stages.flower

    monkeypatch.setenv("FEDSSL_DEVICE", "cpu")
    with in_project(project) as planned_stage:
        planned = planned_stage("pretrain", "tiny_simclr")
        for name in planned.spec.upstream:
            run_stage(type(planned)(planned.dag, name), upstream=True)
        run_stage(planned)
        expected = output_files(planned)
        shutil.rmtree(planned.spec.out)
        for path in expected:
            Path(path).unlink(missing_ok=True)
        stages.flower.run(["pretrain", "tiny_simclr"])
        got = output_files(planned)
        record = run_record(planned.name)
    assert record["engine"].startswith("flower") and record["resumed_from_round"] == 0
    assert {Path(p).name for p in expected} >= {"model.pt", "communication.json", "rounds.tsv"}
    assert got.keys() == expected.keys()
    for path, content in expected.items():
        assert got[path] == content, path
