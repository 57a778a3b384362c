"""The project's own import graph, read from the source (nothing is imported or run).

A stage depends on every project file its entry module imports, directly or through other
project modules, including imports inside functions (the method plugins import their heavy code
lazily) and the packages' ``__init__`` files that such imports run. Both front ends take each
stage's code dependencies from here, so an edit anywhere a stage's code reaches reruns it in
DVC and Snakemake alike. Modules found dynamically (the method registry's discovery) are named
by the caller: a stage of an experiment also depends on its method's module.
"""
from __future__ import annotations

import ast
from functools import lru_cache
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


def _imported(path: Path, module: str, is_package: bool) -> set[str]:
    """Modules an import statement of ``path`` names (``from a import b`` also names ``a.b``,
    which is a module when such a file exists)."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                parent = package.split(".")
                parent = parent[:len(parent) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


@lru_cache(maxsize=None)
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
    return frozenset(seen)


def code_files(*modules: str, root: Path = Path(".")) -> list[str]:
    """Every project file the given modules reach, sorted (posix paths relative to root)."""
    files: set[str] = set()
    for m in modules:
        files |= _closure(m, str(root))
    return sorted(Path(f).relative_to(root).as_posix() if Path(f).is_absolute() else
                  Path(f).as_posix() for f in files)


def clear_cache() -> None:
    """Forget the graph (after code edits within one process, e.g. in tests)."""
    _closure.cache_clear()
