"""The data-set registry (fedssl/data/catalog.py): every entry agrees with what its reader
loads, the data-set files (fedssl/data/sets/) and the readers are the only places naming data
sets, and a new data set is one drop-in file (its entry and reader)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedssl.data.catalog import dataset_spec, datasets, load_dataset, missing_data
from tests.fixtures import REPO, make_tiny_project
from tests.formats import WRITERS

DATASETS = datasets()


def test_every_entry_has_a_fixture():
    missing = sorted(set(DATASETS) - set(WRITERS))
    assert not missing, f"no writer in tests/formats.py:WRITERS for {missing}"
    assert set(WRITERS) == set(DATASETS)


def test_the_how_to_names_what_a_new_data_set_needs():
    """A reader of the how-to learns every file the tests ask of a new data set: the writer
    of its fixture (the test above) besides its own file."""
    how_to = (REPO / "docs/how-to/add-a-data-set.md").read_text()
    assert "tests/formats.py:WRITERS" in how_to and "fedssl/data/sets/" in how_to


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_entry_agrees_with_its_reader(tmp_path, name):
    spec = DATASETS[name]
    assert missing_data(name, str(tmp_path)) is not None  # nothing there yet
    WRITERS[name](tmp_path)
    assert missing_data(name, str(tmp_path)) is None
    splits = load_dataset(name, str(tmp_path))
    assert {"train", "test"} <= set(splits)
    for split in splits.values():
        assert split.images.shape[1:] == spec.shape
        labelled = split.labels[split.labels >= 0]
        assert labelled.size == 0 or labelled.max() < spec.classes
    if name == "femnist":  # its fixture holds every class once per split
        assert int(splits["train"].labels.max()) + 1 == spec.classes


def test_missing_data_names_the_set_and_how_to_get_it(tmp_path):
    for name, spec in DATASETS.items():
        problem = missing_data(name, str(tmp_path / "empty"))
        assert name in problem and "To get it" in problem
        # a data set that downloads itself is not missing while planning
        assert (missing_data(name, str(tmp_path / "empty"), download=True) is None) == (
            spec.downloadable
        )


def test_listing_the_data_sets_imports_no_torch():
    """Each data-set file holds its reader: the registry imports them all to list the entries,
    so a reader imports torch or torchvision only when it reads (planning stays light)."""
    code = (
        "import sys; from fedssl.data.catalog import datasets; datasets(); "
        "sys.exit(sorted({'torch', 'torchvision'} & set(sys.modules)) or None)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_unknown_names_list_the_registry():
    with pytest.raises(ValueError, match="known data sets: cifar10, cifar100"):
        dataset_spec("imagenet21k")
    assert dataset_spec("Tiny-ImageNet") is DATASETS["tiny_imagenet"]


def test_params_accept_exactly_the_registered_names():
    from pydantic import ValidationError

    from fedssl.params import DatasetParams

    assert DatasetParams.model_json_schema()["properties"]["name"]["enum"] == list(DATASETS)
    with pytest.raises(ValidationError, match="name"):
        DatasetParams(name="imagenet21k")


def _string_literals(path: Path):
    """The string constants of a module other than its docstrings."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and ast.get_docstring(node, clean=False) is not None
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_only_the_registry_and_the_readers_name_data_sets():
    modules = {m for spec in DATASETS.values() for m in (spec.source_module, spec.module)}
    allowed = {f"{m.replace('.', '/')}.py" for m in modules}
    names = re.compile(r"\b(" + "|".join(DATASETS) + r")\b")
    found = [
        f"{path.relative_to(REPO)}:{line}: {text!r}"
        for package in ("fedssl", "stages")
        for path in sorted((REPO / package).rglob("*.py"))
        if path.relative_to(REPO).as_posix() not in allowed
        for line, text in _string_literals(path)
        if names.search(text)
    ]
    assert not found, "data sets named outside the registry:\n" + "\n".join(found)


# ------------------------------------------------------------------ a new data set, end to end
TOY_READER = '''"""Toy data set: stripes.npz under the root (train_x, train_y, test_x, test_y)."""

import os

import numpy as np

from fedssl.data.sets import DataNotFound, DatasetSpec, Source, Split, register


def _check(root):
    if not os.path.isfile(os.path.join(root, "stripes.npz")):
        raise DataNotFound(f"stripes not found at {root}. To get it: write stripes.npz there.")


def _load(root, download):
    _check(root)
    with np.load(os.path.join(root, "stripes.npz")) as z:
        return {s: Split(z[s + "_x"], z[s + "_y"]) for s in ("train", "test")}


STRIPES = Source(_load, _check)
'''
TOY_ENTRY = """
register(DatasetSpec("stripes", "Stripes", 3, (1, 8, 8), 60, "fedssl.data.sets.stripes:STRIPES"))
"""


def _stage(root: Path, kind: str, name: str) -> subprocess.CompletedProcess:
    """A stage as both front ends run it: ``python -m stages.<kind> <name>`` in the project."""
    return subprocess.run(
        [sys.executable, "-m", f"stages.{kind}", name],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "FEDSSL_DEVICE": "cpu", "FEDSSL_THREADS": "1"},
    )


@pytest.mark.timeout(600)
def test_a_new_data_set_is_one_drop_in_file(tmp_path):
    root = make_tiny_project(tmp_path, git=False)
    before = {p: p.read_bytes() for p in (root / "fedssl").rglob("*.py")}
    (root / "fedssl/data/sets/stripes.py").write_text(TOY_READER + TOY_ENTRY)
    after = {p: p.read_bytes() for p in (root / "fedssl").rglob("*.py")}
    changed = {p.relative_to(root).as_posix() for p in after if before.get(p) != after[p]}
    assert changed == {"fedssl/data/sets/stripes.py"}
    (root / "params/datasets/stripes.yaml").write_text("name: stripes\ndata_root: raw_stripes\n")
    (root / "params/partitions/stripes_iid_m3.yaml").write_text(
        "dataset: stripes\nnum_clients: 3\nscheme: {kind: iid}\nsubset: null\nseed: 0\n"
    )

    missing = _stage(root, "prepare_data", "stripes")
    assert missing.returncode != 0 and "write stripes.npz there" in missing.stderr

    rng = np.random.default_rng(0)
    (root / "raw_stripes").mkdir()
    np.savez(
        root / "raw_stripes/stripes.npz",
        train_x=rng.integers(0, 256, (60, 1, 8, 8), dtype=np.uint8),
        train_y=np.arange(60) % 3,
        test_x=rng.integers(0, 256, (9, 1, 8, 8), dtype=np.uint8),
        test_y=np.arange(9) % 3,
    )
    for kind, name in (("prepare_data", "stripes"), ("partition", "stripes_iid_m3")):
        proc = _stage(root, kind, name)
        assert proc.returncode == 0, proc.stderr[-3000:]
    prepared = json.loads((root / "artifacts/data/stripes/dataset.json").read_text())
    assert prepared["splits"]["train"]["shape"] == [1, 8, 8]
    assert prepared["splits"]["train"]["num_classes"] == 3
    with np.load(root / "artifacts/partitions/stripes_iid_m3/clients.npz") as z:
        clients = [z[f"client_{i}"] for i in range(3)]
    assert sorted(np.concatenate(clients).tolist()) == list(range(60))
    assert [len(c) for c in clients] == [20, 20, 20]

    # planning checks a partition against the entry's training size
    (root / "params/partitions/stripes_iid_m3.yaml").write_text(
        "dataset: stripes\nnum_clients: 3\nscheme: {kind: iid}\nsubset: 61\nseed: 0\n"
    )
    too_big = _stage(root, "partition", "stripes_iid_m3")
    assert too_big.returncode != 0 and "exceeds the 60" in too_big.stderr
