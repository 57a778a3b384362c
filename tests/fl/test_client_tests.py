"""Per-client test splits mirroring training class mixes, and true CP-CFL groups."""

from __future__ import annotations

import numpy as np
import pytest

from fedssl.data.client_tests import (
    class_group_of_client,
    groups_from_counts,
    matching_test_split,
    proportional_counts,
)
from fedssl.data.partition import class_counts, class_groups

GROUPS = [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]


def balanced_labels(per_class: int, classes: int = 10) -> np.ndarray:
    return np.repeat(np.arange(classes), per_class)


def cpcfl_counts(clients: int = 12, seed: int = 0) -> np.ndarray:
    train = balanced_labels(100)
    parts = class_groups(train, clients, GROUPS, 2, 20, 5, np.random.default_rng(seed))
    return class_counts(train, parts, 10)


def test_proportional_counts_hand_computed():
    np.testing.assert_array_equal(proportional_counts([20, 20, 5, 5, 0], 50), [20, 20, 5, 5, 0])
    np.testing.assert_array_equal(proportional_counts([0, 250, 0, 250], 50), [0, 25, 0, 25])
    # 7 * [30, 10] / 40 = [5.25, 1.75]: floors [5, 1], the spare one to the larger remainder
    np.testing.assert_array_equal(proportional_counts([30, 10, 0], 7), [5, 2, 0])
    # equal remainders and counts: lower class ids first
    np.testing.assert_array_equal(proportional_counts([10, 10, 10], 2), [1, 1, 0])
    # 3 * [1, 3, 2] / 6 = [0.5, 1.5, 1.0]: equal remainders, the bigger class wins the spare
    np.testing.assert_array_equal(proportional_counts([1, 3, 2], 3), [0, 2, 1])
    np.testing.assert_array_equal(proportional_counts([0, 0], 0), [0, 0])
    with pytest.raises(ValueError, match="no training samples"):
        proportional_counts([0, 0], 3)


def test_cpcfl_test_sets_mirror_the_20_20_5_5_training_counts():
    counts = cpcfl_counts()
    test_labels = balanced_labels(80)
    for per_client in (None, 50):
        parts = matching_test_split(counts, test_labels, per_client, seed=1)
        for client, idx in enumerate(parts):
            assert idx.dtype == np.int64 and len(idx) == 50
            assert len(np.unique(idx)) == len(idx)  # no repeats within a client
            np.testing.assert_array_equal(
                np.bincount(test_labels[idx], minlength=10), counts[client]
            )


def test_mpfedcon_style_rescaling_to_50_images_per_party():
    counts = np.zeros((3, 10), np.int64)
    counts[0, [2, 7]] = 250
    counts[1, [0, 1, 9]] = [60, 30, 10]  # 50 * [0.6, 0.3, 0.1]
    counts[2, 4] = 500
    test_labels = balanced_labels(100)
    parts = matching_test_split(counts, test_labels, per_client=50, seed=0)
    got = np.stack([np.bincount(test_labels[p], minlength=10) for p in parts])
    expected = np.zeros((3, 10), np.int64)
    expected[0, [2, 7]] = 25
    expected[1, [0, 1, 9]] = [30, 15, 5]
    expected[2, 4] = 50
    np.testing.assert_array_equal(got, expected)


def test_clients_sample_independently_unless_asked_for_disjoint_sets():
    counts = cpcfl_counts()
    test_labels = balanced_labels(60)  # class 3 is needed by 8 clients: ~100 images > 60
    shared = matching_test_split(counts, test_labels, seed=2)
    together = np.concatenate(shared)
    assert len(np.unique(together)) < len(together)  # independent draws overlap

    roomy = balanced_labels(200)
    disjoint = matching_test_split(counts, roomy, seed=2, replace_across_clients=False)
    together = np.concatenate(disjoint)
    assert len(np.unique(together)) == len(together) == 600
    with pytest.raises(ValueError, match="left"):
        matching_test_split(counts, test_labels, seed=2, replace_across_clients=False)


def test_split_is_seeded_and_checks_its_inputs():
    counts = cpcfl_counts()
    test_labels = balanced_labels(80)
    a = matching_test_split(counts, test_labels, seed=5)
    b = matching_test_split(counts, test_labels, seed=5)
    c = matching_test_split(counts, test_labels, seed=6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    with pytest.raises(ValueError, match="needs 20 test images of class"):
        matching_test_split(counts, balanced_labels(10), seed=0)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        matching_test_split(counts, np.array([0, 11]), seed=0)


def test_true_groups_match_class_groups_assignment():
    counts = cpcfl_counts(clients=15, seed=3)
    expected = np.repeat([0, 1, 2], 5)
    np.testing.assert_array_equal(class_group_of_client(15, 3), expected)
    np.testing.assert_array_equal(groups_from_counts(counts, GROUPS), expected)
    with pytest.raises(ValueError, match="divisible"):
        class_group_of_client(10, 3)


def test_groups_from_counts_refuses_ambiguous_or_foreign_clients():
    only_shared_class = np.zeros((1, 10), np.int64)
    only_shared_class[0, 3] = 5  # class 3 is in groups 0 and 1
    with pytest.raises(ValueError, match="several"):
        groups_from_counts(only_shared_class, GROUPS)
    mixed = np.zeros((1, 10), np.int64)
    mixed[0, [0, 9]] = 5
    with pytest.raises(ValueError, match="no class groups"):
        groups_from_counts(mixed, GROUPS)
