"""The code's shape stays what issue 34 made it: short functions, and the simplest method is a
loss and a model in one small file (a method written as a plugin on the federated base)."""

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


def test_fedsimclr_is_one_file_of_at_most_sixty_lines():
    files = sorted((REPO / "fedssl/methods/fedsimclr").glob("*.py"))
    assert [f.name for f in files] == ["__init__.py"]
    assert len(files[0].read_text().splitlines()) <= 60
