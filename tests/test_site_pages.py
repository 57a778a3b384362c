"""The site's front and reference pages: the home page links every page of the navigation
under a table header that says what its columns hold, and the params reference gives a
meaning for every field, the methods' own included (issue 52 found 260 blank "meaning" cells
of 524, the federation settings' among them: their catalogue's meaning was dropped from every
schema; then 80 in the methods' params models, their seed 21 of them)."""

from __future__ import annotations

import importlib.util
import re

import yaml

from fedssl.experiment import experiment_model
from tests.fixtures import REPO


def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    items = node.values() if isinstance(node, dict) else node
    return [page for item in items for page in nav_pages(item)]


def test_the_home_page_links_every_page_of_the_navigation():
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=yaml.Loader)
    home = (REPO / "docs" / "index.md").read_text()
    linked = set(re.findall(r"\]\(([\w/.-]+\.md)\)", home))
    missing = [p for p in nav_pages(config["nav"]) if p != "index.md" and p not in linked]
    assert not missing, f"docs/index.md links none of {missing}"


def test_no_table_of_the_docs_has_an_empty_header():
    for page in sorted((REPO / "docs").rglob("*.md")):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines[:-1]):
            if re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1]) and not line.strip(" |"):
                raise AssertionError(f"{page.relative_to(REPO)}:{i + 1}: an empty table header")


def test_every_field_has_a_meaning():
    experiment_model()  # the methods' and evaluations' models, registered
    page = hooks().params_page()
    blank, section = [], ""
    for line in page.splitlines():
        section = line[4:] if line.startswith("### ") else section
        if line.startswith("| `") and line.rstrip().endswith("|  |"):
            blank.append((section, line.split("`")[1]))
    assert not blank, f"fields without a description: {blank}"


def test_a_federation_setting_keeps_the_catalogues_meaning_under_its_methods_default():
    from pydantic import Field

    from fedssl.params import FEDERATION_FIELDS, federation_block

    block = federation_block(lr=0.1, local_epochs=Field(2, description="E, the paper's"))
    fields = block.model_fields
    assert fields["lr"].description == FEDERATION_FIELDS["lr"][1] and fields["lr"].default == 0.1
    assert fields["local_epochs"].description == "E, the paper's"
    schema = block.model_json_schema()["properties"]
    assert schema["lr"]["description"] == FEDERATION_FIELDS["lr"][1]
    assert schema["lr"]["exclusiveMinimum"] == 0  # the catalogue's type still holds
