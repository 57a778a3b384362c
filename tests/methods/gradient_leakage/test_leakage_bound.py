"""The bounded gradient attack (fedssl.attacks.leakage.gradient_attack): its reconstruction is
the iterate with the lowest gradient-matching loss (what the attacker can see), not the last
one of a possibly diverging L-BFGS run, and every MSE is of images in the pixel range, so the
reported figure lies in [0, 1] on any machine."""

from __future__ import annotations

import pytest
import torch

from fedssl.attacks.leakage import attacker_model, client_gradients, gradient_attack
from tests.methods.gradient_leakage.test_leakage import CLASSES, SIZE, TWO_FC, image, lenet

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("attack,hidden", [("dlg", 1), ("idlg", 0)])
def test_the_reconstruction_is_the_best_matching_iterate_and_its_mse_is_bounded(attack, hidden):
    model, x = lenet(TWO_FC), image()
    grads = client_gradients(model, x, 7, hidden_fc=hidden)
    surrogate = attacker_model(model, hidden, None if hidden == 0 else 2, CLASSES, seed=5)
    r = gradient_attack(
        surrogate, grads, (3, SIZE, SIZE), CLASSES, attack, iterations=10, seed=0, true_image=x
    )
    assert r.match_curve and len(r.mse_curve) == len(r.match_curve)
    best = min(range(len(r.match_curve)), key=r.match_curve.__getitem__)
    assert r.mse == pytest.approx(r.mse_curve[best])
    assert r.mse == pytest.approx(float(((r.image.clamp(0, 1) - x) ** 2).mean()))
    assert all(0.0 <= m <= 1.0 for m in r.mse_curve)
    if attack == "idlg":  # full gradients: the best iterate is the image (as before)
        assert r.mse < 1e-3


def test_a_diverging_run_reports_the_iterate_before_it_diverged(monkeypatch):
    """A matching loss that turns non-finite stops the attack; the reconstruction stays the
    best finite iterate and its MSE a number in [0, 1]."""
    model, x = lenet(TWO_FC), image()
    grads = client_gradients(model, x, 7, hidden_fc=0)
    surrogate = attacker_model(model, 0, None, CLASSES, seed=5)
    steps = []
    step = torch.optim.LBFGS.step

    def blow_up(self, closure):  # the third step diverges
        steps.append(1)
        loss = step(self, closure)
        if len(steps) == 3:
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(float("inf"))
        return loss

    monkeypatch.setattr(torch.optim.LBFGS, "step", blow_up)
    r = gradient_attack(
        surrogate, grads, (3, SIZE, SIZE), CLASSES, "idlg", iterations=10, seed=0, true_image=x
    )
    assert r.diverged and len(r.match_curve) == 2 and torch.isfinite(r.image).all()
    assert 0.0 <= r.mse <= 1.0
