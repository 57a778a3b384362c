"""The Dirichlet partitioner's cut rule as documented (fedssl.data.partition): class c is cut at
floor(n_c * cumsum(p_c)) with the last cut n_c, so a share sum that rounds below 1 leaves the
class's last sample to the last client: stray single samples that the last client collects
(kept: every committed partition was cut this way)."""

from __future__ import annotations

import numpy as np

from fedssl.data import partition as P


def test_a_cut_that_rounds_below_n_lands_one_stray_sample_on_the_last_client():
    # all of the class belongs to client 1, but the cumulative share rounds to 1 - 2^-53
    p = np.array([[0.0, 1.0 - 2**-53, 0.0, 2**-60]])
    counts = P._counts_from_shares(p, np.array([6000]))
    assert counts.tolist() == [[0, 5999, 0, 1]]


def test_at_alpha_0_1_the_last_client_collects_the_single_sample_classes():
    labels = np.repeat(np.arange(10), 6000)
    singles = np.zeros(10)
    for seed in range(10):
        parts = P.dirichlet(labels, 10, 0.1, 0, np.random.default_rng(seed))
        singles += (P.class_counts(labels, parts, 10) == 1).sum(axis=1)
    singles /= 10
    assert singles[-1] > 3 and singles[:-1].max() < 1  # ~3.7 against ~0.4
