"""The local schedule's rule (fedssl.fl.cohort.client_batches): every epoch is a seeded
shuffle of the client's samples cut into K = ceil(n / B) near-equal batches, the step count of
the reference code's full-batch loaders (B-sized batches, the last one short) with sizes that
differ by at most one sample."""

from __future__ import annotations

import numpy as np
import pytest

from fedssl.fl.cohort import client_batches


@pytest.mark.parametrize(
    "n,batch,sizes",
    [
        (600, 64, [60] * 10),  # a DataLoader would give 9 x 64 + 24
        (70, 64, [35, 35]),
        (128, 64, [64, 64]),  # a multiple of B: full batches either way
        (65, 64, [33, 32]),
        (5, 64, [5]),
    ],
)
def test_an_epoch_is_ceil_n_over_b_batches_of_near_equal_size(n, batch, sizes):
    got = client_batches(np.arange(n), batch, 1, 0)
    assert [len(b) for b in got] == sizes
    assert len(got) == -(-n // batch)  # K: the reference loader's step count
    assert max(sizes) <= batch and max(sizes) - min(sizes) <= 1


def test_each_epoch_is_its_own_seeded_shuffle_of_every_sample():
    idx = np.arange(100, 190)
    epochs = client_batches(idx, 32, 2, 7, "client", 3)
    assert len(epochs) == 6
    first, second = np.concatenate(epochs[:3]), np.concatenate(epochs[3:])
    assert sorted(first) == sorted(second) == list(idx)
    assert not np.array_equal(first, second)  # a fresh order per epoch
    again = client_batches(idx, 32, 2, 7, "client", 3)
    assert all(np.array_equal(a, b) for a, b in zip(epochs, again))
    other = client_batches(idx, 32, 2, 7, "client", 4)
    assert not np.array_equal(np.concatenate(other[:3]), first)
