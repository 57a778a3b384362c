"""Params validation, presets and grids, generated files kept in sync, and the DAG's shape."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from fedssl import params as P
from fedssl.experiment import json_schemas
from fedssl.methods import registry
from fedssl.plan.dag import Dag
from fedssl.plan.dvcfile import generated_files
from fedssl.presets import Presets, deep_merge
from tests.fixtures import REPO, make_tiny_project, run


def test_json_schemas_are_up_to_date():
    for name, text in json_schemas().items():
        path = REPO / "schemas" / name
        assert path.exists() and path.read_text() == text, f"{path} is stale: run `make generate`"


def test_dvc_files_are_generated_from_the_dag(monkeypatch):
    """The dvc.yaml files and the stages' plan records, and no record of a stage gone."""
    monkeypatch.chdir(REPO)
    files = generated_files()
    for path, text in files.items():
        assert (REPO / path).read_text() == text, f"{path} is stale: run `make generate`"
    records = {p.relative_to(REPO) for p in (REPO / "pipelines/plan").glob("*.json")}
    assert records == {p for p in files if p.suffix == ".json"}, "run `make generate`"


def schema(kind: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        json.loads((REPO / "schemas" / f"{kind}.schema.json").read_text())
    )


def shipped_files():
    for kind, sub in (
        ("dataset", "datasets"),
        ("partition", "partitions"),
        ("experiment", "experiments"),
    ):
        for path in sorted((REPO / "params" / sub).glob("*.yaml")):
            yield kind, path
    yield "grids", REPO / "params" / "grids.yaml"
    yield "pipelines", REPO / "params" / "pipelines.yaml"


@pytest.mark.parametrize("kind, path", list(shipped_files()), ids=lambda x: getattr(x, "name", x))
def test_the_schemas_accept_every_shipped_file_as_written(kind, path):
    """What an editor checks with the generated schemas: no false errors on the project's own
    files, presets that extend others included."""
    errors = [e.message for e in schema(kind).iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


@pytest.mark.parametrize(
    "kind, doc",
    [
        ("experiment", {"extends": "smoke_mfcl", "method": {"client_module": {"nrom": "gn"}}}),
        ("experiment", {"extends": "smoke_mfcl", "titel": "x"}),
        ("experiment", {"title": "no method", "partition": "p"}),
        ("partition", {"dataset": "fashion_mnist", "num_clients": 0, "scheme": {"kind": "iid"}}),
        ("pipelines", {"pipelines": {"default": "not a list"}}),
    ],
)
def test_the_schemas_reject_what_validation_rejects(kind, doc):
    assert list(schema(kind).iter_errors(doc)), doc


def test_every_shipped_preset_and_grid_member_is_valid(monkeypatch):
    monkeypatch.chdir(REPO)
    presets = Presets()
    for kind in ("dataset", "partition", "experiment"):
        names = presets.names(kind)
        assert names
        for name in names:
            presets.load(kind, name)
    for pipe in presets.pipelines().pipelines:
        assert f"report__{pipe}" in Dag(pipe, presets=presets).stages


def test_paper_grids_expand_into_stable_names(monkeypatch):
    monkeypatch.chdir(REPO)
    presets = Presets()
    names = presets.names("experiment")
    for norm in ("tn", "gn", "bn"):
        for xi in ("dir001", "dir01", "dir05", "dir200"):
            assert f"cifar10_mfcl_{norm}_{xi}" in names and f"tiny_mfcl_{norm}_{xi}" in names
    exp = presets.load("experiment", "cifar100_mfcl_gn_dir05")
    assert exp.partition == "cifar100_dir05_m100" and exp.method.client_module.norm == "gn"
    assert exp.title == "MFCL(GN) ResNet-18 CIFAR-100 xi=0.5"
    assert presets.load("partition", "cifar100_dir05_m100").scheme.alpha == 0.5
    assert presets.pipeline_experiments("paper_cifar10_mfcl")[:2] == [
        "cifar10_mfcl_tn_dir001",
        "cifar10_mfcl_tn_dir01",
    ]
    # MFCL and FedSimCLR rows (44), then FedAvg / FedProx / MOON and FSL on 3 data sets x 4 xi,
    # then FedBYOL / FedEMA / FedU, Orchestra and FeatARC on 3 data sets x 4 xi
    assert len(presets.pipeline_experiments("paper_mfcl_tab2")) == 44 + 4 * 3 * 4 + 5 * 3 * 4


def test_shared_upstream_stages_exist_once(monkeypatch):
    monkeypatch.chdir(REPO)
    dag = Dag("default")
    kinds = [s.kind for s in dag.stages.values()]
    assert kinds.count("prepare_data") == 1 and kinds.count("partition") == 1
    assert kinds.count("pretrain") == len(dag.experiments) >= 3
    # the compute stages are each experiment's pretrain, features and evaluate; a stage whose
    # content another pipeline's experiment shares is named after its owner (the random-init
    # pretrain after the board's bench_random_init), the rest after the experiment itself
    mine = {
        s
        for e in dag.experiments
        for s in dag.of_experiment[e]
        if dag.stages[s].kind in ("pretrain", "features", "evaluate")
    }
    assert {s.name for s in dag.stages.values() if s.gpu} == mine
    assert len(mine) == 3 * len(dag.experiments)
    assert "pretrain__bench_random_init" in mine and "features__fmnist_random_init" in mine


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    root = make_tiny_project(tmp_path, git=False)
    monkeypatch.chdir(root)
    return root


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize(
    "file, old, new, field",
    [
        (
            "experiments/tiny_simclr.yaml",
            "temperature: 0.5",
            "temperature: 0.5\n  temprature: 1",
            "method.fedsimclr.temprature",
        ),
        (
            "experiments/tiny_simclr.yaml",
            "rounds: 2",
            "rounds: two",
            "method.fedsimclr.federation.rounds",
        ),
        ("experiments/tiny_simclr.yaml", "name: fedsimclr", "name: fedsimclrr", "method"),
        ("partitions/tiny_dir05_m3.yaml", "alpha: 0.5", "alpha: 0", "scheme.dirichlet.alpha"),
        ("partitions/tiny_dir05_m3.yaml", "alpha: 0.5", "alpha: -0.1", "scheme.dirichlet.alpha"),
        ("partitions/tiny_dir05_m3.yaml", "num_clients: 3", "num_clients: 70000", "num_clients"),
        (
            "experiments/tiny_simclr.yaml",
            "crop_scale: [0.5, 1.0]",
            "crop_scale: [0.9, 0.5]",
            "crop_scale",
        ),
        ("experiments/tiny_random.yaml", "knn: {k: 5, temperature: 0.1}", "", "knn"),
        (
            "experiments/tiny_pixels.yaml",
            "name: none",
            "name: fedsimclr\n  federation: {rounds: 1}",
            "pixels",
        ),
    ],
)
def test_bad_params_name_file_and_field(tiny, file, old, new, field):
    edit(tiny / "params" / file, old, new)
    with pytest.raises(P.ParamsError) as err:
        Dag("default")
    message = str(err.value)
    assert file in message and field in message, message


def test_a_stage_with_bad_params_stops_before_compute(tiny):
    edit(tiny / "params" / "partitions" / "tiny_dir05_m3.yaml", "alpha: 0.5", "alpha: 0")
    proc = run(["python", "-m", "stages.partition", "tiny_dir05_m3"], tiny, check=False)
    assert proc.returncode == 2
    assert "tiny_dir05_m3.yaml" in proc.stderr and "alpha" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tiny / "artifacts" / "partitions").exists()


def test_missing_data_set_says_how_to_get_it(tiny):
    (tiny / "params" / "datasets" / "tiny.yaml").write_text(
        "name: fashion_mnist\ndata_root: nowhere\ndownload: false\n"
    )
    proc = run(["python", "-m", "stages.prepare_data", "tiny"], tiny, check=False)
    assert proc.returncode == 2
    assert "apt-get install dataset-fashion-mnist" in proc.stderr
    assert not (tiny / "artifacts" / "data" / "tiny").exists()


def test_unknown_pipeline_is_named(tiny):
    with pytest.raises(P.ParamsError, match="no pipeline 'nope'"):
        Dag("nope")


def add_variant(root: Path, name: str, body: str) -> None:
    (root / "params" / "experiments" / f"{name}.yaml").write_text(body)
    with open(root / "params" / "pipelines.yaml", "a") as f:
        f.write(f"  variants: [{name}]\n")


def test_extends_merges_over_the_base_and_tracks_every_file(tiny):
    add_variant(
        tiny, "tiny_simclr_t01", "extends: tiny_simclr\ntitle: cooler\nmethod: {temperature: 0.1}\n"
    )
    presets = Presets()
    base = presets.load("experiment", "tiny_simclr")
    child = presets.load("experiment", "tiny_simclr_t01")
    assert child.method.temperature == 0.1 and child.title == "cooler"
    assert child.method.model_dump(exclude={"temperature"}) == base.method.model_dump(
        exclude={"temperature"}
    )  # nested mappings merge: the rest of `method` is inherited
    assert child.linear_probe == base.linear_probe
    stage = Dag("variants").stages["pretrain__tiny_simclr_t01"]
    assert stage.params == {  # DVC params: each file with the keys it sets itself
        "params/experiments/tiny_simclr_t01.yaml": ["method", "extends"],
        "params/experiments/tiny_simclr.yaml": ["partition", "method"],
    }
    assert Dag("variants").stages["evaluate__tiny_simclr_t01"].params == {
        "params/experiments/tiny_simclr_t01.yaml": ["extends"],
        "params/experiments/tiny_simclr.yaml": ["linear_probe", "knn"],
    }
    # an edit of the base reruns the variant (same fingerprint inputs as a plain file)
    before = Dag("variants").fingerprint("pretrain__tiny_simclr_t01")
    edit(tiny / "params/experiments/tiny_simclr.yaml", "rounds: 2", "rounds: 3")
    assert Dag("variants").fingerprint("pretrain__tiny_simclr_t01") != before


@pytest.mark.parametrize(
    "body, message",
    [
        ("extends: nope\n", "no preset 'nope'"),
        ("extends: tiny_loop\n", "cycle tiny_loop -> tiny_loop"),
        ("extends: tiny_simclr\nmethod: {temperature: -1}\n", "method.fedsimclr.temperature"),
        ("extends: [tiny_simclr]\n", "expected the name of a preset"),
    ],
)
def test_bad_extends_is_named(tiny, body, message):
    add_variant(tiny, "tiny_loop", body)
    with pytest.raises(P.ParamsError, match=message) as err:
        Dag("variants")
    assert "tiny_loop.yaml" in str(err.value)


@pytest.mark.parametrize(
    "method, old, says",
    [
        (
            "{name: supervised, variant: fedprox, mu: 0.01}",
            "variant: 'fedprox'",
            "strategy: {kind: fedprox, mu: 0.01}",
        ),
        ("{name: mpfedcon, variant: fedprox}", "variant: 'fedprox'", "{kind: fedprox, mu: 0.1}"),
        ("{name: mpfedcon, variant: fedavg, prox_mu: 0.3}", "prox_mu", "{kind: fedprox, mu: 0.3}"),
    ],
)
def test_a_params_file_with_retired_fedprox_settings_is_told_the_new_field(tiny, method, old, says):
    """``variant: fedprox`` and ``prox_mu`` retired for the library's FedProx: an old file
    fails with the file, the retired setting and the field to write instead."""
    add_variant(tiny, "tiny_old", f"extends: tiny_simclr\nmethod: {method}\n")
    with pytest.raises(P.ParamsError) as err:
        Dag("variants")
    message = str(err.value)
    assert "tiny_old.yaml" in message and f"{old}: retired" in message, message
    assert f"variant: fedavg and federation.strategy: {says.removeprefix('strategy: ')}" in message


@pytest.mark.parametrize(
    "method, moved",
    [
        ("{rounds: 1}", "rounds"),
        ("{lr: 0.1, strategy: {kind: fedprox, mu: 0.01}}", "lr, strategy"),
        ("{name: supervised, variant: fedavg, local_epochs: 2}", "local_epochs"),
    ],
)
def test_a_params_file_with_federation_settings_at_the_old_path_is_told_the_new_one(
    tiny, method, moved
):
    """The federation settings moved from the method's top level into ``method.federation``:
    an old file fails before compute, naming the file, the setting and its new path."""
    add_variant(tiny, "tiny_old", f"extends: tiny_simclr\nmethod: {method}\n")
    with pytest.raises(P.ParamsError) as err:
        Dag("variants")
    message = str(err.value)
    assert "tiny_old.yaml" in message and f"{moved}: moved into the federation block" in message
    first = moved.split(",")[0]
    assert f"write method.federation.{first}" in message, message


@pytest.mark.parametrize(
    "method, old, new",
    [
        ("lw_fedssl", "schedule", "method.federation"),
        ("fedmoco", "schedule", "method.federation"),
        ("mocosfl", "training", "method.federation"),
        ("cpcfl", "cfl", "method.federation"),
        ("mfcl", "phase1", "method.phases.phase1.federation"),
    ],
)
def test_a_federation_block_under_its_old_name_is_told_the_new_path(method, old, new):
    """LW-FedSSL's family ``schedule``, MocoSFL's ``training`` and CP-CFL's ``cfl`` became
    ``method.federation``, MFCL's ``phase1`` ``method.phases.phase1.federation``: the old name
    fails before any other check, naming the new path."""
    with pytest.raises(ValueError, match=f"{old}: renamed; write {new} "):
        registry.get(method).params.model_validate({"name": method, old: {"rounds": 1}})


def test_deep_merge_replaces_lists_and_scalars():
    assert deep_merge({"a": {"b": 1, "c": [1, 2]}, "d": 1}, {"a": {"c": [3]}, "d": {"e": 2}}) == {
        "a": {"b": 1, "c": [3]},
        "d": {"e": 2},
    }


def test_a_sweep_pipeline_names_its_column_and_bad_paths_are_named(tiny):
    with open(tiny / "params" / "pipelines.yaml", "a") as f:
        f.write("  sweep: {column: method.temperature, experiments: [tiny_simclr]}\n")
    dag = Dag("sweep")
    assert dag.column == "method.temperature" and dag.experiments == ["tiny_simclr"]
    assert dag.stages["report__sweep"].params["params/pipelines.yaml"] == ["pipelines.sweep"]
    assert Dag("default").column == "partition"
    edit(tiny / "params" / "pipelines.yaml", "method.temperature", "method.temprature")
    with pytest.raises(
        P.ParamsError, match="pipelines.sweep.column: no setting 'method.temprature'"
    ):
        Dag("sweep")


# ------------------------------------------------------------------ grids
GRID = """\
axes:
  k: {few: 3, many: 7}
experiments:
  knn:
    name: tiny_random_{k}nn_{probe}
    extends: tiny_random
    axes: {probe: [fast, slow]}
    set: {title: "Random init, {k.value}-NN ({probe})", knn: {k: "{k.value}"}}
"""


def test_a_grid_expands_its_axes_and_tracks_each_members_own_keys(tiny):
    (tiny / "params" / "grids.yaml").write_text(GRID)
    presets = Presets()
    members = [n for n in presets.names("experiment") if n.startswith("tiny_random_")]
    assert members == [
        "tiny_random_fewnn_fast",
        "tiny_random_fewnn_slow",
        "tiny_random_manynn_fast",
        "tiny_random_manynn_slow",
    ]
    exp = presets.load("experiment", "tiny_random_manynn_slow")
    assert exp.knn.k == 7 and exp.title == "Random init, 7-NN (slow)"
    assert exp.method == presets.load("experiment", "tiny_random").method
    tracked = presets.tracked("experiment", "tiny_random_manynn_slow", ("knn",))
    assert tracked["params/grids.yaml"] == [
        "experiments.knn.set.knn",
        "experiments.knn.extends",
        "axes.k.many",
    ]
    with open(tiny / "params" / "pipelines.yaml", "a") as f:
        f.write("  knn: [knn]\n")  # a grid's name stands for all its members
    assert Dag("knn").experiments == members


def test_a_pipeline_selects_a_grids_members_by_their_labels(tiny):
    """``{grid: labels}``: on each axis a label belongs to, the member carries one of the
    labels given (several on one axis: either); axes no label names are free. A label no
    axis has is named before anything runs."""
    (tiny / "params" / "grids.yaml").write_text(GRID)
    with open(tiny / "params" / "pipelines.yaml", "a") as f:
        f.write("  many: [{knn: [many]}]\n  fast_both: [{knn: [few, many, fast]}]\n")
        f.write("  one: [{knn: [many, slow]}, tiny_random]\n  typo: [{knn: [lots]}]\n")
    presets = Presets()
    assert presets.pipeline_experiments("many") == [
        "tiny_random_manynn_fast",
        "tiny_random_manynn_slow",
    ]
    assert presets.pipeline_experiments("fast_both") == [
        "tiny_random_fewnn_fast",
        "tiny_random_manynn_fast",
    ]
    assert Dag("one").experiments == ["tiny_random_manynn_slow", "tiny_random"]
    with pytest.raises(P.ParamsError, match="typo: .*no axis of grid knn has label.*lots"):
        presets.pipeline_experiments("typo")


def test_a_pipeline_made_of_parts_runs_its_parts_experiments_once(tiny):
    """A pipeline's name as an entry stands for its experiments (a board made of its parts);
    pipelines that name each other in a cycle are refused, naming the cycle."""
    (tiny / "params" / "grids.yaml").write_text(GRID)
    with open(tiny / "params" / "pipelines.yaml", "a") as f:
        f.write("  part1: [{knn: [many]}]\n  part2: [{knn: [fast]}, tiny_random]\n")
        f.write("  whole: [part1, part2]\n  loop_a: [loop_b]\n  loop_b: [tiny_random, loop_a]\n")
    presets = Presets()
    assert presets.pipeline_experiments("whole") == [
        "tiny_random_manynn_fast",
        "tiny_random_manynn_slow",
        "tiny_random_fewnn_fast",  # part2's, less what part1 already ran
        "tiny_random",
    ]
    assert Dag("whole").experiments == presets.pipeline_experiments("whole")
    with pytest.raises(P.ParamsError, match="in a cycle: loop_a -> loop_b -> loop_a"):
        presets.pipeline_experiments("loop_a")


def test_adding_an_axis_value_is_one_line_and_leaves_the_others_untouched(tiny):
    (tiny / "params" / "grids.yaml").write_text(GRID)
    before = {
        n: Presets().tracked("experiment", n, ("knn",))
        for n in ("tiny_random_fewnn_fast", "tiny_random_manynn_slow")
    }
    edit(tiny / "params" / "grids.yaml", "k: {few: 3, many: 7}", "k: {few: 3, many: 7, all: 9}")
    presets = Presets()
    assert presets.load("experiment", "tiny_random_allnn_fast").knn.k == 9
    for name, tracked in before.items():
        assert presets.tracked("experiment", name, ("knn",)) == tracked


SWEEP = """\
experiments:
  sweep:
    name: sweep_{line}_{k}nn
    extends: "tiny_{line}"
    axes: {line: [random, simclr], k: {few: 3, many: 7}}
    set: {knn: {k: "{k.value}"}}
"""


def test_a_grid_sweeps_several_lines_each_from_its_own_preset(tiny):
    """``extends`` with placeholders: one grid varies a setting over several lines, each
    member starting from its own line's preset."""
    (tiny / "params" / "grids.yaml").write_text(SWEEP)
    presets = Presets()
    for line in ("random", "simclr"):
        own = presets.load("experiment", f"tiny_{line}")
        member = presets.load("experiment", f"sweep_{line}_manynn")
        assert member.method == own.method and member.knn.k == 7
    assert presets.load("experiment", "sweep_random_fewnn").method.name != (
        presets.load("experiment", "sweep_simclr_fewnn").method.name
    )
    (tiny / "params" / "grids.yaml").write_text(SWEEP.replace("tiny_{line}", "tiny_{lines}"))
    with pytest.raises(P.ParamsError, match=r"sweep.extends: placeholder \{lines\}"):
        Presets().load("experiment", "sweep_random_fewnn")


@pytest.mark.parametrize(
    "grid, message",
    [
        (GRID.replace("{probe}", "{probes}"), "no axis 'probes'"),
        (GRID.replace("extends: tiny_random", "extends: tiny_nope"), "no preset 'tiny_nope'"),
        (GRID.replace("name: tiny_random_{k}nn_{probe}", "name: tiny_simclr"), "defined twice"),
        (GRID.replace('k: "{k.value}"', 'k: "{n.value}"'), "placeholder {n.value}"),
        (GRID.replace("{k.value}-NN", "{k.value}-NN").replace('k: "{k.value}"', "k: -1"), "knn.k"),
    ],
)
def test_bad_grids_are_named(tiny, grid, message):
    (tiny / "params" / "grids.yaml").write_text(grid)
    with pytest.raises(P.ParamsError, match=message) as err:
        for name in Presets().names("experiment"):
            Presets().load("experiment", name)
    assert "grids.yaml" in str(err.value)


def test_every_federated_method_keeps_one_federation_block_at_one_path():
    """Issue 49's one block at one path: ``method.federation``, or a multi-phase method's
    ``method.phases.<name>.federation``, and no second federation block anywhere in a
    method's params."""
    import re

    from fedssl.params import FederationSettings, federation_path

    def blocks(model, prefix):
        for name, field in model.model_fields.items():
            kind = field.annotation
            if isinstance(kind, type) and issubclass(kind, FederationSettings):
                yield f"{prefix}.{name}"
            elif isinstance(kind, type) and hasattr(kind, "model_fields"):
                yield from blocks(kind, f"{prefix}.{name}")

    found = {m.name: list(blocks(m.params, "method")) for m in registry.all()}
    federated = {name: paths for name, paths in found.items() if paths}
    assert len(federated) == 16  # every method but none, gradient_leakage and vit_scratch
    for name, paths in federated.items():
        assert paths == [federation_path(registry.get(name).params)], name
        assert re.fullmatch(r"method(\.phases\.\w+)?\.federation", paths[0]), (name, paths)
    assert federated["mfcl"] == ["method.phases.phase1.federation"]
