"""The lint gates' exemptions (ruff's per-file ignores in pyproject.toml) are a list that only
shrinks: each entry says why, and each is still needed (an entry whose file no longer breaks
the rule it exempts fails here, so the exemption cannot outlive its reason and cover new code)."""

from __future__ import annotations

import json
import re
import subprocess

from tests.fixtures import REPO

ENTRY = re.compile(r'^"([^"]+)" = \[([^\]]*)\](?:\s*#\s*(.*))?$')


def exemptions() -> dict[str, tuple[set[str], str]]:
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[tool.ruff.lint.per-file-ignores]\n")[1].split("\n[")[0]
    found = {}
    for line in section.splitlines():
        if m := ENTRY.match(line):
            found[m.group(1)] = ({c.strip(' "') for c in m.group(2).split(",")}, m.group(3) or "")
    return found


def test_every_exemption_says_why():
    listed = exemptions()
    assert listed, "no per-file ignores found: the section's format changed"
    assert [path for path, (_, why) in listed.items() if len(why) < 20] == []


def test_every_exemption_is_still_needed():
    listed = exemptions()
    ruff = subprocess.run(
        ["ruff", "check", "--config", "lint.per-file-ignores = {}", "--output-format", "json",
         "--select", "C901,PLR0913", *listed],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    broken: dict[str, set[str]] = {}
    for v in json.loads(ruff.stdout):
        path = str((REPO / v["filename"]).resolve().relative_to(REPO))
        broken.setdefault(path, set()).add(v["code"])
    stale = {p: codes - broken.get(p, set()) for p, (codes, _) in listed.items()}
    assert {p: c for p, c in stale.items() if c} == {}, "remove these exemptions"
