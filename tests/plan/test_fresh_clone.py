"""A fresh clone's `dvc status` says only what a clone lacks (the artifacts, which DVC's cache
holds on the machine that ran them), never that committed code or params changed: the root
`dvc.lock` records the code its stages run (`python -m fedssl.pipeline relock` after edits
shown not to change outputs). It listed 13 code files as modified across 14 stages."""

from __future__ import annotations

import json

import pytest

from tests.fixtures import REPO, run

pytestmark = pytest.mark.timeout(600)


def test_a_fresh_clone_lists_no_changed_code_or_params(tmp_path):
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(REPO), str(clone)], tmp_path)
    status = json.loads(run(["dvc", "status", "--json"], clone).stdout or "{}")
    assert status, "a clone has no artifacts: DVC says so"
    faults = []
    for stage, entries in status.items():
        for entry in entries:
            for path, state in entry.get("changed deps", {}).items():
                if not (path.startswith("artifacts/") and state == "deleted"):
                    faults.append(f"{stage}: dep {path} {state}")
            for path, state in entry.get("changed outs", {}).items():
                if state != "not in cache":
                    faults.append(f"{stage}: out {path} {state}")
            faults += [f"{stage}: {entry}" for entry in entries if isinstance(entry, str)]
    fix = "after edits that leave outputs as they were: `python -m fedssl.pipeline relock`"
    assert not faults, "\n".join([*faults, fix])
