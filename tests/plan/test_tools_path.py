"""The tests find the project's tools in the environment that runs them, without a prepared
PATH (as `.venv/bin/pytest` is run from a plain shell)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.fixtures import REPO


def test_tools_come_from_the_running_environment():
    tools = Path(sys.executable).parent
    for tool in ("python", "snakemake", "dvc"):
        found = shutil.which(tool)
        assert found and Path(found).parent == tools, (tool, found)


def test_a_test_run_from_a_bare_shell_finds_them():
    """pytest started by its full path, with only the system's PATH, finds them too."""
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    test = "tests/plan/test_tools_path.py::test_tools_come_from_the_running_environment"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
