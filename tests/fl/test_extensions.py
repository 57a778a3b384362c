"""The README's extension points, each dropped into a copy of the project and run through the
stage runner (``python -m stages.<kind> <name>``, as both front ends run it): a shared
evaluation is one file in fedssl/evaluations/ (its declaration, metrics and run), run by the
one generic stage script. (A method:
tests/methods/test_plugins.py; a data set: tests/data/test_datasets.py.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures import REPO, make_tiny_project

pytestmark = pytest.mark.timeout(600)


def _run(root: Path, *argv: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "FEDSSL_DEVICE": "cpu", "FEDSSL_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_new_evaluation_is_one_file(tmp_path):
    root = make_tiny_project(tmp_path, git=False)
    before = {p: p.read_bytes() for p in root.rglob("*.py")}
    shutil.copy(REPO / "tests" / "toy_evaluation.py", root / "fedssl/evaluations/client_balance.py")
    changed = {
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if before.get(p) != p.read_bytes()
    }
    assert changed == {"fedssl/evaluations/client_balance.py"}

    _run(root, "fedssl.pipeline", "write")
    dvc = (root / "dvc.yaml").read_text()
    # one stage for the three experiments (they share the partition it reads), owned by the
    # first by name, reading the partition and declaring its metrics
    assert dvc.count("python -m stages.evaluation client_balance") == 1
    stage = re.split(r"\n  (?=\S)", dvc.split("\n  client_balance__tiny_pixels:\n", 1)[1])[0]
    assert "artifacts/partitions/tiny_dir05_m3" in stage
    assert "fedssl/evaluations/client_balance.py" in stage and "stages/evaluation.py" in stage
    assert "results/experiments/tiny_pixels/balance.json" in stage

    _run(root, "stages.prepare_data", "tiny")
    _run(root, "stages.partition", "tiny_dir05_m3")
    _run(root, "stages.evaluation", "client_balance", "tiny_pixels")
    metrics = json.loads((root / "results/experiments/tiny_pixels/balance.json").read_text())
    with np.load(root / "artifacts/partitions/tiny_dir05_m3/clients.npz") as z:
        sizes = [len(z[k]) for k in z.files]
    assert metrics == {"clients": 3, "largest_share": round(max(sizes) / sum(sizes), 4)}
    assert sum(sizes) == 240 and metrics["largest_share"] > 1 / 3  # Dirichlet(0.5): uneven
