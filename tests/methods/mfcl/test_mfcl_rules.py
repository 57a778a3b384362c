"""MFCL's defining rules (spec methods/mfcl.md, Alg. 1), each in a test that fails when the rule
changes by one line: phase 1 reconstructs every augmented view from itself, in twin batches
(row k and k + K are two views of one sample); each rServer epoch takes every sample once,
through one of its rho pairs drawn at random, and contrasts that pair's two views."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedssl.data.augment import BatchAugment
from fedssl.fl.cohort import Batch
from fedssl.methods.mfcl import run as mfcl
from tests.methods.mfcl.test_mfcl import tiny_exp, toy_clients

pytestmark = pytest.mark.usefixtures("one_thread")


def test_phase1_reconstructs_each_view_from_itself_in_a_twin_batch():
    """Eq. 1 by hand: BCE-with-logits of g(f([v1; v2])) against [v1; v2], the two views two
    independent augmentations of the same images; padded samples leave as whole pairs."""
    p = tiny_exp().method
    model = mfcl.build_client_module(p, (1, 28, 28), torch.device("cpu")).train()
    images, _, _ = toy_clients()
    gen = torch.Generator().manual_seed(0)
    v1, v2 = mfcl.twin_batch(BatchAugment(p.augment, 28))(images[:6], gen)
    assert not torch.equal(v1, v2)  # two draws, not one view twice
    weights = dict(model.named_parameters())
    valid = torch.tensor([True] * 4 + [False] * 2)
    got = mfcl.autoencoder_loss()(model, weights, {}, Batch((v1, v2), torch.zeros(6), valid))
    with torch.no_grad():
        real = torch.cat([v1[:4], v2[:4]])  # Twin Norm: rows k and k + K are twins
        expected = F.binary_cross_entropy_with_logits(model(real), real)
    assert torch.allclose(got, expected, atol=1e-5)


class Recorder(nn.Module):
    """A stand-in rServer model that keeps every batch it is given."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 4)
        self.seen: list[torch.Tensor] = []

    def forward(self, x):
        self.seen.append(x.detach().clone())
        return self.proj(x.flatten(1))


def test_each_rserver_epoch_takes_every_sample_once_through_one_random_pair():
    """reps[i, r, v] holds (sample i, pair r, view v): every epoch each sample comes once, both
    halves of the batch hold the two views of the same pair, and the pair is drawn anew (all
    rho pairs are used over the epochs, not always the first)."""
    n, rho = 12, 3
    i, r, v = torch.meshgrid(torch.arange(n), torch.arange(rho), torch.arange(2), indexing="ij")
    reps = torch.stack([i, r, v], -1).float().view(n, rho, 2, 3, 1, 1)
    p = tiny_exp().method.rserver.model_copy(update={"epochs": 4, "batch_pairs": 4})
    model = Recorder(3)
    mfcl.train_rserver(model, reps, p)
    steps = mfcl.rserver_steps(n, 4)
    picked = []
    for e in range(4):
        batches = model.seen[e * steps : (e + 1) * steps]
        first = torch.cat([b.chunk(2)[0] for b in batches]).flatten(1)
        second = torch.cat([b.chunk(2)[1] for b in batches]).flatten(1)
        assert sorted(first[:, 0].tolist()) == list(range(n))  # every sample, once
        assert torch.equal(first[:, :2], second[:, :2])  # same sample, same pair
        assert first[:, 2].eq(0).all() and second[:, 2].eq(1).all()  # its two views
        picked += first[:, 1].tolist()
    assert set(picked) == set(range(rho))
