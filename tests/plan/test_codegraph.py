"""The library's import graph: no cycles, method packages that only declare, a stage runtime
that does not reach the freshness rules or the dvc.yaml writer, and every hook a method names
resolves to a function."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedssl.methods import registry
from fedssl.methods.base import Method
from fedssl.methods.hooks import Hook, resolve_hook
from fedssl.plan import codegraph
from tests.fixtures import REPO

# Planning and stage-runtime modules a method must not import (types under TYPE_CHECKING and
# the exception in fedssl.stage.runtime excepted).
ABOVE_THE_METHODS = (
    "fedssl.plan",
    "fedssl.pipeline",
    "fedssl.stage.context",
    "fedssl.stage.base",
    "fedssl.presets",
    "fedssl.experiment",
    "fedssl.projected_costs",
    "stages",
)


@pytest.fixture(autouse=True)
def _at_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    codegraph.clear_cache()


@pytest.mark.parametrize(
    "top_level, with_types",
    [(False, False), (True, False), (False, True)],
    ids=["all imports", "module level", "type-only imports too"],
)
def test_the_library_has_no_import_cycle(top_level, with_types):
    """Type-only imports included: the method contract names the stage context's type through
    the ground-floor contract (fedssl.stage.contract), not through the stage runtime."""
    graph = codegraph.import_graph(top_level=top_level, with_types=with_types)
    assert "fedssl.plan.dag" in graph and "fedssl.methods.base" in graph
    assert codegraph.cycles(graph) == []


def test_the_cycles_command_finds_a_cycle_and_ignores_type_only_imports(
    tmp_path, monkeypatch, capsys
):
    pkg = tmp_path / "fedssl"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from fedssl import b\n")
    (pkg / "b.py").write_text("def f():\n    from fedssl.c import g\n")
    (pkg / "c.py").write_text("from fedssl.a import x\n")
    (pkg / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fedssl.e import T\n"
    )
    (pkg / "e.py").write_text("import fedssl.d\n")
    graph = codegraph.import_graph(tmp_path)
    assert codegraph.cycles(graph) == [["fedssl.a", "fedssl.b", "fedssl.c"]]
    assert codegraph.circle(graph, ["fedssl.a", "fedssl.b", "fedssl.c"]) == [
        "fedssl.a",
        "fedssl.b",
        "fedssl.c",
        "fedssl.a",
    ]
    assert codegraph.cycles(codegraph.import_graph(tmp_path, top_level=True)) == []
    monkeypatch.chdir(tmp_path)
    assert codegraph.main(["cycles"]) == 1
    assert "fedssl.a -> fedssl.b -> fedssl.c -> fedssl.a" in capsys.readouterr().out
    assert codegraph.main(["cycles", "--top-level"]) == 0
    assert codegraph.cycles(codegraph.import_graph(tmp_path, with_types=True)) == [
        ["fedssl.a", "fedssl.b", "fedssl.c"],
        ["fedssl.d", "fedssl.e"],
    ]


def test_nothing_under_methods_imports_planning_or_the_stage_runtime():
    graph = codegraph.import_graph()
    upward = {
        (m, i)
        for m, imported in graph.items()
        if m.startswith("fedssl.methods")
        for i in imported
        if i.startswith(ABOVE_THE_METHODS)
    }
    assert upward == set()


def method_packages() -> list[Path]:
    return sorted(p.parent for p in (REPO / "fedssl" / "methods").glob("*/__init__.py"))


@pytest.mark.parametrize("package", method_packages(), ids=lambda p: p.name)
def test_a_method_package_init_only_declares(package):
    """Its declaration reaches the shared declarations only: its training, report and cost
    code are named by typed hooks (module and attribute), so no stage depends on them by
    accident."""
    module = f"fedssl.methods.{package.name}"
    shared = {
        "fedssl/__init__.py",
        "fedssl/stage/__init__.py",  # the package of the three stage-runtime files below
        "fedssl/stage/contract.py",  # the step context's type and the step-input names
        "fedssl/params.py",
        "fedssl/stage/record.py",  # ParamsError, with the params files' reader (every stage's code)
        "fedssl/data/__init__.py",  # the data-set registry: facts that params validate against
        "fedssl/stage/runtime.py",  # the prepared-data store's ArtifactError (every stage's code)
        "fedssl/data/catalog.py",
        "fedssl/data/sets/__init__.py",  # where the registry finds the data sets, by name
        "fedssl/methods/__init__.py",
        "fedssl/methods/base.py",
        "fedssl/methods/hooks.py",  # the hooks' type, their protocols and their check
        "fedssl/methods/registry.py",
        f"fedssl/methods/{package.name}/__init__.py",
    }
    strategy_choice = {"fedssl/strategies/__init__.py", "fedssl/strategies/choices/__init__.py"}
    assert set(codegraph.code_files(module)) - strategy_choice == shared


def test_the_stage_runtime_reads_plan_records_not_the_planner():
    """A stage reads its plan record: the DAG, the import graph, the freshness rules and the
    dvc.yaml writer are no stage's code, nor is any data set's file but through its record."""
    runtime = set(codegraph.code_files(*(f"stages.{p.stem}" for p in REPO.glob("stages/*.py"))))
    assert "fedssl/stage/record.py" in runtime and "fedssl/plan/layout.py" in runtime
    for module in ("dag", "freshness", "dvcfile", "cli"):
        assert f"fedssl/plan/{module}.py" not in runtime
    assert not {"fedssl/pipeline.py", "fedssl/plan/codegraph.py"} & runtime
    assert not any(f.startswith("fedssl/data/sets/") and "__init__" not in f for f in runtime)


def test_the_prepare_stage_runs_by_its_record_alone():
    """Preparing Fashion-MNIST runs its stage script, the stage contract with the record it
    reads, and the data set's file (its reader) with the package file it builds on, and the
    store of the data: no presets, params models, data-set registry, planner, method, nor any
    other data set's reader (their edits rerun every other stage, not this one). The eight
    files of the bound issue 34 set, the package file the stage runtime's modules sit in (a
    docstring, since issue 49), and since issue 49 item 5 the reader in its data set's file
    beside the types it builds on (two files for the one the readers of all data sets shared):
    an eleventh needs a reason."""
    assert codegraph.code_files("stages.prepare_data", "fedssl.data.sets.fashion_mnist") == [
        "fedssl/__init__.py",
        "fedssl/data/__init__.py",  # the prepared-data artifact
        "fedssl/data/sets/__init__.py",  # a data set's file's types: Source, Split, the entry
        "fedssl/data/sets/fashion_mnist.py",  # its reader (the record names it) and entry
        "fedssl/stage/__init__.py",  # the stage runtime's package (a docstring)
        "fedssl/stage/base.py",  # the stage contract
        "fedssl/stage/record.py",  # the record, its hashes, the params files' raw values
        "fedssl/stage/runtime.py",  # atomic writes, the lock, the run's environment and machine
        "stages/__init__.py",
        "stages/prepare_data.py",
    ]


def test_a_data_sets_reader_reaches_no_other_data_set():
    """CIFAR-10's prepare stage runs the torchvision layouts' shared code and its own file:
    an edit of another data set's reader (Fashion-MNIST's, STL-10's) reruns none of it."""
    from fedssl.data.catalog import dataset_spec

    files = codegraph.code_files("stages.prepare_data", dataset_spec("cifar10").source_module)
    readers = [f for f in files if f.startswith("fedssl/data/")]
    assert readers == [
        "fedssl/data/__init__.py",
        "fedssl/data/sets/__init__.py",
        "fedssl/data/sets/_torchvision.py",
        "fedssl/data/sets/cifar10.py",
    ]


def declared_hooks(method: Method) -> list:
    hooks = [s.runner for s in method.steps if s.runner] + list(method.flower_steps.values())
    hooks += [
        h
        for h in (
            method.encoder_hook,
            method.client_costs_hook,
            method.projected_costs_hook,
            method.report_tables,
            method.report_figures,
        )
        if h
    ]
    return hooks


@pytest.mark.parametrize("method", registry.all(), ids=lambda m: m.name)
def test_every_declared_hook_is_a_function(method):
    for hook in declared_hooks(method):
        assert callable(resolve_hook(hook)), hook
    assert all(s.runner or callable(getattr(method, s.name, None)) for s in method.steps)


def test_the_growing_methods_run_each_growth_stage_through_one_runner():
    from fedssl.presets import Presets

    method = registry.get("lw_fedssl")
    exp = Presets(REPO / "params").load("experiment", "smoke_lw_fedssl")
    steps = method.steps_for(exp.method)
    assert [(s.name, s.runner, s.args) for s in steps] == [
        (f"grow_{s}", Hook("fedssl.methods.lwfedssl.run", "grow"), (s,))
        for s in range(1, exp.method.vit.depth + 1)
    ]
    assert method.hook_modules(exp.method, "grow_2") == ["fedssl.methods.lwfedssl.run"]
    assert method.hook_modules(exp.method, "costs") == ["fedssl.methods.lwfedssl.costs"]
    assert method.hook_modules(exp.method, "report") == ["fedssl.methods.lwfedssl.tables"]


def test_the_layers_contract_places_every_package_with_at_most_one_exception():
    """`lint-imports` checks only the packages its layers name: one left out (as the
    strategies once were, importing the engine that imported them) is outside the gate."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the backport Flower depends on
        import tomli as tomllib

    linter = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c for c in linter["contracts"] if c["id"] == "layers"]
    named = {m.strip() for layer in layers["layers"] for m in re.split(r"[:|]", layer)}
    assert unplaced(named) == set()
    assert len(layers.get("ignore_imports", [])) <= 1


def unplaced(named: set[str]) -> set[str]:
    """The library's top-level modules and packages that no layer names; a package whose modules
    sit on different layers (``fedssl.reporting``: its table cells low, its board a face) is
    placed when every one of its modules is named."""
    left = set()
    for p in (REPO / "fedssl").iterdir():
        name = f"fedssl.{p.stem}"
        if p.suffix == ".py" and p.stem != "__init__" and name not in named:
            left.add(name)
        elif (p / "__init__.py").exists() and name not in named:
            modules = {f"{name}.{q.stem}" for q in p.glob("*.py") if q.stem != "__init__"}
            left |= modules - named
    return left
