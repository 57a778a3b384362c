"""docs/reference/layout.md is generated (fedssl.reporting.tree): every top-level item of the
repository and of the library is on it, each library part described by its own docstring, and
the page equals what the code gives (the docs' stale-page test refills the same block)."""

from __future__ import annotations

import subprocess

import pytest

from fedssl.reporting import tree
from tests.fixtures import REPO


def test_every_top_level_item_of_the_repository_is_described():
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    items = {p.split("/")[0] + ("/" if "/" in p else "") for p in tracked}
    described = set(tree.REPOSITORY) | {"fedssl/"}
    assert items - described == set(), "describe them in fedssl/reporting/tree.py"


def test_the_page_lists_every_part_of_the_library_with_its_modules():
    page = (REPO / "docs/reference/layout.md").read_text()
    assert page == tree.fill_blocks(page, REPO)
    for name, _, modules in tree.parts(REPO / "fedssl"):
        assert f"\n  {name} " in page
        assert all(m in page for m in modules), name
    assert "stage/             The stage runtime: what every stage runs on" in page


def test_a_new_part_appears_described_by_its_docstring(tmp_path):
    package = tmp_path / "fedssl"
    (package / "widgets").mkdir(parents=True)
    (package / "__init__.py").write_text('"""The library."""\n')
    (package / "widgets/__init__.py").write_text('"""Widgets: small parts. More here."""\n')
    (package / "widgets/gear.py").write_text('"""A gear."""\n')
    (package / "loose.py").write_text('"""One loose module, e.g. a tool. It does X."""\n')
    text = tree.tree(tmp_path)
    assert "  widgets/           Widgets: small parts [gear]\n" in text
    assert "  loose.py           One loose module, e.g. a tool\n" in text


def test_a_part_without_a_docstring_is_refused_naming_its_file(tmp_path):
    (tmp_path / "fedssl/bare").mkdir(parents=True)
    (tmp_path / "fedssl/__init__.py").write_text('"""The library."""\n')
    (tmp_path / "fedssl/bare/__init__.py").write_text("X = 1\n")
    with pytest.raises(ValueError, match=r"bare/__init__.py: no docstring"):
        tree.tree(tmp_path)
