"""Growth stages as the DAG's own shape, in both front ends: editing the settings of stage 2
of a 3-stage LW-FedSSL run reruns stages 2..3 (and what reads them), never stage 1, in
Snakemake and in DVC alike."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.fixtures import make_tiny_project, run, run_stages_in_process
from tests.lwfedssl_fixtures import TINY_PARTITION, tiny_text

pytestmark = pytest.mark.timeout(900)
CONFIG = ["--config", "pipeline=lwfe"]


def planned(project: Path) -> set[str]:
    out = run(["snakemake", "-n", "--cores", "1", *CONFIG], project).stdout
    return {m.group(1) for m in re.finditer(r"^(\w+__\w+)\s+\d+$", out, re.M)}


def dvc_stale(project: Path) -> set[str]:
    out = run(["dvc", "status", "--json", "pipelines/lwfe/dvc.yaml"], project).stdout
    return {k.split(":")[-1] for k in json.loads(out or "{}")}


def fingerprint(project: Path, kind: str) -> str:
    path = project / "artifacts/experiments/tiny_lw_fedssl" / kind / "meta.json"
    return json.loads(path.read_text())["fingerprint"]


def with_stages(overrides: str) -> str:
    text = tiny_text("lw_fedssl")
    anchor = "  calibration: {enabled: true, timing: round_start}\n"
    return text.replace(anchor, anchor + f"  stages: {overrides}\n")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A tiny project whose pipeline `lwfe` is one 3-stage LW-FedSSL run, computed in this
    process (one torch import) and committed to DVC as the front ends leave it."""
    root = make_tiny_project(tmp_path_factory.mktemp("lwfe"))
    params = root / "params"
    (params / "partitions" / "tiny_iid_m3_srv.yaml").write_text(TINY_PARTITION)
    (params / "experiments" / "tiny_lw_fedssl.yaml").write_text(with_stages("{}"))
    with open(params / "pipelines.yaml", "a") as f:
        f.write("  lwfe: [tiny_lw_fedssl]\n")
    run(["python", "-m", "fedssl.pipeline", "write", "lwfe"], root)
    run_stages_in_process(root, ["lwfe"])
    run(["python", "-m", "fedssl.pipeline", "write"], root)  # the new results' metrics join
    run(["python", "-m", "fedssl.pipeline", "check"], root)  # the DAG check every stage reads
    run(
        [
            "dvc",
            "commit",
            "--force",
            "--quiet",
            "pipelines/lwfe/dvc.yaml",
            "dvc.yaml:dag",
            "dvc.yaml:prepare_data__tiny",
        ],
        root,
    )
    return root


def test_editing_stage_2_reruns_stages_2_to_3_in_both_front_ends(project):
    assert planned(project) == set() and dvc_stale(project) == set()
    before = {k: fingerprint(project, k) for k in ("grow_1", "grow_2", "grow_3")}
    path = project / "params/experiments/tiny_lw_fedssl.yaml"
    path.write_text(with_stages("{s2: {lr: 0.002, alpha: 0.1}}"))
    run(["python", "-m", "fedssl.pipeline", "write"], project)  # grow_2 now reads s2
    downstream = {
        f"{k}__tiny_lw_fedssl"
        for k in ("grow_2", "grow_3", "features", "evaluate", "finetune", "costs")
    }
    assert planned(project) == downstream | {"report__lwfe"}
    stale = dvc_stale(project)  # DVC lists the stages whose own params changed
    assert "grow_2__tiny_lw_fedssl" in stale and "grow_1__tiny_lw_fedssl" not in stale
    run(["dvc", "repro", "pipelines/lwfe/dvc.yaml"], project)
    after = {k: fingerprint(project, k) for k in before}
    assert after["grow_1"] == before["grow_1"]  # stage 1 did not run again
    assert after["grow_2"] != before["grow_2"] and after["grow_3"] != before["grow_3"]
    assert planned(project) == set() and dvc_stale(project) == set()
    # the last stage alone: only it and what reads it
    path.write_text(with_stages("{s2: {lr: 0.002, alpha: 0.1}, s3: {alpha: 0.0}}"))
    run(["python", "-m", "fedssl.pipeline", "write"], project)
    assert planned(project) == downstream - {"grow_2__tiny_lw_fedssl"} | {"report__lwfe"}
    stale = dvc_stale(project)
    assert "grow_3__tiny_lw_fedssl" in stale and not stale & {
        "grow_1__tiny_lw_fedssl",
        "grow_2__tiny_lw_fedssl",
    }
    # stage 1's rounds move every later stage's place in the cosine schedule: all rerun
    path.write_text(with_stages("{s1: {rounds: 2}, s2: {lr: 0.002, alpha: 0.1}}"))
    run(["python", "-m", "fedssl.pipeline", "write"], project)
    assert "grow_1__tiny_lw_fedssl" in planned(project)
    assert {"grow_1__tiny_lw_fedssl", "grow_2__tiny_lw_fedssl"} <= dvc_stale(project)
    path.write_text(with_stages("{s2: {lr: 0.002, alpha: 0.1}}"))
    run(["python", "-m", "fedssl.pipeline", "write"], project)
    assert planned(project) == set() and dvc_stale(project) == set()
