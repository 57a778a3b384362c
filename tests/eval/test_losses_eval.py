"""NT-Xent against its definition, and the probes on features with known answers."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from fedssl.eval.probes import extract_features, knn_accuracy, linear_probe
from fedssl.losses import nt_xent
from fedssl.params import KnnParams, LinearProbeParams

CPU = torch.device("cpu")


def nt_xent_by_definition(z1, z2, t):
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    n = len(z1)
    total = 0.0
    for i in range(2 * n):
        pos = (i + n) % (2 * n)
        sims = [math.exp(float(z[i] @ z[k]) / t) for k in range(2 * n) if k != i]
        total += -math.log(math.exp(float(z[i] @ z[pos]) / t) / sum(sims))
    return total / (2 * n)


def test_nt_xent_matches_its_definition():
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    assert abs(nt_xent(z1, z2, 0.5).item() - nt_xent_by_definition(z1, z2, 0.5)) < 1e-5


def test_nt_xent_padding_mask_equals_the_unpadded_batch():
    g = torch.Generator().manual_seed(1)
    z1, z2 = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    valid = torch.tensor([True, True, False, True, False, True])
    masked = nt_xent(z1, z2, 0.3, valid)
    assert torch.allclose(masked, nt_xent(z1[valid], z2[valid], 0.3), atol=1e-6)
    z1.requires_grad_(True)
    nt_xent(z1, z2, 0.3, valid).backward()
    assert torch.isfinite(z1.grad).all() and z1.grad[~valid].abs().max() == 0


def test_nt_xent_rewards_aligned_views():
    z = torch.randn(32, 16, generator=torch.Generator().manual_seed(2))
    assert nt_xent(z, z, 0.5) < nt_xent(z, torch.randn(32, 16), 0.5)


def blobs(n, dim, seed, sep=4.0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    centers = np.eye(3, dim) * sep
    return (centers[y] + rng.normal(size=(n, dim))).astype(np.float32), y


def test_linear_probe_separates_blobs_and_not_noise():
    xtr, ytr = blobs(600, 10, 0)
    xte, yte = blobs(300, 10, 1)
    p = LinearProbeParams(epochs=20, lr=0.01, batch_size=64)
    assert linear_probe(xtr, ytr, xte, yte, p, CPU)["linear_top1"] > 97
    shuffled = np.random.default_rng(2).permutation(ytr)
    acc = linear_probe(xtr, shuffled, xte, yte, p, CPU)["linear_top1"]
    assert acc < 50  # labels unrelated to the features: near chance (33%)


def test_knn_votes_by_nearest_neighbours():
    train = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], dtype=np.float32)
    labels = np.array([0, 0, 1, 1])
    test = np.array([[1, 0.2], [0.2, 1]], dtype=np.float32)
    assert (
        knn_accuracy(train, labels, test, np.array([0, 1]), KnnParams(k=2), CPU)["knn_top1"]
        == 100.0
    )
    assert (
        knn_accuracy(train, labels, test, np.array([1, 0]), KnnParams(k=2), CPU)["knn_top1"] == 0.0
    )


def test_extract_features_uses_eval_mode_and_all_images():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.9))
    images = np.random.default_rng(0).integers(0, 256, (10, 1, 2, 2), dtype=np.uint8)
    feats = extract_features(model, images, batch_size=3, device=CPU)
    assert feats.shape == (10, 4) and feats.dtype == np.float32
    assert np.allclose(feats, images.reshape(10, 4) / 255.0, atol=1e-6)  # dropout off
