"""Every ``ctx`` parameter in ``fedssl/`` names its type (issue 49: the plugin surface is typed,
so an IDE or a type checker follows a hook into the context it reads)."""

from __future__ import annotations

import ast

from tests.fixtures import REPO


def untyped_ctx() -> list[str]:
    """``path:line:function`` of each ``ctx`` parameter without an annotation."""
    found = []
    for path in sorted((REPO / "fedssl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                if any(p.arg == "ctx" and p.annotation is None
                       for p in a.posonlyargs + a.args + a.kwonlyargs):  # fmt: skip
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}:{node.name}")
    return found


def test_every_ctx_parameter_is_typed():
    assert untyped_ctx() == []
