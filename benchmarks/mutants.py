"""Mutation check of the methods' defining rules (``make mutants``, opt-in).

Each mutant in ``benchmarks/mutants.yaml`` is one line of one file changed so that a defining
rule breaks (a sign, an index, a detach, a dropped term, a weight made uniform): a method
silently becoming another. The script copies the working tree once into a temporary folder,
applies each mutant there in turn, runs only the tests named to kill it, restores the file,
and reports the mutants whose tests still pass (survivors). It first runs every named test on
the unmutated copy: a killing test must pass on the real code.

    python benchmarks/mutants.py                 # every mutant
    python benchmarks/mutants.py -k scaffold     # those whose rule or file contains "scaffold"
    python benchmarks/mutants.py --list          # the table: rule, file, killing tests

Exit status 1 when a mutant survives, a mutant's original line is not found exactly once, or a
killing test fails on the real code. A new method adds its rules' mutants to the YAML file.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PYTEST_ARGS = ("-q", "-x", "-p", "no:cacheprovider")
MUTANTS = REPO / "benchmarks" / "mutants.yaml"


@dataclass(frozen=True)
class Mutant:
    rule: str
    file: str
    original: str
    mutated: str
    tests: tuple[str, ...]
    within: str = ""  # a function the line is in, where the line appears more than once

    def apply(self, text: str) -> str:
        """``text`` with the one line holding ``original`` (in ``def within``) changed to hold
        ``mutated``."""
        lines = text.splitlines(keepends=True)
        hits = [i for i, line in enumerate(lines) if self.original in line]
        if self.within:
            start = [i for i, line in enumerate(lines) if f"def {self.within}(" in line]
            end = [
                i
                for i, line in enumerate(lines)
                if start and i > start[0] and (line[:1].isalpha() or line[:1] == "@")
            ]
            hits = [i for i in hits if start and start[0] < i < (end[:1] or [len(lines)])[0]]
        if len(hits) != 1:
            where = f" in def {self.within}" if self.within else ""
            raise ValueError(
                f"{self.file}: {self.original!r} is on {len(hits)} lines{where}, not 1"
            )
        lines[hits[0]] = lines[hits[0]].replace(self.original, self.mutated)
        return "".join(lines)


def load(path: Path = MUTANTS) -> list[Mutant]:
    raw = yaml.safe_load(path.read_text())
    out = []
    for i, m in enumerate(raw):
        missing = {"rule", "file", "original", "mutated", "tests"} - set(m)
        if missing:
            raise ValueError(f"{path}: mutant {i} lacks {sorted(missing)}")
        if m["original"] == m["mutated"]:
            raise ValueError(f"{path}: mutant {i} ({m['rule']}) changes nothing")
        fields = (m["rule"], m["file"], m["original"], m["mutated"], tuple(m["tests"]))
        out.append(Mutant(*fields, m.get("within", "")))
    return out


def copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked and untracked, not ignored) into ``dest``."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True, text=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    (dest / ".venv").symlink_to((REPO / ".venv").resolve())


def passes(tree: Path, tests: tuple[str, ...]) -> bool:
    """Whether the ``tests`` pass in ``tree`` (its code first on the path). pytest runs in a
    child forked from this process, which has imported torch and the other third-party
    libraries once (a fresh interpreter per mutant spends most of its time importing them);
    the child imports the project's modules afresh, from ``tree``."""
    if not hasattr(os, "fork"):
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [sys.executable, "-m", "pytest", *PYTEST_ARGS, *tests]
        return subprocess.run(cmd, cwd=tree, env=env, capture_output=True).returncode == 0
    pid = os.fork()
    if pid == 0:  # the child: quiet, in the tree, the project's modules from the tree
        code = 1
        try:
            log = os.open(os.devnull, os.O_WRONLY)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.chdir(tree)
            sys.path.insert(0, str(tree))
            sys.dont_write_bytecode = True
            import pytest

            code = int(pytest.main([*PYTEST_ARGS, *tests]))
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1] == 0


def warm_up() -> None:
    """Import what every test imports and no mutant changes (never the project's modules)."""
    import matplotlib

    matplotlib.use("Agg")
    import hypothesis  # noqa: F401
    import matplotlib.pyplot  # noqa: F401
    import numpy  # noqa: F401
    import pydantic  # noqa: F401
    import pytest  # noqa: F401
    import torch  # noqa: F401
    import torch.func  # noqa: F401

    assert not [m for m in sys.modules if m.split(".")[0] in ("fedssl", "tests", "stages")]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-k", default="", help="only mutants whose rule or file contains this (a|b: either)"
    )
    parser.add_argument("--list", action="store_true", help="print the table and stop")
    args = parser.parse_args(argv)
    wanted = args.k.lower().split("|")
    mutants = [m for m in load() if any(w in (m.rule + m.file).lower() for w in wanted)]
    if args.list:
        for m in mutants:
            print(f"{m.rule}\t{m.file}\t{m.original} -> {m.mutated}\t{' '.join(m.tests)}")
        return 0
    failures = []
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        for m in mutants:  # every mutant applies to the real code before anything runs
            try:
                m.apply((tree / m.file).read_text())
            except (ValueError, FileNotFoundError) as e:
                failures.append(f"unapplicable: {m.rule}: {e}")
        tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
        warm_up()
        if not passes(tree, tests):
            failures.append(f"the killing tests fail on the real code: pytest {' '.join(tests)}")
        if failures:
            print("\n".join(failures))
            return 1
        survivors = []
        for i, m in enumerate(mutants, 1):
            path = tree / m.file
            real = path.read_text()
            path.write_text(m.apply(real))
            start = time.perf_counter()
            try:
                survived = passes(tree, m.tests)
            finally:
                path.write_text(real)
            verdict = "SURVIVED" if survived else "killed"
            print(
                f"[{i}/{len(mutants)}] {verdict:8} {time.perf_counter() - start:5.1f} s  {m.rule}"
            )
            if survived:
                survivors.append(m)
    print(f"{len(mutants)} mutants, {len(survivors)} survivors")
    for m in survivors:
        print(f"  survivor: {m.rule} ({m.file}: {m.original!r} -> {m.mutated!r})")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
