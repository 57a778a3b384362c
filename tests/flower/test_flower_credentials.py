"""Where a Flower deployment's credentials go (no Flower needed): outside the project by
default, or into a folder git ignores; never where ``git status`` would offer them for a
commit, and the private files readable by their owner only."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

from tests.fixtures import REPO

PRIVATE = ("ca.key", "superlink.key", "node-0.key", "node-1.key", "control.token")


def git_status(root) -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.fixture
def repo(tmp_path):
    """A git repository with the project's .gitignore, and a home of its own outside it."""
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(REPO / ".gitignore", root / ".gitignore")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], [*git, "commit", "-qm", "start"]):
        subprocess.run(cmd, cwd=root, check=True)
    return root


def credentials(repo, home, *folder) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedssl.cli", "flower", "credentials", *folder, "--nodes", "2"],
        cwd=repo,
        env={**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )


def assert_private(folder) -> None:
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in PRIVATE:
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name


def test_by_default_the_credentials_go_outside_the_project(repo, tmp_path):
    made = credentials(repo, tmp_path / "home")
    assert made.returncode == 0, made.stderr
    assert_private(tmp_path / "home/.config/fedssl/flower-credentials")
    assert git_status(repo) == ""


def test_the_how_tos_folder_in_the_project_is_git_ignored(repo, tmp_path):
    assert credentials(repo, tmp_path / "home", "flower-credentials").returncode == 0
    assert_private(repo / "flower-credentials")
    assert git_status(repo) == ""


def test_a_folder_git_would_commit_is_refused_before_any_key_is_written(repo, tmp_path):
    refused = credentials(repo, tmp_path / "home", "secrets")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "secrets is in a git repository that does not ignore it" in refused.stderr
    assert not (repo / "secrets").exists() and git_status(repo) == ""
