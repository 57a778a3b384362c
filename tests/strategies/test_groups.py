"""FedAvg within groups (IFCA's model pool, FeatARC's clusters): each group's weighted mean
of its own members only; a group with no member this round is left out (its model stays)."""

from __future__ import annotations

import torch

from fedssl.strategies.aggregation import fedavg_by_group


def test_each_group_averages_its_own_members():
    uploads = [{"w": torch.tensor([float(i), 10.0 * i])} for i in range(4)]
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    out = fedavg_by_group(uploads, weights, [2, 0, 2, 0])
    assert list(out) == [0, 2]  # group 1 had no member
    assert torch.allclose(out[0]["w"], torch.tensor([(2 * 1 + 4 * 3) / 6, (20 + 120) / 6]))
    assert torch.allclose(out[2]["w"], torch.tensor([(0 + 3 * 2) / 4, (0 + 60) / 4]))


def test_keys_restrict_what_is_averaged():
    uploads = [{"head": torch.ones(2) * i, "body": torch.ones(2)} for i in range(2)]
    out = fedavg_by_group(uploads, torch.ones(2, dtype=torch.float64), [0, 0], keys=["head"])
    assert list(out[0]) == ["head"] and torch.equal(out[0]["head"], torch.full((2,), 0.5))


def test_a_first_group_with_no_member_is_left_out_too():
    """Cluster 0 empty this round (every client assigned elsewhere): no average for it, so
    the caller keeps its weights; a group index is never added for being the first."""
    uploads = [{"w": torch.tensor([float(i)])} for i in range(3)]
    out = fedavg_by_group(uploads, torch.ones(3, dtype=torch.float64), [1, 2, 1])
    assert list(out) == [1, 2]
    assert torch.equal(out[1]["w"], torch.tensor([1.0])) and torch.equal(
        out[2]["w"], torch.tensor([1.0])
    )
