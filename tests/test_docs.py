"""The documentation: its results pages match the committed reports, and every code block of
the README, the tutorials and the how-tos runs, as written, in a copy of the project.

A block says how it is tested in the comment above it:
``<!-- test: cheap -->`` (its lines run in the default suite), ``<!-- test: slow -->``
(``pytest -m slow``), ``<!-- test: file PATH -->`` (it is written to PATH, for the blocks
after it), ``<!-- test: excerpt PATH -->`` (it is a verbatim part of PATH, a file another
test runs), ``<!-- test: needs WHAT -->`` (it needs what a test machine lacks: a fresh clone,
a SLURM cluster). A block with no such comment fails the test."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedssl.reporting import docs
from tests.fixtures import REPO

pytestmark = pytest.mark.timeout(900)

PAGES = [
    REPO / "README.md",
    *sorted((REPO / "docs" / "tutorials").glob("*.md")),
    *sorted((REPO / "docs" / "how-to").glob("*.md")),
]
_BLOCK = re.compile(
    r"(?:<!-- test: (?P<mark>[^>]*?) -->\n)?```(?P<lang>\w*)[^\n]*\n(?P<body>.*?)```", re.S
)
RUNS = {"bash", "python", "yaml", "sh"}  # what a reader would run or write; text is output


@dataclass
class Block:
    page: str
    line: int
    lang: str
    mark: str
    body: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    return [
        Block(
            str(page.relative_to(REPO)),
            text.count("\n", 0, m.start()) + 1,
            m["lang"],
            (m["mark"] or "").strip(),
            m["body"],
        )
        for m in _BLOCK.finditer(text)
        if m["lang"] in RUNS
    ]


# ------------------------------------------------------------------ the results pages
def test_the_pages_match_the_committed_reports(monkeypatch):
    monkeypatch.chdir(REPO)
    assert docs.stale_pages() == [], "stale pages: run `fedssl docs` (make docs)"


def test_a_page_gets_its_tables_and_every_figure_of_its_report(tmp_path):
    report = tmp_path / "demo"
    report.mkdir()
    (report / "report.json").write_text('{"tables": {"linear": "| a |\\n|---|\\n| 1 |\\n"}}')
    for name in ("curves.png", "board.png"):
        (report / name).write_bytes(b"png")
    text = (
        "<!-- results: demo linear -->\nold\n<!-- /results -->\n"
        "<!-- figures: demo -->\nold\n<!-- /figures -->\n"
    )
    filled = docs.page_text(text, Path("results/demo.md"), tmp_path)
    assert filled == (
        "<!-- results: demo linear -->\n| a |\n|---|\n| 1 |\n<!-- /results -->\n"
        "<!-- figures: demo -->\n![demo: board](../reports/demo/board.png)\n\n"
        "![demo: curves](../reports/demo/curves.png)\n<!-- /figures -->\n"
    )
    with pytest.raises(FileNotFoundError, match="pipeline 'other'"):
        docs.page_text(text.replace("demo", "other"), Path("x.md"), tmp_path)


# ------------------------------------------------------------------ the code blocks
def test_every_block_says_how_it_is_tested():
    unmarked = [b.where for p in PAGES for b in blocks(p) if not b.mark]
    assert not unmarked, "blocks with no <!-- test: ... --> comment: " + ", ".join(unmarked)
    kinds = {b.mark.split()[0] for p in PAGES for b in blocks(p)}
    assert kinds <= {"cheap", "slow", "file", "excerpt", "needs"}, kinds


def test_excerpts_are_verbatim_parts_of_the_files_they_quote():
    for page in PAGES:
        for b in blocks(page):
            if b.mark.startswith("excerpt "):
                source = (REPO / b.mark.split()[1]).read_text()
                assert b.body in source, f"{b.where}: not a part of {b.mark.split()[1]}"


def clone(root: Path) -> Path:
    """The checkout's files (tracked and new, not ignored) in a git repository of their own
    at ``root``, so DVC's commands see what a fresh clone has, and the ``.venv`` that `make
    install` leaves (the one these tests run in)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], [*git, "commit", "-qm", "clone"]):
        subprocess.run(cmd, cwd=root, check=True)
    install_venv(root / ".venv")
    return root


def install_venv(venv: Path) -> None:
    """``venv``: this interpreter's virtual environment, or (when it runs in none) a folder
    whose ``bin/activate`` puts it on PATH as a venv's would."""
    if sys.prefix != sys.base_prefix and (Path(sys.prefix) / "bin" / "activate").is_file():
        venv.symlink_to(sys.prefix, target_is_directory=True)
        return
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(f'export PATH="{Path(sys.executable).parent}:$PATH"\n')


def bare_path() -> str:
    """PATH as a new shell has it: without the folders that hold the project's commands (the
    venv's bin), so a page must say how to get them."""
    dirs = os.environ["PATH"].split(os.pathsep)
    return os.pathsep.join(d for d in dirs if not (Path(d) / "fedssl").is_file())


# a line that sets up the reader's shell (`source .venv/bin/activate`): the page's later
# commands run after it, as they would in the reader's terminal
SETUP = re.compile(r"(source|\.) \S+")
README = REPO / "README.md"


def shell_of(page: Path) -> list[str]:
    """The setup lines a page's commands start from: none where the page starts from a fresh
    clone (README, the quick start); else the README's, which its reader has run."""
    if page == README or any(b.mark == "needs fresh-clone" for b in blocks(page)):
        return []
    return [c for b in blocks(README) for c in commands(b.body) if SETUP.fullmatch(c.strip())]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return clone(tmp_path_factory.mktemp("docs") / "project")


@pytest.fixture(scope="module")
def ran() -> set[str]:
    """The command lines that ran in the module's project."""
    return set()


def commands(body: str) -> list[str]:
    """A bash block's command lines (a here-document with the line that starts it)."""
    out, end = [], None
    for line in textwrap.dedent(body).splitlines():
        if end is not None:
            out[-1] += "\n" + line
            end = None if line == end else end
        elif line.strip() and not line.lstrip().startswith("#"):
            out.append(line)
            heredoc = re.search(r"<<'(\w+)'", line)
            end = heredoc[1] if heredoc else None
    return out


def run_blocks(page: Path, root: Path, slow: bool, done: set[str]) -> None:
    """Run a page's blocks in order in ``root``, each command line as written (one that
    already ran in ``root`` is not run again), in a new shell: after the page's setup lines
    (:func:`shell_of`) and those it gives itself."""
    env = {**os.environ, "PYTHONPATH": str(root), "PATH": bare_path(), "FEDSSL_THREADS": "1"}
    shell = shell_of(page)
    for b in blocks(page):
        kind, _, arg = b.mark.partition(" ")
        if kind in ("needs", "excerpt") or (kind == "slow" and not slow):
            continue  # excerpts: checked above
        if kind == "file":
            (root / arg).write_text(b.body)
            continue
        if b.lang == "python":
            proc = subprocess.run(
                [sys.executable, "-c", b.body], cwd=root, env=env, capture_output=True, text=True
            )
            assert proc.returncode == 0, f"{b.where}:\n{proc.stderr[-3000:]}"
            continue
        for cmd in commands(b.body):
            key = re.sub(r"\s+# .*$", "", cmd)  # the same command, whatever it says of itself
            if key in done and not SETUP.fullmatch(key.strip()):
                continue
            proc = subprocess.run(
                ["bash", "-c", "\n".join(["set -euo pipefail", *shell, cmd])],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
            )
            out = proc.stdout + proc.stderr
            assert proc.returncode == 0 and "Traceback" not in out, (
                f"{b.where}: {cmd}\n{out[-3000:]}"
            )
            done.add(cmd)
            if SETUP.fullmatch(key.strip()):
                shell.append(key)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_the_cheap_blocks_run_as_written(page, project, ran):
    if not any(b.mark == "cheap" for b in blocks(page)):
        pytest.skip("no cheap block")
    run_blocks(page, project, slow=False, done=ran)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a page trains the default FedSimCLR: 13-28 min on a loaded 2-core CPU
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_every_block_runs_as_written(page, tmp_path):
    if not any(b.mark == "slow" for b in blocks(page)):
        pytest.skip("no slow block")
    run_blocks(page, clone(tmp_path / "p"), slow=True, done=set())


# ------------------------------------------------------------------ what DVC shows
def dvc(root: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["dvc", *args], cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_root_dvc_views_show_the_default_pipeline(project):
    """`dvc metrics show` lists the default pipeline's runs (not every committed one), and
    `dvc plots show` draws its round log as the loss over rounds and each probe's test top-1
    over its epochs, offline."""
    metrics = json.loads(dvc(project, "metrics", "show", "--json"))[""]["data"]
    assert sorted(metrics) == [
        f"results/experiments/{e}/metrics.json"
        for e in ("fmnist_fedsimclr", "fmnist_pixels", "fmnist_random_init")
    ]
    shown = json.loads(dvc(project, "plots", "show", "--json"))
    assert not shown.get("errors"), shown["errors"]  # every declared plot is committed
    plots = shown["data"]
    rounds = plots["results/experiments/fmnist_fedsimclr/rounds.tsv"][0]["content"]
    assert rounds["encoding"]["x"]["field"] == "round"
    assert rounds["layer"][0]["encoding"]["y"]["field"] == "loss"
    probe = plots["results/experiments/fmnist_fedsimclr/linear_epochs.tsv"][0]["content"]
    assert (probe["encoding"]["x"]["field"], probe["layer"][0]["encoding"]["y"]["field"]) == (
        "epoch",
        "test_top1",
    )
    committed = json.loads(
        (project / "results/experiments/fmnist_fedsimclr/metrics.json").read_text()
    )
    assert float(probe["data"]["values"][-1]["test_top1"]) == committed["linear_top1"]
    assert "results/reports/default/curves.png" in plots
    # another pipeline's results, by path
    other = json.loads(
        dvc(project, "metrics", "show", "--json", "results/experiments/smoke_mfcl/metrics.json")
    )
    assert other[""]["data"]["results/experiments/smoke_mfcl/metrics.json"]["data"]
