"""The project's own import graph, read from the source (nothing is imported or run).

A stage depends on every project file its entry modules import, directly or through other
project modules, including imports inside functions (a hook may import its code lazily) and the
packages' ``__init__`` files that such imports run. Imports under ``if TYPE_CHECKING:`` are
annotations only and never run, so they are not followed. Both front ends take each stage's code
dependencies from here, so an edit anywhere a stage's code reaches reruns it in DVC and
Snakemake alike. Modules found dynamically (the method registry's discovery, the
``"module:function"`` hooks a method declares) are named by the caller.

``python -m fedssl.plan.codegraph cycles`` prints the import cycles of the library (every import,
lazy ones included; ``--top-level`` counts only the imports that run when a module is loaded,
``--with-types`` the type-only ones too).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import sys
from functools import cache
from pathlib import Path

PACKAGES = ("fedssl", "stages")  # top-level packages of the project


def module_file(module: str, root: Path = Path(".")) -> Path | None:
    """The file of a project module (``a/b.py`` or ``a/b/__init__.py``), or None."""
    if module.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST, top_level: bool, with_types: bool = False):
    """The import statements that can run: not those under ``if TYPE_CHECKING:`` (unless
    ``with_types``), and with ``top_level`` not those inside functions either (they run only
    when called)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node) and not with_types:
            todo += node.orelse
            continue
        if top_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        todo += ast.iter_child_nodes(node)


def _imported(
    path: Path, module: str, is_package: bool, top_level: bool = False, with_types: bool = False
) -> set[str]:
    """Modules an import statement of ``path`` names (``from a import b`` also names ``a.b``,
    which is a module when such a file exists). Remembered by the file's content (see
    :data:`IMPORTS_CACHE`), as parsing is most of what planning costs."""
    text = path.read_text()
    flags = f"{module}\0{is_package}\0{top_level}" + ("\0types" if with_types else "")
    key = hashlib.sha256(f"{flags}\0{text}".encode()).hexdigest()
    known = _known_imports()
    if key not in known:
        known[key] = sorted(
            _parse_imports(text, str(path), module, is_package, top_level, with_types)
        )
        _unsaved.append(key)
    return set(known[key])


def _parse_imports(
    text: str, path: str, module: str, is_package: bool, top_level: bool, with_types: bool
):
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in _import_nodes(ast.parse(text, path), top_level, with_types):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        else:
            base = node.module or ""
            if node.level:  # relative import
                parent = package.split(".")
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


# The modules each file imports, by its content: kept between processes (a stage or a
# Snakemake run plans with it), rewritten when a new file content was parsed.
IMPORTS_CACHE = Path("artifacts/.cache/imports.json")


@cache
def _known_imports() -> dict[str, list[str]]:
    try:
        return json.loads(IMPORTS_CACHE.read_text())
    except (OSError, ValueError):
        return {}


_unsaved: list[str] = []


def _save_imports() -> None:
    if not _unsaved:
        return
    _unsaved.clear()
    try:
        IMPORTS_CACHE.parent.mkdir(parents=True, exist_ok=True)
        tmp = IMPORTS_CACHE.with_name(f"{IMPORTS_CACHE.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(_known_imports()))
        tmp.replace(IMPORTS_CACHE)  # atomic: a concurrent reader sees one whole file
    except OSError:
        pass  # a read-only checkout plans without the cache


@cache
def _closure(module: str, root: str) -> frozenset[str]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        # importing a.b.c runs a/__init__ and a/b/__init__ first
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            path = module_file(prefix, Path(root))
            if path is None or str(path) in seen:
                continue
            seen.add(str(path))
            todo += _imported(path, prefix, path.name == "__init__.py")
    _save_imports()
    return frozenset(seen)


def code_files(*modules: str, root: Path = Path(".")) -> list[str]:
    """Every project file the given modules reach, sorted (posix paths relative to root)."""
    return list(_code_files(modules, str(root)))


@cache
def _code_files(modules: tuple[str, ...], root: str) -> tuple[str, ...]:
    files: set[str] = set()
    for m in modules:
        files |= _closure(m, root)
    return tuple(
        sorted(
            Path(f).relative_to(root).as_posix() if Path(f).is_absolute() else Path(f).as_posix()
            for f in files
        )
    )


def clear_cache() -> None:
    """Forget the graph (after code edits within one process, e.g. in tests)."""
    _closure.cache_clear()
    _code_files.cache_clear()


# ---------------------------------------------------------------------- cycles
def import_graph(
    root: Path = Path("."),
    top_level: bool = False,
    packages: tuple[str, ...] = ("fedssl",),
    with_types: bool = False,
) -> dict[str, set[str]]:
    """Module -> the project modules its import statements name (the parent packages that
    Python runs first are not edges: a submodule always runs its package's ``__init__``);
    ``with_types``: the type-only imports under ``if TYPE_CHECKING:`` too."""
    graph: dict[str, set[str]] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            named = _imported(path, module, path.name == "__init__.py", top_level, with_types)
            graph[module] = {n for n in named if n != module and module_file(n, root)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of modules (each a set of modules that import each other
    in a circle), sorted; Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = _pop_group(stack, on_stack, v)
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _pop_group(stack: list[str], on_stack: set[str], root: str) -> list[str]:
    """Tarjan's step: the modules on the stack down to ``root``, popped (one group)."""
    group = []
    while not group or group[-1] != root:
        group.append(stack.pop())
        on_stack.discard(group[-1])
    return group


def circle(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """One closed path through a cycle group, from its first module back to it (shortest)."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return group


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fedssl.plan.codegraph", description="the project's import graph"
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    cyc = sub.add_parser("cycles", help="print the library's import cycles (exit 1 if any)")
    cyc.add_argument(
        "--top-level",
        action="store_true",
        help="count only imports that run at module load (not those in functions)",
    )
    cyc.add_argument(
        "--with-types",
        action="store_true",
        help="count the type-only imports under `if TYPE_CHECKING:` too",
    )
    deps = sub.add_parser("deps", help="the project files the given modules import")
    deps.add_argument("modules", nargs="+")
    args = ap.parse_args(argv)
    if args.cmd == "deps":
        print("\n".join(code_files(*args.modules)))
        return 0
    graph = import_graph(top_level=args.top_level, with_types=args.with_types)
    found = cycles(graph)
    for group in found:
        print(f"{len(group)} modules: {' '.join(group)}")
        print(f"  e.g. {' -> '.join(circle(graph, group))}")
    kind = "module-level imports" if args.top_level else "all imports, lazy ones included"
    kind += ", type-only ones too" if args.with_types else ""
    print(f"{len(found)} import cycle(s) ({kind})", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
