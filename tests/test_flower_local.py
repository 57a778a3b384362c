"""Opt-in (`make test-flower`, which installs `.[flower]`): a real Flower deployment on
localhost, a SuperLink and two SuperNodes started as processes (tests/flower_local.sh), runs
FedSimCLR's pretraining of a tiny two-client project through `flwr run` (tests/flower_app),
and writes the very files the simulator's stage writes (model, ledger, round log, meta.json),
byte for byte, with every process on one thread as the stage runs (float sums depend on it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import REPO, make_tiny_project

pytestmark = [
    pytest.mark.flower,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        os.environ.get("FEDSSL_FLOWER_TEST") != "1",
        reason="opt-in: make test-flower (needs pip install -e '.[flower]')",
    ),
]
SCRIPT = REPO / "tests" / "flower_local.sh"
STAGE = "pretrain__tiny_simclr2"


def two_client_project(root: Path) -> Path:
    make_tiny_project(root, git=False)
    params = root / "params"
    part = (params / "partitions" / "tiny_dir05_m3.yaml").read_text()
    (params / "partitions" / "tiny_dir05_m2.yaml").write_text(
        part.replace("num_clients: 3", "num_clients: 2")
    )
    exp = (params / "experiments" / "tiny_simclr.yaml").read_text()
    (params / "experiments" / "tiny_simclr2.yaml").write_text(
        exp.replace("partition: tiny_dir05_m3", "partition: tiny_dir05_m2")
    )
    return root


def outputs(root: Path) -> dict[str, bytes]:
    folders = [
        root / "artifacts/experiments/tiny_simclr2/pretrain",
        root / "results/experiments/tiny_simclr2",
    ]
    return {str(p.relative_to(root)): p.read_bytes() for d in folders for p in sorted(d.glob("*"))}


def test_a_step_runs_through_a_superlink_and_two_supernodes(tmp_path):
    root = two_client_project(tmp_path / "project")
    env = {
        **os.environ,
        "FEDSSL_DEVICE": "cpu",
        "FEDSSL_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }
    # the simulator's stage, and its upstream data and partition
    run_in = lambda *cmd: subprocess.run(cmd, cwd=root, env=env, check=True)  # noqa: E731
    run_in(sys.executable, "-m", "stages.prepare_data", "tiny")
    run_in(sys.executable, "-m", "stages.partition", "tiny_dir05_m2")
    run_in(sys.executable, "-m", "stages.method", "pretrain", "tiny_simclr2")
    expected = outputs(root)
    shutil.rmtree(root / "artifacts/experiments/tiny_simclr2/pretrain")
    shutil.rmtree(root / "results/experiments/tiny_simclr2")

    state = tmp_path / "flower"
    subprocess.run([SCRIPT, "start", state, "2"], env=env, check=True)
    try:
        proc = subprocess.run(
            [
                SCRIPT,
                "run",
                state,
                REPO / "tests" / "flower_app",
                f"root='{root}' experiment='tiny_simclr2'",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=1500,
        )
    finally:
        subprocess.run([SCRIPT, "stop", state], check=False)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "round 2/2" in proc.stdout
    got = outputs(root)
    assert got.keys() == expected.keys() and len(got) == 4
    for name, content in expected.items():
        assert got[name] == content, name
    record = (root / "artifacts/.runs" / f"{STAGE}.json").read_text()
    assert "flower deployment, 2 SuperNodes" in record
