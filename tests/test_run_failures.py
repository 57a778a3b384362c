"""A failed `fedssl run` ends on one clear line: the stage that failed, its own error line and
its log (Snakemake's report put that line twenty lines above its end, under a traceback)."""

from __future__ import annotations

import sys

import pytest

from tests.fixtures import make_tiny_project, run

pytestmark = pytest.mark.timeout(300)


def test_a_failed_stage_is_the_last_line(tmp_path):
    project = make_tiny_project(tmp_path / "p", git=False)
    raw = project / "raw" / "train-images-idx3-ubyte.gz"
    raw.write_bytes(raw.read_bytes()[: raw.stat().st_size // 2])  # the header reads, the rest not
    cmd = [sys.executable, "-m", "fedssl.cli", "run", "prepare_data__tiny", "-c1"]
    proc = run(cmd, project, check=False)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: stage prepare_data__tiny failed: {raw.relative_to(project)}: ")
    assert "damaged" in last and last.endswith("(log: artifacts/logs/prepare_data__tiny.log)")
    assert sum(x.startswith("error: stage ") for x in proc.stderr.splitlines()) == 1
