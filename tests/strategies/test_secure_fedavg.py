"""Pairwise-masking secure aggregation keeps weighted FedAvg exact and hides single uploads."""

import pytest
import torch

from fedssl.strategies.secure_fedavg import (
    mask_update,
    pair_mask,
    pair_seed,
    secure_fedavg,
    unmask_sum,
)

N = 10_000


def _clients(m=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    thetas = [torch.randn(N, generator=gen) * 0.1 for _ in range(m)]
    sizes = [int(s) for s in torch.randint(50, 5000, (m,), generator=gen)]
    return thetas, sizes


def test_masked_aggregate_equals_weighted_fedavg():
    thetas, sizes = _clients()
    ids = [3, 7, 11, 12, 40]
    masked = [
        mask_update(t.double() * s, cid, ids, round_seed=5) for t, s, cid in zip(thetas, sizes, ids)
    ]
    agg = unmask_sum(masked) / sum(sizes)
    plain = sum(t.double() * s for t, s in zip(thetas, sizes)) / sum(sizes)
    torch.testing.assert_close(agg, plain, atol=1e-6, rtol=0)
    assert (agg - plain).abs().max().item() < 1e-9
    torch.testing.assert_close(
        secure_fedavg(thetas, sizes, ids, round_seed=5), plain, atol=1e-6, rtol=0
    )


def test_many_clients_with_normalised_weights():
    gen = torch.Generator().manual_seed(1)
    m, n = 30, 2000
    thetas = [torch.randn(n, generator=gen) for _ in range(m)]
    w = torch.rand(m, generator=gen).double()
    w = w / w.sum()
    agg = secure_fedavg(thetas, w.tolist(), list(range(m)), round_seed=9)
    plain = sum(t.double() * wi for t, wi in zip(thetas, w))
    assert (agg - plain).abs().max().item() < 1e-6


def test_single_masked_update_reveals_nothing_obvious():
    thetas, sizes = _clients()
    ids = list(range(5))
    u = thetas[2].double() * sizes[2]
    masked = mask_update(u, 2, ids, round_seed=1)
    r = torch.corrcoef(torch.stack([masked, u]))[0, 1].item()
    assert abs(r) < 0.05
    assert masked.std() > 100 * u.std()
    assert masked.dtype == torch.float64


def test_masks_change_with_round_and_pair():
    a = pair_mask(1, 2, 100, round_seed=0)
    assert torch.equal(a, pair_mask(2, 1, 100, round_seed=0))  # shared by the pair
    assert not torch.allclose(a, pair_mask(1, 2, 100, round_seed=1))
    assert not torch.allclose(a, pair_mask(1, 3, 100, round_seed=0))
    assert pair_seed(1, 2, 0) != pair_seed(1, 2, 0, session_secret="k")
    u = torch.zeros(N, dtype=torch.float64)
    m0 = mask_update(u, 0, [0, 1, 2], round_seed=0)
    m1 = mask_update(u, 0, [0, 1, 2], round_seed=1)
    assert abs(torch.corrcoef(torch.stack([m0, m1]))[0, 1].item()) < 0.05


def test_two_clients_masks_are_opposite():
    u = torch.zeros(10, dtype=torch.float64)
    torch.testing.assert_close(mask_update(u, 4, [4, 9], 3), -mask_update(u, 9, [4, 9], 3))


def test_single_participant_is_unmasked():
    u = torch.randn(10, dtype=torch.float64)
    assert torch.equal(mask_update(u, 1, [1], 0), u)


def test_input_validation():
    u = torch.zeros(4)
    with pytest.raises(ValueError):
        mask_update(u, 5, [1, 2], 0)
    with pytest.raises(ValueError):
        mask_update(u, 1, [1, 1, 2], 0)
    with pytest.raises(ValueError):
        mask_update(torch.zeros(2, 2), 1, [1, 2], 0)
    with pytest.raises(ValueError):
        unmask_sum([])
    with pytest.raises(ValueError):
        secure_fedavg([u], [1.0, 2.0], [0], 0)
