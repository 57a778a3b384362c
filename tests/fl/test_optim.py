"""LARS (SimCLR variant) and the warmup + cosine schedule."""

import math

import pytest
import torch
from torch import nn

from fedssl.models.norms import TwinNorm
from fedssl.training.optim import LARS, lars_param_groups, scaled_peak_lr, set_lr, warmup_cosine


def test_lars_update_matches_hand_computation():
    w0 = torch.tensor([3.0, 4.0])  # ‖w‖ = 5
    g = torch.tensor([0.5, -1.0])
    lr, wd, eta, m = 0.5, 0.1, 0.001, 0.9
    p = nn.Parameter(w0.clone())
    opt = LARS([p], lr=lr, momentum=m, weight_decay=wd, trust_coefficient=eta)
    p.grad = g.clone()
    opt.step()
    d = g + wd * w0  # [0.8, -0.6], ‖d‖ = 1
    assert torch.linalg.vector_norm(d).item() == pytest.approx(1.0)
    ratio = eta * 5.0 / 1.0
    v1 = lr * ratio * d  # first step: buffer = scaled step
    w1 = w0 - v1
    torch.testing.assert_close(p.detach(), w1)
    # second step with another gradient: momentum accumulates lr-scaled steps
    g2 = torch.tensor([-2.0, 1.0])
    p.grad = g2.clone()
    opt.step()
    d2 = g2 + wd * w1
    ratio2 = eta * torch.linalg.vector_norm(w1) / torch.linalg.vector_norm(d2)
    v2 = m * v1 + lr * ratio2 * d2
    torch.testing.assert_close(p.detach(), w1 - v2)


def test_lars_zero_weight_uses_unit_ratio():
    p = nn.Parameter(torch.zeros(3))
    opt = LARS([p], lr=0.1, momentum=0.9, weight_decay=0.0)
    p.grad = torch.ones(3)
    opt.step()
    torch.testing.assert_close(p.detach(), -0.1 * torch.ones(3))


def test_excluded_params_get_plain_sgd_momentum():
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3),
        nn.BatchNorm2d(4),
        nn.Conv2d(4, 4, 1, bias=False),
        TwinNorm(4, 2),
        nn.GroupNorm(2, 4),
        nn.Flatten(),
        nn.Linear(4, 3),
    )
    groups = lars_param_groups(model, weight_decay=1e-4)
    assert len(groups) == 2
    decay = {id(p) for p in groups[0]["params"]}
    plain = {id(p) for p in groups[1]["params"]}
    assert decay == {id(model[0].weight), id(model[2].weight), id(model[6].weight)}
    assert plain == {
        id(model[0].bias),
        id(model[1].weight),
        id(model[1].bias),
        id(model[3].weight),
        id(model[3].bias),
        id(model[4].weight),
        id(model[4].bias),
        id(model[6].bias),
    }
    assert groups[0]["weight_decay"] == 1e-4 and groups[0]["lars_adapt"]
    assert groups[1]["weight_decay"] == 0.0 and not groups[1]["lars_adapt"]

    lr, m = 0.3, 0.9
    opt = LARS(groups, lr=lr, momentum=m)
    plain_params = groups[1]["params"]
    start = [p.detach().clone() for p in plain_params]
    gens = torch.Generator().manual_seed(0)
    grads1 = [torch.randn(p.shape, generator=gens) for p in plain_params]
    grads2 = [torch.randn(p.shape, generator=gens) for p in plain_params]
    for grads in (grads1, grads2):
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        for p, g in zip(plain_params, grads):
            p.grad = g.clone()
        opt.step()
    for p, w0, g1, g2 in zip(plain_params, start, grads1, grads2):
        v1 = lr * g1
        v2 = m * v1 + lr * g2
        torch.testing.assert_close(p.detach(), w0 - v1 - v2)
    # same as torch SGD with momentum at a constant lr
    ref = [w.clone().requires_grad_() for w in start]
    sgd = torch.optim.SGD(ref, lr=lr, momentum=m)
    for grads in (grads1, grads2):
        for r, g in zip(ref, grads):
            r.grad = g.clone()
        sgd.step()
    for p, r in zip(plain_params, ref):
        torch.testing.assert_close(p.detach(), r.detach())


def test_lars_trains_a_tiny_regression():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    opt = LARS(lars_param_groups(model, 1e-4), lr=1.0)
    first = None
    for _ in range(50):
        loss = nn.functional.mse_loss(model(x), y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first


def test_warmup_cosine_values():
    total, warm, peak = 1000, 100, 2.0
    assert warmup_cosine(0, total, warm, peak) == 0.0
    assert warmup_cosine(50, total, warm, peak) == pytest.approx(1.0)
    assert warmup_cosine(warm, total, warm, peak) == pytest.approx(peak)
    mid = warm + (total - warm) // 2
    assert warmup_cosine(mid, total, warm, peak) == pytest.approx(peak / 2)
    assert warmup_cosine(total, total, warm, peak) == 0.0
    assert warmup_cosine(total - 1, total, warm, peak) == pytest.approx(
        peak * 0.5 * (1 + math.cos(math.pi * (total - 1 - warm) / (total - warm)))
    )
    assert warmup_cosine(total + 5, total, warm, peak) == 0.0
    assert warmup_cosine(0, total, 0, peak) == peak
    lrs = [warmup_cosine(s, total, warm, peak) for s in range(warm, total + 1)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    with pytest.raises(ValueError):
        warmup_cosine(0, 10, 20, 1.0)


def test_lr_helpers():
    assert scaled_peak_lr(1.0, 512, "none") == 1.0
    assert scaled_peak_lr(1.0, 512, "linear") == 2.0
    assert scaled_peak_lr(0.1, 400, "sqrt") == pytest.approx(2.0)
    with pytest.raises(ValueError):
        scaled_peak_lr(1.0, 512, "cubic")
    p = nn.Parameter(torch.zeros(1))
    opt = LARS([{"params": [p]}, {"params": [nn.Parameter(torch.zeros(1))]}], lr=1.0)
    set_lr(opt, 0.25)
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.25]
