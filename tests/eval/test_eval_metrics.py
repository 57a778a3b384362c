"""fedssl.eval.metrics against numbers worked out by hand (derivations in the comments)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedssl.eval.metrics import (
    accuracy,
    adjusted_rand_index,
    auroc_scores,
    classification_metrics,
    cluster_metrics,
    clusters_used,
    collapsed,
    f1_scores,
    mean_client_accuracy,
    purity,
    relevance_score,
)

# 6 pooled test samples, 3 classes with supports 3, 2, 1
Y = np.array([0, 0, 0, 1, 1, 2])
P = np.array(
    [
        [0.60, 0.30, 0.10],  # a -> 0
        [0.50, 0.20, 0.30],  # b -> 0
        [0.20, 0.50, 0.30],  # c -> 1 (wrong)
        [0.30, 0.60, 0.10],  # d -> 1
        [0.35, 0.40, 0.25],  # e -> 1
        [0.10, 0.30, 0.60],
    ],  # f -> 2
    dtype=np.float32,
)


def test_accuracy_and_f1_by_hand():
    pred = P.argmax(1)
    assert accuracy(Y, pred) == pytest.approx(5 / 6)
    # class 0: P=1, R=2/3 -> F1 0.8; class 1: P=2/3, R=1 -> 0.8; class 2: 1
    f1 = f1_scores(Y, pred)
    assert f1["f1_macro"] == pytest.approx((0.8 + 0.8 + 1) / 3)
    assert f1["f1_weighted"] == pytest.approx((3 * 0.8 + 2 * 0.8 + 1) / 6)


def test_auroc_by_hand():
    # OvR: class 0 scores .6 .5 .2 vs .3 .35 .1 -> 3+3+1 of 9 pairs; class 1 .6 .4 vs .3 .2 .5 .3
    # -> 4+3 of 8; class 2 .6 vs five lower scores -> 1.
    ovr = [7 / 9, 7 / 8, 1.0]
    # OvO (0,1): AUC(0|1) = 4/6, AUC(1|0) = 5/6 -> 0.75; pairs (0,2) and (1,2) separate fully.
    # Weighted OvO weights each pair by the share of samples in it: 5/6, 4/6, 3/6.
    got = auroc_scores(Y, P)
    assert got["auroc_ovr_macro"] == pytest.approx(np.mean(ovr))
    assert got["auroc_ovr_weighted"] == pytest.approx(np.average(ovr, weights=[3, 2, 1]))
    assert got["auroc_ovo_macro"] == pytest.approx((0.75 + 1 + 1) / 3)
    assert got["auroc_ovo_weighted"] == pytest.approx((0.75 * 5 + 4 + 3) / 12)


def test_classification_metrics_bundle_and_float32_rows():
    got = classification_metrics(Y, P)  # float32 rows sum to 1 only approximately
    assert set(got) == {
        "accuracy",
        "f1_macro",
        "f1_weighted",
        "auroc_ovr_macro",
        "auroc_ovr_weighted",
        "auroc_ovo_macro",
        "auroc_ovo_weighted",
    }
    assert got["accuracy"] == pytest.approx(5 / 6)
    perfect = classification_metrics(Y, np.eye(3)[Y] * 0.9 + 0.1 / 3)
    assert all(v == pytest.approx(1.0) for v in perfect.values())


def test_mean_client_accuracy_plain_and_size_weighted():
    truth = [np.array([0, 1]), np.array([2, 2, 2, 2])]
    pred = [np.array([0, 0]), np.array([2, 2, 2, 2])]
    assert mean_client_accuracy(truth, pred) == pytest.approx((0.5 + 1.0) / 2)
    assert mean_client_accuracy(truth, pred, weighted=True) == pytest.approx(5 / 6)


def test_ari_and_purity_by_hand():
    truth = [0, 0, 0, 1, 1, 1]
    assign = [0, 0, 1, 1, 2, 2]
    # pairs together in both: 2; row pairs 3, column pairs 6, all pairs 15
    # expected 3 * 6 / 15 = 1.2, max (3 + 6) / 2 = 4.5 -> (2 - 1.2) / (4.5 - 1.2)
    assert adjusted_rand_index(assign, truth) == pytest.approx(0.8 / 3.3)
    assert purity(assign, truth) == pytest.approx(5 / 6)  # majorities 2 + 1 + 2


def test_cluster_metrics_for_perfect_renamed_and_collapsed_clusterings():
    truth = np.repeat([0, 1, 2], 4)
    renamed = np.repeat([2, 0, 1], 4)
    assert cluster_metrics(renamed, truth) == {
        "ari": 1.0,
        "purity": 1.0,
        "clusters_used": 3,
        "collapsed": False,
    }
    one = np.zeros(12, dtype=int)
    got = cluster_metrics(one, truth)
    assert got["ari"] == pytest.approx(0.0) and got["purity"] == pytest.approx(1 / 3)
    assert got["clusters_used"] == 1 and got["collapsed"] is True
    assert clusters_used([0, 5, 5, 7]) == 3 and not collapsed([0, 5])


def test_purity_counts_each_clusters_majority_and_bad_labelings_are_refused():
    """Purity is not symmetric: the clusters are the first argument (counted by brute force
    here); ARI is, both from scikit-learn."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.integers(0, 4, 30), rng.integers(0, 3, 30)
        majorities = sum(np.bincount(b[a == c]).max() for c in np.unique(a))
        assert purity(a, b) == pytest.approx(majorities / 30)
        assert adjusted_rand_index(a, b) == adjusted_rand_index(b, a)
    for bad in ([], [0, 1, 2]):
        with pytest.raises(ValueError, match="equal, non-empty 1-D"):
            purity(bad, [0, 1])
        with pytest.raises(ValueError, match="equal, non-empty 1-D"):
            adjusted_rand_index(bad, [0, 1])


def test_relevance_score_by_hand():
    a = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert relevance_score(a, [[1.0, 1.0]]) == pytest.approx(2**-0.5)
    # scale does not matter; opposite directions cancel
    assert relevance_score([[2.0, 0.0]], [[1.0, 0.0], [-3.0, 0.0]]) == pytest.approx(0.0)
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(30, 8)), rng.normal(size=(20, 8))
    brute = np.mean([[u @ v / np.linalg.norm(u) / np.linalg.norm(v) for v in y] for u in x])
    assert relevance_score(torch.tensor(x), y) == pytest.approx(brute)
    with pytest.raises(ValueError, match="one width"):
        relevance_score(x, rng.normal(size=(3, 7)))
