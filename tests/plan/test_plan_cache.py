"""Planning pays only for what changed: what every preset's stages are named after (the owners
map) and what each code file imports are kept on disk, keyed by what they are computed from,
and recomputed as soon as that changes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fedssl.plan import codegraph
from tests.fixtures import in_project, make_tiny_project


@pytest.fixture
def counted_scouts(monkeypatch):
    """How many times the owners map is computed from every preset (not read from disk)."""
    from fedssl.plan.dag import Dag

    calls: list[str] = []
    compute = Dag._find_owners

    def counted(self):
        calls.append(self.pipeline)
        return compute(self)

    monkeypatch.setattr(Dag, "_find_owners", counted)
    return calls


def test_owners_are_kept_until_a_params_file_or_the_code_changes(tmp_path, counted_scouts):
    root = make_tiny_project(tmp_path, git=False)
    with in_project(root):
        from fedssl.plan.dag import OWNERS_CACHE, Dag

        assert OWNERS_CACHE.exists()  # planned once already, by `fedssl.pipeline write`
        OWNERS_CACHE.unlink()
        first = Dag("default").owners()
        assert counted_scouts == ["default"] and OWNERS_CACHE.exists()
        assert Dag("default").owners() == first and counted_scouts == ["default"]

        # a variant that differs only in its k-NN probe: new in the params, so the map is
        # recomputed; it owns only its own evaluation and shares the base's other stages
        Path("params/experiments/tiny_simclr_k3.yaml").write_text(
            "extends: tiny_simclr\ntitle: FedSimCLR, 3-NN\nknn: {k: 3}\n"
        )
        second = Dag("default").owners()
        assert len(counted_scouts) == 2
        added = {key: owner for key, owner in second.items() if key not in first}
        assert [kind for kind, _ in added] == ["evaluate"]
        assert set(added.values()) == {"tiny_simclr_k3"}
        assert {k: v for k, v in second.items() if k in first} == first
        assert Dag("default")._find_owners() == second  # what is kept is what is computed

        # the code decides what a stage reads: an edit of the library recomputes
        params_py = Path("fedssl/params.py")
        params_py.write_text(params_py.read_text() + "# an edit\n")
        assert Dag("default").owners() == second and len(counted_scouts) == 4

        # a damaged cache file is recomputed, not trusted
        OWNERS_CACHE.write_text("{not json")
        assert Dag("default").owners() == second and len(counted_scouts) == 5
        assert json.loads(OWNERS_CACHE.read_text())["owners"]


def test_the_import_graph_is_kept_by_file_content(tmp_path, monkeypatch):
    package = tmp_path / "fedssl"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from fedssl import b\n\n\ndef f():\n    import fedssl.c\n")
    (package / "b.py").write_text("import os\n")
    (package / "c.py").write_text("")
    monkeypatch.chdir(tmp_path)

    def fresh_process() -> None:  # forget what this process parsed and read
        codegraph.clear_cache()
        codegraph._known_imports.cache_clear()

    fresh_process()
    expected = ["fedssl/__init__.py", "fedssl/a.py", "fedssl/b.py", "fedssl/c.py"]
    assert codegraph.code_files("fedssl.a") == expected
    assert len(json.loads(codegraph.IMPORTS_CACHE.read_text())) == 4

    parsed: list[str] = []
    parse = codegraph._parse_imports
    monkeypatch.setattr(
        codegraph,
        "_parse_imports",
        lambda text, path, *a: parsed.append(path) or parse(text, path, *a),
    )
    fresh_process()
    assert codegraph.code_files("fedssl.a") == expected and parsed == []  # all from disk

    (package / "a.py").write_text("from fedssl import b\n")  # the lazy import is gone
    fresh_process()
    assert codegraph.code_files("fedssl.a") == expected[:3]
    assert parsed == [os.path.join("fedssl", "a.py")]  # only the edited file was parsed again
