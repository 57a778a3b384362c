"""The shared fine-tune's defining rules (each kills a one-line mutant of
``benchmarks/mutants.yaml``): it learns from the labelled training split and is scored on the
test split, trains in train mode and evaluates in eval mode (the test split never changes the
model), and its rate is warmed up then cosine-annealed step by step over every epoch's steps;
and the board's ViT lines fine-tune on the paper's schedule (docs/results/vit-finetune.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedssl.eval.finetune import finetune
from fedssl.params import FinetuneParams
from fedssl.training.optim import warmup_cosine

CPU = torch.device("cpu")


def shades(n: int, seed: int, labels_shift: int = 0):
    """uint8 [n, 1, 6, 6] images whose class (of 3) is their brightness, so crops and flips keep
    it; labels shifted by ``labels_shift`` (mod 3) from the true class."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = 40 + 80 * y[:, None, None, None] + rng.normal(0, 8, (n, 1, 6, 6))
    return x.clip(0, 255).astype(np.uint8), (y + labels_shift) % 3


def run(encoder, train, test, **params):
    p = FinetuneParams(**{"epochs": 6, "warmup_epochs": 1, "lr": 1e-2, "batch_size": 16, **params})
    return finetune(encoder, train, test, p, CPU)


def test_the_finetune_learns_from_the_train_split_and_is_scored_on_the_test_split():
    # the test split's labels are the train split's shifted by one class: a model that learnt
    # the train split scores ~0 on it; one trained on the test split, or scored on the train
    # split, would score ~100
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Flatten(), nn.Linear(36, 8))
    out = run(encoder, shades(96, 0), shades(60, 1, labels_shift=1), epochs=20, lr=3e-2)
    assert out["finetune_train_top1"] > 90 and out["finetune_top1"] < 10


def bn_encoder():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(36, 8), nn.BatchNorm1d(8))


def test_the_finetune_trains_in_train_mode_and_the_test_split_never_changes_the_model():
    train = shades(96, 0)
    a, b = bn_encoder(), bn_encoder()
    run(a, train, shades(60, 1))
    run(b, train, (shades(60, 2)[0] // 4, shades(60, 2)[1]))  # a darker test split
    bn = a[2]
    assert bn.running_mean.abs().sum() > 0.1  # train mode: the statistics followed the batches
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_the_rate_warms_up_then_anneals_by_step_over_every_epochs_steps(monkeypatch):
    rates = []

    class Recording(torch.optim.AdamW):
        def step(self, closure=None):
            rates.append(self.param_groups[0]["lr"])
            return super().step(closure)

    monkeypatch.setattr(torch.optim, "AdamW", Recording)
    torch.manual_seed(0)
    run(nn.Sequential(nn.Flatten(), nn.Linear(36, 8)), shades(40, 0), shades(20, 1), epochs=3)
    steps = 3 * 3  # 3 epochs of ceil(40 / 16) steps
    assert rates == pytest.approx([warmup_cosine(s, steps, 3, 1e-2) for s in range(steps)])
    assert max(rates) == pytest.approx(1e-2) and rates.index(max(rates)) == 3
