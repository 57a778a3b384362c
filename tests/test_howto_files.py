"""Each how-to that adds something (an evaluation, a data set, a method, a strategy) lists the
files a reader touches under "## The files you touch". This test follows each how-to on a
scratch copy of the repository: it writes the how-to's example where the how-to says, runs the
generators and the checks the how-to names, and compares the files that changed with the list,
so the list can neither miss a file the project asks for (a fixture writer, a line in a
registry) nor name one it does not need."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import REPO

pytestmark = pytest.mark.timeout(600)

HOW_TO = REPO / "docs/how-to"
# written by the generators a how-to runs (`make generate`), not by the reader
GENERATED = ("schemas/", "dvc.yaml", "pipelines/", "artifacts/", ".snakemake/")


def listed(page: str) -> set[str]:
    """The paths of the how-to's "The files you touch" list."""
    assert "## The files you touch\n" in page, "the how-to has no list of the files you touch"
    section = page.split("## The files you touch\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^- `([^`]+)`", section, re.M))


def scratch(tmp_path: Path) -> Path:
    """The repository's tracked files, copied (the reader's checkout)."""
    root = tmp_path / "repo"
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, tracked.split("\0")):
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    return root


def contents(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and ".pytest_cache" not in p.parts
    }


def run(root: Path, *argv: str) -> str:
    proc = subprocess.run(
        [sys.executable, *argv],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root), "FEDSSL_DEVICE": "cpu", "FEDSSL_THREADS": "1"},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc.stdout


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path}: the how-to's anchor {old!r} moved"
    path.write_text(text.replace(old, new))


# ---------------------------------------------------------------- each how-to, followed
def an_evaluation(root: Path) -> dict[str, str]:
    shutil.copy(REPO / "tests/toy_evaluation.py", root / "fedssl/evaluations/client_balance.py")
    run(root, "-m", "fedssl.pipeline", "write")
    assert "python -m stages.evaluation client_balance" in (root / "dvc.yaml").read_text()
    return {"<kind>": "client_balance"}


def a_data_set(root: Path) -> dict[str, str]:
    from tests.data.test_datasets import TOY_ENTRY, TOY_READER

    (root / "fedssl/data/sets/stripes.py").write_text(TOY_READER + TOY_ENTRY)
    (root / "params/datasets/stripes.yaml").write_text("name: stripes\ndata_root: raw_stripes\n")
    edit(
        root / "tests/formats.py",
        "\nWRITERS = {",
        "\ndef write_stripes(root):\n    import numpy as np\n\n"
        '    x = np.zeros((6, 1, 8, 8), "uint8")\n'
        '    y = np.arange(6) % 3\n    np.savez(f"{root}/stripes.npz", train_x=x, train_y=y, '
        'test_x=x, test_y=y)\n\n\nWRITERS = {\n    "stripes": write_stripes,',
    )
    # the project's own checks of a data set: a fixture writer, the entry against its reader
    run(root, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
        "tests/data/test_datasets.py", "-k", "fixture or stripes or registry")  # fmt: skip
    return {"<name>": "stripes"}


def a_method(root: Path) -> dict[str, str]:
    shutil.copy(REPO / "tests/toy_method.py", root / "fedssl/methods/toy.py")
    (root / "params/experiments/my_toy.yaml").write_text(
        "title: Toy AE\npartition: fmnist_dir01_m10\nmethod: {name: toy, dim: 16, rounds: 2}\n"
        "features: {layer: backbone}\nlinear_probe: {epochs: 30, lr: 0.01}\nknn: {k: 20}\n"
    )
    with (root / "params/pipelines.yaml").open("a") as f:
        f.write("  toy: [fmnist_pixels, my_toy]\n")
    (root / "tests/methods/test_toy.py").write_text(
        "from fedssl.methods import registry\n\n\ndef test_toy_is_registered():\n"
        '    assert registry.get("toy").label == "Toy AE"\n'
    )
    run(root, "-m", "fedssl.experiment")
    run(root, "-m", "fedssl.pipeline", "write", "toy")
    return {"<name>": "toy", "<experiment>": "my_toy"}


def a_strategy(root: Path) -> dict[str, str]:
    shutil.copy(REPO / "tests/strategies/toy_strategy.py", root / "fedssl/strategies/fedavgm.py")
    test = (REPO / "tests/strategies/test_toy_strategy.py").read_text()
    test = test.replace("tests.strategies.toy_strategy", "fedssl.strategies.fedavgm")
    (root / "tests/strategies/test_fedavgm.py").write_text(test)
    (root / "fedssl/strategies/choices/fedavgm.py").write_text(
        '"""FedAvgM as a params choice."""\n\nfrom typing import Literal\n\n'
        "from fedssl.strategies.choices import StrategyParams, register\n\n\n@register\n"
        'class FedAvgMParams(StrategyParams):\n    """FedAvg with server momentum."""\n\n'
        '    kind: Literal["fedavgm"] = "fedavgm"\n    beta: float = 0.9\n'
        '    title = "FedAvgM"\n\n    def mixin(self) -> type:\n'
        "        from fedssl.strategies.fedavgm import FedAvgM\n\n        return FedAvgM\n\n"
        '    def options(self, block) -> dict:\n        return {"beta": self.beta}\n'
    )
    run(root, "-m", "fedssl.experiment")
    assert '"fedavgm"' in (root / "schemas/experiment.schema.json").read_text()
    run(root, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
        "tests/strategies/test_fedavgm.py")  # fmt: skip
    return {"<name>": "fedavgm"}


HOW_TOS = {
    "add-an-evaluation.md": an_evaluation,
    "add-a-data-set.md": a_data_set,
    "add-a-method.md": a_method,
    "add-a-strategy.md": a_strategy,
}


@pytest.mark.parametrize("page", sorted(HOW_TOS))
def test_following_the_how_to_touches_exactly_the_files_it_lists(page, tmp_path):
    root = scratch(tmp_path)
    before = contents(root)
    names = HOW_TOS[page](root)
    after = contents(root)
    changed = {p for p in after if before.get(p) != after[p] and not p.startswith(GENERATED)}
    wanted = set()
    for path in listed((HOW_TO / page).read_text()):
        for placeholder, name in names.items():
            path = path.replace(placeholder, name)
        wanted.add(path)
    assert changed == wanted


def test_every_how_to_that_adds_something_is_followed():
    adds = {p.name for p in HOW_TO.glob("add-*.md")}
    assert adds == set(HOW_TOS)
