"""The project's tree as ``docs/reference/layout.md`` shows it, generated: every top-level item of
the repository and of the library, the library's parts described by the first sentence of their
own docstrings (read from the source, nothing imported), so the page cannot miss a part or say
what its code no longer does. ``fedssl docs`` refills the page's ``<!-- layout -->`` block."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

# What the repository's items outside the library are (they have no docstring to read). Every
# top-level item git tracks must be here or be the library: a test compares them.
REPOSITORY = {
    "Snakefile": "rules, built from the DAG in fedssl/plan/dag.py",
    "dvc.yaml": "generated from the same DAG (pipelines/<name>/dvc.yaml for other pipelines)",
    "dvc.lock": "DVC's record of the default pipeline's last run",
    "params/": "YAML: datasets/, partitions/, experiments/ presets, grids.yaml, pipelines.yaml",
    "schemas/": "JSON Schemas generated from the pydantic models (`fedssl schemas`)",
    "stages/": "one thin script per kind of stage: validate params, call the library, write "
    "outputs (method.py runs any step a method declares)",
    "pipelines/": "each pipeline's plan records (pipelines/plan/ for the default one)",
    "results/": "small result files committed with the code: metrics, round logs, reports",
    "artifacts/": "every other stage output (git-ignored, DVC-tracked)",
    "tests/": "the test suite (tiny data; the Snakemake/DVC front ends for real)",
    "benchmarks/": "speed comparisons (not tests); the board's budget measurements; mutants",
    "profiles/": "Snakemake profiles: the default one (read by plain `snakemake`) and SLURM's",
    "docs/": "the documentation site (`make docs`; docs/hooks.py writes the generated pages)",
    "mkdocs.yml": "the site's configuration",
    "Makefile": "install, run, test, lint, docs, benchmarks",
    "pyproject.toml": "the package, ruff's rules and their exemptions, the import layers",
    "README.md": "what the project does, its results table (from the default report)",
    ".ci/": "the CI job: install from scratch, then `make test`",
    ".dvc/": "DVC's configuration",
    ".dvcignore": "what DVC does not track",
    ".gitignore": "what git does not track",
}
WIDTH = 98
NAME_COLUMN = 19
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def summary(path: Path) -> str:
    """The first sentence of a module's docstring (a package's: its ``__init__``'s), in plain
    text; a part without one is refused, naming its file."""
    doc = ast.get_docstring(ast.parse(path.read_text()))
    if not doc:
        raise ValueError(f"{path}: no docstring (the layout page describes it from its docstring)")
    text = " ".join(doc.split("\n\n")[0].split())
    text = _ROLE.sub(lambda m: m.group(1).lstrip("."), text).replace("``", "`")
    sentence = re.match(r"(.+?\.)(?=\s+[^a-z]|$)", text)  # not at "e.g. a"
    return (sentence.group(1) if sentence else text).rstrip(".")


def parts(package: Path) -> list[tuple[str, Path, list[str]]]:
    """The library's top-level parts: (name as listed, the file describing it, its modules)."""
    found = []
    for p in sorted(package.iterdir()):
        if p.suffix == ".py" and p.stem != "__init__":
            found.append((p.name, p, []))
        elif (p / "__init__.py").exists():
            modules = sorted(
                q.stem if q.suffix else f"{q.name}/"
                for q in p.iterdir()
                if (q.suffix == ".py" and q.stem not in ("__init__", "__main__"))
                or (q / "__init__.py").exists()
            )
            found.append((f"{p.name}/", p / "__init__.py", modules))
    return found


def _entry(name: str, text: str, indent: str) -> str:
    first = f"{indent}{name}".ljust(NAME_COLUMN + len(indent))
    lines = textwrap.wrap(text, WIDTH - len(first), break_on_hyphens=False) or [""]
    pad = " " * len(first)
    return "\n".join([first + lines[0], *(pad + line for line in lines[1:])])


def tree(root: Path = Path(".")) -> str:
    """The layout page's block: the repository's items, then the library's parts."""
    out = [_entry(name, what, "") for name, what in REPOSITORY.items()]
    out.append(_entry("fedssl/", summary(root / "fedssl/__init__.py"), ""))
    for name, path, modules in parts(root / "fedssl"):
        text = summary(path) + (f" [{', '.join(modules)}]" if modules else "")
        out.append(_entry(name, text, "  "))
    return "```\n" + "\n".join(out) + "\n```\n"


_BLOCK = re.compile(r"(<!-- layout -->\n)(.*?)(<!-- /layout -->)", re.S)


def fill_blocks(text: str, root: Path = Path(".")) -> str:
    """``text`` with its ``<!-- layout -->`` block (if any) refilled from the tree."""
    return _BLOCK.sub(lambda m: m.group(1) + tree(root) + m.group(3), text)
