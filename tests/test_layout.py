"""The code's shape stays what issue 34 made it: short functions, and the simplest method is a
loss and a model in a small declaration and its recipe (a method written as a plugin on the
federated base; the recipe is the torch-bearing part the declaration names)."""

from __future__ import annotations

import ast

from tests.fixtures import REPO

LONGEST_FUNCTION = 50  # lines, signature and docstring included


def test_no_function_of_the_library_is_over_fifty_lines():
    long = []
    for path in sorted((REPO / "fedssl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines})")
    assert not long, "split these functions: " + ", ".join(long)


def test_fedsimclr_is_a_declaration_and_a_recipe_of_at_most_seventy_lines():
    files = sorted((REPO / "fedssl/methods/fedsimclr").glob("*.py"))
    assert [f.name for f in files] == ["__init__.py", "train.py"]
    assert sum(len(f.read_text().splitlines()) for f in files) <= 70
