"""Gradient leakage (DLG / iDLG) against a small sigmoid LeNet on one 16x16 image."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedssl.attacks.leakage import (
    add_gradient_noise,
    attacker_model,
    client_gradients,
    gradient_attack,
    infer_label_from_gradients,
    leakage_experiment,
    shared_parameter_names,
    split_head,
    uniform_init_,
)

SIZE, CLASSES = 16, 10


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def lenet(fc_widths: tuple[int, ...] = (CLASSES,), seed: int = 1) -> nn.Sequential:
    """iDLG-style LeNet: 3 sigmoid convs of 12 channels (strides 2, 2, 1), then FC layers."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, 12, 5, 2, 2),
        nn.Sigmoid(),
        nn.Conv2d(12, 12, 5, 2, 2),
        nn.Sigmoid(),
        nn.Conv2d(12, 12, 5, 1, 2),
        nn.Sigmoid(),
        nn.Flatten(),
    ]
    width = 12 * (SIZE // 4) ** 2
    for hidden in fc_widths[:-1]:
        layers += [nn.Linear(width, hidden), nn.Sigmoid()]
        width = hidden
    layers.append(nn.Linear(width, fc_widths[-1]))
    return uniform_init_(nn.Sequential(*layers), 0.5, seed)


def image(seed: int = 3) -> torch.Tensor:
    return torch.rand((1, 3, SIZE, SIZE), generator=torch.Generator().manual_seed(seed))


TWO_FC = (CLASSES, CLASSES)  # head = last FC (cl=1); the hidden FC has one unit per class


def test_split_head_and_shared_names():
    model = lenet(TWO_FC)
    prefix, head = split_head(model, 1)
    assert len(prefix) == 9 and isinstance(head[0], nn.Linear) and len(head) == 1
    assert shared_parameter_names(model, 0) == [n for n, _ in model.named_parameters()]
    assert shared_parameter_names(model, 1)[-2:] == ["7.weight", "7.bias"]
    assert shared_parameter_names(model, 2)[-1] == "4.bias"  # both FC layers private
    with pytest.raises(ValueError, match="hidden_fc=3"):
        split_head(model, 3)


def test_idlg_label_rule_recovers_every_label_with_full_gradients():
    model = lenet(TWO_FC)
    for seed in range(3):
        for label in range(CLASSES):
            grads = client_gradients(model, image(seed), label, hidden_fc=0)
            assert infer_label_from_gradients(model, grads) == label


def test_label_rule_is_near_chance_with_the_head_hidden():
    model = lenet(TWO_FC)
    hits, trials = 0, 0
    for seed in range(5):
        for label in range(CLASSES):
            grads = client_gradients(model, image(seed), label, hidden_fc=1)
            assert "9.weight" not in grads and "7.weight" in grads  # last layer never sent
            hits += infer_label_from_gradients(model, grads) == label
            trials += 1
    assert hits / trials <= 0.3  # chance is 0.1; full gradients give 1.0 (test above)


def attack_12_steps(surrogate, grads, x, attack: str):
    """A 12-iteration reconstruction of ``x`` (seeded) from the gradients a party shares."""
    return gradient_attack(
        surrogate, grads, (3, SIZE, SIZE), CLASSES, attack=attack, iterations=12, seed=0,
        true_image=x,
    )  # fmt: skip


def test_idlg_reconstructs_the_image_from_full_gradients():
    model, x = lenet(TWO_FC), image()
    grads = client_gradients(model, x, 7, hidden_fc=0)
    surrogate = attacker_model(model, 0, None, CLASSES)
    result = attack_12_steps(surrogate, grads, x, "idlg")
    assert result.label == 7 and not result.diverged
    assert len(result.mse_curve) == 12
    assert result.mse_curve[0] > 0.01  # starts from noise ...
    assert result.mse_curve[-1] < 1e-3  # ... and ends at the image
    # a few corner pixels reach the first conv through few weights and converge last
    assert float(((result.image - x).abs() < 0.05).float().mean()) > 0.99


def test_dlg_reconstructs_image_and_label_with_a_dummy_label():
    model, x = lenet((CLASSES,)), image()
    grads = client_gradients(model, x, 4, hidden_fc=0)
    result = attack_12_steps(attacker_model(model, 0, None, CLASSES), grads, x, "dlg")
    assert result.label == 4
    assert result.mse_curve[-1] < 1e-3


@pytest.mark.parametrize("assumed_fc", [None, 2])
def test_hidden_head_keeps_reconstruction_error_high(assumed_fc):
    model, x = lenet(TWO_FC), image()
    grads = client_gradients(model, x, 7, hidden_fc=1)
    surrogate = attacker_model(model, 1, assumed_fc, CLASSES, seed=5)
    # the attacker's prefix carries the party's true shared weights
    assert torch.equal(surrogate[7].weight, model[7].weight)
    assert not torch.equal(surrogate[-1].weight, model[-1].weight)
    result = attack_12_steps(surrogate, grads, x, "idlg")
    finite = [m for m in result.mse_curve if m == m]
    assert result.diverged or min(finite) > 0.02  # never gets close to the image


@pytest.mark.parametrize("kind", ["gaussian", "laplace"])
def test_noise_of_variance_1e2_defeats_reconstruction(kind):
    model, x = lenet(TWO_FC), image()
    result = leakage_experiment(model, x, 7, CLASSES, noise=(kind, 1e-2), iterations=12)
    # the same attack without noise reaches MSE < 1e-3 (test above)
    assert result.diverged or result.mse_curve[-1] > 0.05


@pytest.mark.parametrize("kind", ["gaussian", "laplace"])
def test_noise_has_the_requested_variance(kind):
    grads = {"w": torch.zeros(200_000)}
    noisy = add_gradient_noise(grads, kind, 1e-2, seed=1)["w"]
    assert abs(float(noisy.mean())) < 1e-3
    assert float(noisy.var()) == pytest.approx(1e-2, rel=0.03)
    # Laplace has heavier tails: kurtosis 6 vs 3
    kurtosis = float((noisy**4).mean() / noisy.var() ** 2)
    assert kurtosis == pytest.approx(6.0 if kind == "laplace" else 3.0, rel=0.1)


def test_attack_inputs_are_validated():
    model = lenet(TWO_FC)
    with pytest.raises(ValueError, match="assumed_fc"):
        attacker_model(model, 0, 1, CLASSES)
    with pytest.raises(ValueError, match="at least one FC"):
        attacker_model(model, 1, 0, CLASSES)
    with pytest.raises(ValueError, match="gaussian"):
        add_gradient_noise({"w": torch.zeros(3)}, "uniform", 1.0)
    with pytest.raises(TypeError):
        client_gradients(nn.ModuleList([nn.Linear(2, 2)]), torch.zeros(1, 2), 0)


def test_laplace_noise_stays_finite_when_the_uniform_draw_hits_zero(monkeypatch):
    # torch.rand draws from [0, 1): a draw of exactly 0 once made an infinite Laplace sample
    # (and a NaN model in a long FedAvg run with noisy uploads)
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.zeros(shape, dtype=kw["dtype"]))
    noisy = add_gradient_noise({"w": torch.zeros(4)}, "laplace", 1e-4, seed=0)["w"]
    assert torch.isfinite(noisy).all() and (noisy != 0).all()
