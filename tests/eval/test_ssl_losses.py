"""BYOL, SimSiam, MoCo v3 / v2 InfoNCE and MpFedcon's model-contrastive loss: hand-computed
values, stop-gradients, padding masks, and equality under vmap over a client axis."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from fedssl.losses import (
    byol_loss,
    infonce,
    moco_queue_loss,
    moco_v3_loss,
    model_contrastive_loss,
    simsiam_loss,
)


def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---- BYOL / SimSiam -------------------------------------------------------------------------


def test_byol_is_zero_for_aligned_and_eight_for_opposite_vectors():
    v = F.normalize(randn(4, 6, seed=0), dim=1)
    assert byol_loss(v, v, v, v).abs().item() < 1e-6
    assert byol_loss(v, v, -v, -v).item() == pytest.approx(8.0, abs=1e-5)  # 4 + 4
    # scale does not matter: only directions enter
    assert byol_loss(3 * v, 3 * v, 0.5 * v, 0.5 * v).abs().item() < 1e-6


def test_byol_hand_value_pairs_each_prediction_with_the_other_views_target():
    p1, z2 = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0]])  # cos = 1/sqrt(2)
    p2, z1 = torch.tensor([[0.0, 2.0]]), torch.tensor([[0.0, 5.0]])  # cos = 1
    assert byol_loss(p1, p2, z1, z2).item() == pytest.approx(2 - math.sqrt(2), abs=1e-6)
    # swapping the targets pairs p1 with z1 instead: a different value
    assert byol_loss(p1, p2, z2, z1).item() == pytest.approx(4 - math.sqrt(2), abs=1e-6)


def test_simsiam_values_with_the_half_factor():
    v = F.normalize(randn(5, 3, seed=1), dim=1)
    assert simsiam_loss(v, v, v, v).item() == pytest.approx(-1.0, abs=1e-6)
    assert simsiam_loss(v, v, -v, -v).item() == pytest.approx(1.0, abs=1e-6)
    p1, z2 = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0]])
    p2, z1 = torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 0.0]])  # orthogonal: cos 0
    assert simsiam_loss(p1, p2, z1, z2).item() == pytest.approx(-0.5 / math.sqrt(2), abs=1e-6)


@pytest.mark.parametrize("loss", [byol_loss, simsiam_loss])
def test_no_gradient_reaches_the_stop_gradient_targets(loss):
    p1, p2, z1, z2 = (randn(4, 8, seed=s).requires_grad_(True) for s in range(4))
    loss(p1, p2, z1, z2).backward()
    assert z1.grad is None and z2.grad is None
    assert p1.grad.abs().sum() > 0 and p2.grad.abs().sum() > 0


# ---- MoCo v3 InfoNCE (in-batch negatives) ---------------------------------------------------


def test_infonce_matches_a_hand_computed_2x2_example():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    k = torch.tensor([[2.0, 0.0], [0.6, 0.8]])  # rows normalise to [1,0] and [.6,.8]
    # logits / τ=0.5: row 0 = [2, 1.2] (target 0); row 1 = [0, 1.6] (target 1)
    expected = (math.log(1 + math.exp(-0.8)) + math.log(1 + math.exp(-1.6))) / 2
    assert infonce(q, k, 0.5).item() == pytest.approx(expected, abs=1e-6)


def test_infonce_is_cross_entropy_on_normalised_logits_with_diagonal_targets():
    q, k = randn(7, 5, seed=2), randn(7, 5, seed=3)
    logits = F.normalize(q, dim=1) @ F.normalize(k, dim=1).T / 0.2
    expected = F.cross_entropy(logits, torch.arange(7))
    assert torch.allclose(infonce(q, k, 0.2), expected, atol=1e-6)


def test_infonce_of_aligned_orthogonal_one_hots():
    e = torch.eye(4)
    # τ = 1: each row's positive logit is 1 and its 3 negatives are 0
    assert infonce(e, e, 1.0).item() == pytest.approx(math.log(1 + 3 / math.e), abs=1e-6)
    assert infonce(e, e, 0.01).item() < 1e-6  # small τ: the positive takes all the mass


def test_infonce_keys_get_no_gradient():
    q, k = randn(4, 3, seed=4).requires_grad_(True), randn(4, 3, seed=5).requires_grad_(True)
    infonce(q, k, 0.2).backward()
    assert k.grad is None and q.grad.abs().sum() > 0


def test_moco_v3_loss_is_the_symmetrised_infonce():
    q1, q2, k1, k2 = (randn(6, 4, seed=s) for s in range(10, 14))
    expected = infonce(q1, k2, 0.2) + infonce(q2, k1, 0.2)
    assert torch.allclose(moco_v3_loss(q1, q2, k1, k2, 0.2), expected)
    assert not torch.allclose(
        moco_v3_loss(q1, q2, k1, k2, 0.2), infonce(q1, k1, 0.2) + infonce(q2, k2, 0.2)
    )


# ---- MoCo v2 with a queue --------------------------------------------------------------------


def moco_queue_by_definition(q, k, queue, t):
    q, k = F.normalize(q, dim=1), F.normalize(k, dim=1)
    total = 0.0
    for i in range(len(q)):
        pos = math.exp(float(q[i] @ k[i]) / t)
        neg = sum(math.exp(float(q[i] @ m) / t) for m in queue)
        total += -math.log(pos / (pos + neg))
    return total / len(q)


def test_moco_queue_loss_matches_its_definition():
    q, k = randn(5, 6, seed=6), randn(5, 6, seed=7)
    queue = F.normalize(randn(11, 6, seed=8), dim=1)
    expected = moco_queue_by_definition(q, k, queue, 0.1)
    assert moco_queue_loss(q, k, queue, 0.1).item() == pytest.approx(expected, rel=1e-5)


def test_moco_queue_loss_gradient_reaches_only_the_queries():
    q, k = randn(3, 4, seed=9).requires_grad_(True), randn(3, 4, seed=10).requires_grad_(True)
    queue = F.normalize(randn(8, 4, seed=11), dim=1).requires_grad_(True)
    moco_queue_loss(q, k, queue, 0.1).backward()
    assert k.grad is None and queue.grad is None and q.grad.abs().sum() > 0


# ---- MpFedcon model-contrastive --------------------------------------------------------------


def test_model_contrastive_loss_hand_value():
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    z_pos = torch.tensor([[2.0, 0.0], [1.0, 0.0]])  # cos: 1, 1/sqrt(2)
    z_neg = torch.tensor([[0.0, 1.0], [1.0, 1.0]])  # cos: 0, 1
    s = 1 / math.sqrt(2)
    row0 = math.log(1 + math.exp((0 - 1) / 0.5))
    row1 = math.log(1 + math.exp((1 - s) / 0.5))
    got = model_contrastive_loss(z, z_pos, z_neg, 0.5)
    assert got.item() == pytest.approx((row0 + row1) / 2, abs=1e-6)


def test_model_contrastive_mask_excludes_rows_and_all_masked_is_zero():
    z, z_pos, z_neg = randn(6, 4, seed=12), randn(6, 4, seed=13), randn(6, 4, seed=14)
    z_pos[[1, 4]] = 0.0  # classes without a centre yet: zero centres, masked
    has_centre = torch.tensor([True, False, True, True, False, True])
    got = model_contrastive_loss(z, z_pos, z_neg, 0.5, has_centre)
    subset = model_contrastive_loss(z[has_centre], z_pos[has_centre], z_neg[has_centre], 0.5)
    assert torch.allclose(got, subset, atol=1e-6)
    z.requires_grad_(True)
    none = model_contrastive_loss(z, z_pos, z_neg, 0.5, torch.zeros(6, dtype=torch.bool))
    none.backward()
    assert none.item() == 0.0 and z.grad.abs().max() == 0


def test_model_contrastive_constants_get_no_gradient():
    z, zp, zn = (randn(3, 4, seed=s).requires_grad_(True) for s in (15, 16, 17))
    model_contrastive_loss(z, zp, zn, 0.5).backward()
    assert zp.grad is None and zn.grad is None and z.grad.abs().sum() > 0


# ---- padding masks and vmap over clients -----------------------------------------------------

QUEUE = F.normalize(randn(16, 8, seed=99), dim=1)
LOSSES = {
    "byol": lambda a, b, c, d, v=None: byol_loss(a, b, c, d, v),
    "simsiam": lambda a, b, c, d, v=None: simsiam_loss(a, b, c, d, v),
    "infonce": lambda a, b, c, d, v=None: infonce(a, b, 0.2, v),
    "moco_v3": lambda a, b, c, d, v=None: moco_v3_loss(a, b, c, d, 0.2, v),
    "moco_queue": lambda a, b, c, d, v=None: moco_queue_loss(a, b, QUEUE, 0.2, v),
    "model_contrastive": lambda a, b, c, d, v=None: model_contrastive_loss(a, b, c, 0.5, v),
}


@pytest.mark.parametrize("name", LOSSES)
def test_padded_rows_change_neither_the_loss_nor_the_gradient(name):
    loss = LOSSES[name]
    xs = [randn(6, 8, seed=20 + s) for s in range(4)]
    valid = torch.tensor([True, False, True, True, False, True])
    for x in xs:
        x[~valid] = 1e3 * randn(2, 8, seed=30)  # garbage in the padding
    masked = loss(*xs, valid)
    assert torch.allclose(masked, loss(*(x[valid] for x in xs)), atol=1e-5)
    assert not torch.allclose(masked, loss(*xs), atol=1e-3)  # the mask did something
    q = xs[0].requires_grad_(True)
    loss(*xs, valid).backward()
    assert torch.isfinite(q.grad).all() and q.grad[~valid].abs().max() == 0


@pytest.mark.parametrize("name", LOSSES)
def test_vmap_over_stacked_clients_equals_one_client_at_a_time(name):
    loss = LOSSES[name]
    clients, batch = 3, 5
    xs = [randn(clients, batch, 8, seed=40 + s) for s in range(4)]
    valid = torch.ones(clients, batch, dtype=torch.bool)
    valid[1, 3:] = False  # one client's batch is short (padded)
    batched = vmap(loss)(*xs, valid)
    one_by_one = torch.stack([loss(*(x[c] for x in xs), valid[c]) for c in range(clients)])
    assert batched.shape == (clients,)
    assert torch.allclose(batched, one_by_one, atol=1e-5)
    # as the cohort trainer uses them: per-client gradients under vmap(grad(...))
    grads = vmap(grad(loss))(*xs, valid)
    for c in range(clients):
        x0 = xs[0][c].clone().requires_grad_(True)
        loss(x0, *(x[c] for x in xs[1:]), valid[c]).backward()
        assert torch.allclose(grads[c], x0.grad, atol=1e-5)
    assert grads[1, 3:].abs().max() == 0  # padded rows of the short client get nothing
