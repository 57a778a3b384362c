"""What a party of MpFedcon or a personalised baseline pays per round: FLOPs counted around one
real step of each local phase, so each method's extra work shows (and fails the test when the
phase schedule or a loss changes)."""

from __future__ import annotations

import pytest

from fedssl.methods.mpfedcon.costs import phase_costs
from tests.methods.mpfedcon.test_mpfedcon import params

pytestmark = pytest.mark.usefixtures("one_thread")
SHAPE, CLASSES = (1, 28, 28), 4


def per_sample_round(p) -> float:
    return sum(ph["flops_per_sample"] * ph["epochs"] for ph in phase_costs(p, SHAPE, CLASSES))


def test_each_variant_pays_for_its_own_rule():
    fedavg = per_sample_round(params("fedavg"))
    assert fedavg > 0
    # SCAFFOLD's correction and FedProx's term are elementwise: no matmul or conv more
    assert per_sample_round(params("scaffold")) == fedavg
    assert per_sample_round(params("fedprox")) == fedavg
    # Ditto trains the global and the personal network on the same batches; APFL steps both
    assert per_sample_round(params("ditto")) == 2 * fedavg
    assert per_sample_round(params("apfl")) == 2 * fedavg
    # Per-FedAvg: first order is a plain step per row; Hessian-free makes 4 gradients on 3 slices
    # (D; D' at the adapted weights, once; the two finite-difference points on D'')
    fo = per_sample_round(params("perfedavg", perfedavg_order="first_order"))
    hf = per_sample_round(params("perfedavg", perfedavg_order="hessian_free"))
    assert fo == pytest.approx(fedavg) and hf == pytest.approx(4 / 3 * fedavg)


def test_head_first_schedules_and_the_contrastive_term():
    fedrep = phase_costs(params("fedrep", head_epochs=2), SHAPE, CLASSES)
    mpfedcon = phase_costs(params("mpfedcon", head_epochs=2), SHAPE, CLASSES)
    assert [ph["epochs"] for ph in fedrep] == [2, 1] == [ph["epochs"] for ph in mpfedcon]
    # the head phase trains the head only: cheaper than a body step; the same for both
    assert fedrep[0]["flops_per_sample"] < fedrep[1]["flops_per_sample"]
    assert fedrep[0] == mpfedcon[0]
    # MpFedcon's body step also runs the anchor (the round-start network) for z_con
    assert mpfedcon[1]["flops_per_sample"] > fedrep[1]["flops_per_sample"]
    # a step holds at least every weight the party has and its activations
    assert all(ph["step_bytes"] > 0 for ph in fedrep + mpfedcon)
