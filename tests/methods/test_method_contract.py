"""The plugin contract, checked for every registered method, so a new method is held to it by
being registered.

Every method: its declaration imports without torch, every hook it names resolves to a function,
its stages' code dependencies are importable modules. Every :class:`FederatedMethod` (a loss and
a model on the shared runtime): a tiny federation learns, a run killed after its first round
resumes to the uninterrupted result, the saved model gives the probes a frozen encoder, and the
ledger counts the model's payload both ways each round."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedssl.methods import federated, registry
from fedssl.methods.base import FederatedMethod, call_hook
from tests.fl.test_engine import SHAPE, toy_data

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
FEDERATED = [m.name for m in registry.all() if isinstance(m, FederatedMethod)]


def hooks_of(method) -> list[str]:
    named = [
        method.encoder_hook,
        method.client_costs_hook,
        method.projected_costs_hook,
        method.report_tables,
        method.report_figures,
        method.encoder_builder,
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
        module, _, function = hook.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), hook
    assert method.params.model_fields["name"].default == name


def tiny(name: str, rounds: int = 2):
    """A tiny valid params block of FederatedMethod ``name`` (its defaults otherwise)."""
    p = registry.get(name).params
    return p.model_validate(
        {
            "model": TINY_MODEL,
            "rounds": rounds,
            "local_epochs": 1,
            "batch_size": 16,
            "lr": 0.05,
            "augment": AUGMENT,
        }
    )


def run(name: str, ckpt, stop_after: int | None = None):
    p = tiny(name)
    model = federated.build_model(p, SHAPE, CPU)
    fed = federated.make_federation(p, model, toy_data(), ckpt, "contract")

    def stop(state):
        if state.round == stop_after:
            raise KeyboardInterrupt

    try:
        return model, fed.run(fed.start(model), on_round=stop)
    except KeyboardInterrupt:
        return model, None


@pytest.mark.parametrize("name", FEDERATED)
def test_a_federated_method_trains_resumes_and_hands_the_probes_its_encoder(name, tmp_path):
    model, whole = run(name, tmp_path / "whole.pt")
    before = {
        k: v.clone() for k, v in federated.build_model(tiny(name), SHAPE, CPU).state_dict().items()
    }
    moved = [k for k, v in whole.server["global"].items() if not torch.equal(v, before[k])]
    assert moved, "two rounds of training changed nothing"
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in whole.log)

    # killed after round 1: the checkpoint resumes to the uninterrupted run
    assert run(name, tmp_path / "killed.pt", stop_after=1)[1] is None
    _, resumed = run(name, tmp_path / "killed.pt")
    assert resumed.ledger == whole.ledger
    assert [r["loss"] for r in resumed.log] == [r["loss"] for r in whole.log]
    for k, v in whole.server["global"].items():
        assert torch.equal(v, resumed.server["global"][k]), k

    # the ledger: every sampled client gets and returns the same payload each round
    up, down = whole.ledger.up, whole.ledger.down
    assert sum(whole.ledger.rounds) == 2 * len(toy_data().clients)
    assert [sum(u.values()) for u in up] == [sum(d.values()) for d in down]
    assert all(sum(u.values()) > 0 for u in up)


class _Ctx:
    """What the encoder hook reads of a features stage."""

    def __init__(self, p, folder):
        from types import SimpleNamespace

        self.exp = SimpleNamespace(method=p, features=SimpleNamespace(layer="backbone"))
        self.device, self.folder = CPU, folder
        self.method = registry.get(p.name)

    def input(self, step):
        return self.folder


@pytest.mark.parametrize("name", FEDERATED)
def test_the_saved_model_gives_a_frozen_encoder(name, tmp_path):
    method, p = registry.get(name), tiny(name)
    model = federated.build_model(p, SHAPE, CPU)
    call_hook(method.save, model, tmp_path / "model.pt", SHAPE)
    encoder = call_hook(method.encoder_hook, _Ctx(p, tmp_path))
    assert not any(q.requires_grad for q in encoder.parameters())
    x = torch.rand(3, *SHAPE, generator=torch.Generator().manual_seed(0))
    features = encoder.eval()(x)
    assert features.shape[0] == 3 and torch.isfinite(features).all()


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
