"""The plugin contract, checked for every registered method, so a new method is held to it by
being registered.

Every method: its declaration imports without torch, every hook it names resolves to a function,
its stages' code dependencies are importable modules. Every method on a base
(:class:`FederatedMethod`, :class:`SupervisedFederatedMethod`, :class:`PretrainStepMethod`;
its tiny params in ``EXTRA`` where the common ones do not do): its stages run on a tiny project
through the report (its training step, the probes on its encoder, its client costs; the costs'
code none of the training's); a SIGKILLed training stage resumes to the uninterrupted outputs
(each method not on a runtime, and one of each runtime). Every method on a shared runtime (a
loss and a model): in process, a tiny federation learns, a run killed after its first round
resumes to the uninterrupted result, the saved model gives the probes a frozen encoder that the
export builder rebuilds, and the ledger counts a payload both ways each round."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedssl.methods import federated, registry
from fedssl.methods import federated_supervised as supervised
from fedssl.methods.base import (
    FederatedMethod,
    PretrainStepMethod,
    SupervisedFederatedMethod,
)
from fedssl.methods.hooks import call_hook, hook_module, resolve_hook
from fedssl.presets import deep_merge
from tests.fixtures import (
    TINY_PROBES,
    assert_a_killed_stage_resumes,
    in_project,
    run_stage,
    tiny_chain_project,
)
from tests.fixtures import run as run_command
from tests.fl.test_engine import SHAPE, toy_data
from tests.methods.supervised.test_supervised_rules import CLASSES, held_out

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")
TINY_MODEL = {
    "arch": "small_cnn",
    "norm": "gn",
    "channels_per_group": 4,
    "width": 4,
    "proj_hidden": 16,
    "proj_dim": 8,
}
AUGMENT = {"crop_scale": [0.5, 1.0], "jitter_p": 0.0, "grayscale_p": 0.0}
METHODS = [m.name for m in registry.all()]
# Methods on a base whose params the common tiny section does not fit, and where their chain
# (every step through the report, a killed run's resume) is tested instead
OWN_CHAIN = {"mocosfl": "tests/methods/mocosfl/test_mocosfl.py (split params, an attack step)"}
FEDERATED = [
    m.name for m in registry.all() if isinstance(m, FederatedMethod) and m.name not in OWN_CHAIN
]
SUPERVISED = [m.name for m in registry.all() if isinstance(m, SupervisedFederatedMethod)]
ON_A_RUNTIME = FEDERATED + SUPERVISED
BASES = (PretrainStepMethod, SupervisedFederatedMethod)  # FederatedMethod is a PretrainStepMethod
ON_A_BASE = [m.name for m in registry.all() if isinstance(m, BASES) and m.name not in OWN_CHAIN]
# A SIGKILLed training stage resumes (through the stages): every method on a base but not on a
# runtime, and one of each runtime (the others resume in process).
KILLED = [n for n in ON_A_BASE if n not in ON_A_RUNTIME] + [FEDERATED[0], SUPERVISED[0]]
# What a method needs besides the common tiny settings (its required fields, sizes that fit).
EXTRA = {
    "supervised": {"variant": "moon", "mu": 1.0, "augment": "crop_flip"},
    "fsl": {"augment": "crop_flip"},
    "featarc": {
        "model": {**TINY_MODEL, "proj_dim": 16},
        "federation": {"lr": 0.001},
        "augment": AUGMENT,
    },
    "orchestra": {
        "global_clusters": 6,
        "local_clusters": 4,
        "memory_size": 48,
        "federation": {"lr": 0.01},
    },
}


def hooks_of(method) -> list:
    named = [
        method.encoder_hook,
        method.client_costs_hook,
        method.projected_costs_hook,
        method.report_tables,
        method.report_figures,
        method.encoder_builder,
        getattr(method, "recipe", None),
        *method.flower_steps.values(),
    ]
    return [h for h in named if h]


def test_the_declarations_import_without_torch():
    """The front ends import every declaration to validate params and plan: no torch there."""
    code = (
        "import sys; from fedssl.methods import registry; registry.all(); "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("name", METHODS)
def test_every_hook_a_method_names_is_a_function(name):
    method = registry.get(name)
    for hook in hooks_of(method):
        assert callable(resolve_hook(hook)), hook
    assert method.params.model_fields["name"].default == name


def section(name: str, rounds: int = 2, batch_size: int = 16) -> dict:
    """The tiny method section of ``name``: the common settings, its defaults otherwise."""
    federation = {"rounds": rounds, "local_epochs": 1, "batch_size": batch_size, "lr": 0.05}
    common = {"name": name, "model": TINY_MODEL, "federation": federation, "seed": 0}
    if isinstance(registry.get(name), FederatedMethod):
        common["augment"] = AUGMENT
    return deep_merge(common, EXTRA.get(name, {}))


def tiny(name: str, rounds: int = 2):
    """Valid tiny params of method ``name``."""
    return registry.get(name).params.model_validate(section(name, rounds))


def federation(name: str, ckpt):
    """(the model, its federation) of method ``name`` on the toy data, by its runtime."""
    p = tiny(name)
    if name in SUPERVISED:
        model = supervised.build_model(p, SHAPE, CLASSES, CPU)
        return model, supervised.make_federation(p, model, toy_data(), held_out(), ckpt, "fp")
    model = federated.build_model(p, SHAPE, CPU)
    return model, federated.make_federation(p, model, toy_data(), ckpt, "contract")


def run(name: str, ckpt, stop_after: int | None = None):
    model, fed = federation(name, ckpt)

    def stop(state):
        if state.round == stop_after:
            raise KeyboardInterrupt

    try:
        return model, fed.run(fed.start(model), on_round=stop)
    except KeyboardInterrupt:
        return model, None


def server_tensors(server: dict) -> dict:
    """The server's tensors by ``model/key`` (a global model, or a pool of cluster models)."""
    return {f"{m}/{k}": v for m, tensors in server.items() for k, v in tensors.items()}


def initial_server(name: str, ckpt) -> dict:
    """The server's tensors before any round."""
    model, fed = federation(name, ckpt)
    return {k: v.clone() for k, v in server_tensors(fed.start(model).server).items()}


# Federated methods whose payload is not the same both ways, and why
ONE_WAY_EXTRAS = {
    "featarc": "all C cluster models down, the client's one model up",
    "orchestra": "the model down, the model and the local centroids up",
}


@pytest.mark.parametrize("name", ON_A_RUNTIME)
def test_a_method_on_a_runtime_trains_resumes_and_counts_its_payload(name, tmp_path):
    model, whole = run(name, tmp_path / "whole.pt")
    before = initial_server(name, tmp_path / "fresh.pt")
    after = server_tensors(whole.server)
    moved = [k for k, v in after.items() if not torch.equal(v, before[k])]
    assert moved, "two rounds of training changed nothing"
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in whole.log)

    # killed after round 1: the checkpoint resumes to the uninterrupted run
    assert run(name, tmp_path / "killed.pt", stop_after=1)[1] is None
    _, resumed = run(name, tmp_path / "killed.pt")
    assert resumed.ledger == whole.ledger
    assert [r["loss"] for r in resumed.log] == [r["loss"] for r in whole.log]
    for k, v in server_tensors(resumed.server).items():
        assert torch.equal(v, after[k]), k

    # the ledger: every sampled client gets and returns a payload each round (a federated
    # method's model both ways but where it says otherwise; a supervised one may send more, FSL
    # its smashed data)
    up, down = whole.ledger.up, whole.ledger.down
    assert sum(whole.ledger.rounds) == len(whole.log) * len(toy_data().clients)
    assert all(sum(d.values()) > 0 for d in down) and all(sum(u.values()) > 0 for u in up)
    if name in SUPERVISED:
        assert all(sum(u.values()) >= sum(d.values()) for u, d in zip(up, down))
        assert all("global_top1" in r for r in whole.log)  # scored on the test split each round
    elif name not in ONE_WAY_EXTRAS:
        assert [sum(u.values()) for u in up] == [sum(d.values()) for d in down]


class _Ctx:
    """What the encoder hook reads of a features stage."""

    def __init__(self, p, folder):
        from types import SimpleNamespace

        self.exp = SimpleNamespace(method=p, features=SimpleNamespace(layer="backbone"))
        self.device, self.folder = CPU, folder
        self.method = registry.get(p.name)

    def input(self, step):
        return self.folder


def save(name: str, model, folder) -> None:
    """What the training step leaves for the encoder hook."""
    if name in SUPERVISED:
        supervised.save_network(supervised.network_of(model), folder / "model.pt", SHAPE, CLASSES)
    else:
        federated.recipe_of(tiny(name)).save(model, folder / "model.pt", SHAPE)


@pytest.mark.parametrize("name", ON_A_RUNTIME)
def test_the_saved_model_gives_a_frozen_encoder_the_export_builder_rebuilds(name, tmp_path):
    method, p = registry.get(name), tiny(name)
    model, _ = federation(name, tmp_path / "unused.pt")
    save(name, model, tmp_path)
    encoder = call_hook(method.encoder_hook, _Ctx(p, tmp_path))
    assert not any(q.requires_grad for q in encoder.parameters())
    x = torch.rand(3, *SHAPE, generator=torch.Generator().manual_seed(0))
    features = encoder.eval()(x)
    assert features.shape[0] == 3 and torch.isfinite(features).all()
    rebuilt = call_hook(method.encoder_builder, p, SHAPE, False)
    rebuilt.load_state_dict(encoder.state_dict(), strict=True)
    assert torch.equal(rebuilt.eval()(x), features)


# ---------------------------------------------------------------------- through the stages
PIPELINE = "contract"


def experiment(name: str, rounds: int = 2, **changes) -> str:
    """A tiny experiment of method ``name`` (its section's ``changes`` applied; JSON is YAML)."""
    method = {**section(name, rounds, batch_size=32), **changes}
    probes = TINY_PROBES.replace("{{", "{").replace("}}", "}")
    return f"title: {name}\npartition: tiny_dir05_m3\nmethod: {json.dumps(method)}\n{probes}"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A tiny project with every method on a base, its stages run through the report (and a
    3-round experiment of each for the resume)."""
    experiments = {f"tiny_{n}": experiment(n) for n in ON_A_BASE}
    experiments.update({f"long_{n}": experiment(n, rounds=3) for n in KILLED})
    root = tiny_chain_project(
        tmp_path_factory.mktemp("contract"), experiments, PIPELINE, [f"tiny_{n}" for n in ON_A_BASE]
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDSSL_DEVICE", "cpu")
        with in_project(root) as planned:
            run_stage(planned("report", PIPELINE), upstream=True)
    return root


@pytest.mark.parametrize("name", ON_A_BASE)
def test_a_method_on_a_base_runs_through_its_stages_to_the_report(name, project, monkeypatch):
    from fedssl.plan.dag import Dag

    monkeypatch.chdir(project)
    method, exp, p = registry.get(name), f"tiny_{name}", tiny(name)
    (step,) = method.steps
    dag = Dag(PIPELINE)
    kinds = [s.kind for s in dag.stages.values() if s.name.endswith(f"__{exp}")]
    assert kinds == [step.name, "features", "evaluate", "costs"]
    cost_code = hook_module(method.client_costs_hook).replace(".", "/") + ".py"
    assert cost_code in dag.stages[f"costs__{exp}"].code
    assert cost_code not in dag.stages[f"{step.name}__{exp}"].code

    results, out = project / "results/experiments" / exp, project / "artifacts/experiments" / exp
    metrics = json.loads((results / "metrics.json").read_text())
    assert any("linear" in k for k in metrics) and any("knn" in k for k in metrics)
    log = list(csv.DictReader((results / "rounds.tsv").open(), delimiter="\t"))
    comm = json.loads((out / step.name / "communication.json").read_text())["per_client"]
    assert all(c["rounds"] == len(log) and c["bytes_up"] > 0 and c["bytes_down"] > 0 for c in comm)
    report = json.loads((project / f"results/reports/{PIPELINE}/report.json").read_text())
    row = {r["experiment"]: r for r in report["rows"]}[exp]
    assert row["row"] == method.row_label(p) and row["arch"] == method.arch(p)
    assert all(float(row[c]) > 0 for c in ("client_MB_exchanged", "client_GFLOPs", "peak_step_MB"))
    if name in SUPERVISED:  # the global model's accuracy: each round's and the final one
        top1 = json.loads((results / "global.json").read_text())["global_top1"]
        assert float(log[-1]["global_top1"]) == top1 == row["global_top1"]
        saved = torch.load(out / step.name / "model.pt", weights_only=True)
        assert saved["classes"] == 4 and "global" in report["tables"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", KILLED)
def test_a_killed_training_stage_resumes_to_the_uninterrupted_outputs(
    name, project, capsys, monkeypatch
):
    (step,) = registry.get(name).steps
    assert_a_killed_stage_resumes(
        project, step.name, f"long_{name}", "round 1/", capsys, monkeypatch
    )


def test_snakemake_finds_the_stages_run_here_up_to_date(project):
    """What the stages wrote is what the front end expects (outputs, metrics, code)."""
    out = run_command(
        ["snakemake", "-n", "--cores", "1", "--config", f"pipeline={PIPELINE}"], project
    )
    assert "Nothing to be done" in out.stdout


def test_the_tests_mirror_the_package():
    """Each method package has its tests in tests/methods/<name>/, and no test module at the top
    of tests/ is named after a method (a new method's tests go beside the others)."""
    import fedssl.methods

    root = Path(fedssl.methods.__file__).parent
    tests = Path(__file__).parent
    packages = sorted(p.name for p in root.iterdir() if (p / "__init__.py").exists())
    assert packages, root
    missing = [n for n in packages if not list((tests / n).glob("test_*.py"))]
    assert not missing, f"method packages without tests/methods/<name>/: {missing}"
    stray = [
        f.name
        for f in tests.parent.glob("test_*.py")
        if any(f.stem[5:] == n or f.stem[5:].startswith(n + "_") for n in packages)
    ]
    assert not stray, f"method tests at the top of tests/: {stray}"


# ---------------------------------------------------------------------- a strategy by params
def preset_method(name: str, tiny: dict):
    """The method params of preset ``name`` with ``tiny`` merged over them (sizes that fit)."""
    from fedssl.presets import Presets, deep_merge

    p = Presets().load("experiment", name).method
    return type(p).model_validate(deep_merge(p.model_dump(), tiny))


def fedbyol_federation(p, ckpt):
    model = federated.build_model(p, SHAPE, CPU)
    return model, federated.make_federation(p, model, toy_data(), ckpt, "fp")


def mfcl_federation(p, ckpt):
    from fedssl.methods.mfcl import run as mfcl

    model = mfcl.build_client_module(p, SHAPE, CPU)
    return model, mfcl.make_phase1_federation(p, model, toy_data(), ckpt, "fp")


def lw_federation(p, ckpt):
    from fedssl.fl.cohort import LocalData
    from fedssl.methods.lwfedssl import run as lw

    data = toy_data()
    server = LocalData(data.images, data.labels, [data.clients[0]])  # the calibration set
    fed, learner = lw.make_federation(
        p, lw.initial_online(p, SHAPE, 1), 1, data, ckpt, "fp", server
    )
    return learner, fed


TINY_VIT = {"width": 16, "depth": 3, "heads": 2, "mlp_ratio": 2.0, "patch_size": 7}
CHOSEN = {  # preset: (tiny sizes, its federation on the toy data, the strategy it stacks)
    "smoke_fedbyol_scaffold": (
        {"model": TINY_MODEL, "federation": {"rounds": 1, "batch_size": 16}, "augment": AUGMENT},
        fedbyol_federation,
        "Scaffold",
    ),
    "smoke_mfcl_fedprox": (
        {
            "client_module": {"width": 4, "channels_per_group": 2},
            "phases": {"phase1": {"federation": {"rounds": 1}}},
        },
        mfcl_federation,
        "FedProx",
    ),
    "smoke_lw_fedssl_fedprox": (
        {"vit": TINY_VIT, "federation": {"rounds": 1, "batch_size": 32}},
        lw_federation,
        "FedProx",
    ),
}


@pytest.mark.parametrize("name", CHOSEN)
def test_a_preset_stacks_its_chosen_strategy_over_the_methods_and_trains_a_round(name, tmp_path):
    """FedBYOL + SCAFFOLD, MFCL phase 1 + FedProx, LW-FedSSL + FedProx: params alone stack the
    library's strategy over the method's own, and a round trains through it."""
    tiny, build, mixin = CHOSEN[name]
    p = preset_method(name, tiny)
    model, fed = build(p, tmp_path / "ck.pt")
    assert mixin in [c.__name__ for c in type(fed.strategy).__mro__]
    start = fed.start(model)
    before = {k: v.clone() for k, v in server_tensors(start.server).items()}
    state = fed.run(start)
    assert len(state.log) == 1 and torch.isfinite(torch.tensor(state.log[0]["loss"]))
    after = server_tensors(state.server)
    assert any(not torch.equal(v, before[k]) for k, v in after.items() if k in before)
    held = [k for kept in state.clients.values() for k in kept]
    assert not [k for k in (*after, *held) if k.startswith(("fedprox.", "scaffold."))]
    if mixin == "Scaffold":  # c moved, each client keeps its c_i, Δc_i travelled
        assert any(v.abs().sum() > 0 for v in state.server["control"].values())
        assert all(any(k.startswith("control.") for k in kept) for kept in state.clients.values())
        assert all(u["control"] > 0 for u in state.ledger.up)
