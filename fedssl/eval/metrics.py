"""Metrics for personalised and clustered FL (cp-cfl spec §5; mpfedcon spec §5).

Classification metrics work on *pooled* predictions: every client's test outputs, each from
its own (cluster or personal) model, concatenated. Per-client AUROC is not used because a
CP-CFL client sees only 4 of 10 classes. F1 and AUROC come from scikit-learn, as the spec
suggests, and so do the clustering metrics (ARI, purity); the relevance score is written out
here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score, f1_score, roc_auc_score
from sklearn.metrics.cluster import contingency_matrix

__all__ = [
    "accuracy",
    "mean_client_accuracy",
    "f1_scores",
    "auroc_scores",
    "classification_metrics",
    "adjusted_rand_index",
    "purity",
    "clusters_used",
    "collapsed",
    "cluster_metrics",
    "relevance_score",
]


# --------------------------------------------------------------------------- classification
def accuracy(y_true, y_pred) -> float:
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    if y_true.shape != y_pred.shape or y_true.size == 0:
        raise ValueError(
            f"need two equal, non-empty label vectors, got {y_true.shape} and {y_pred.shape}"
        )
    return float((y_true == y_pred).mean())


def mean_client_accuracy(y_true: Sequence, y_pred: Sequence, weighted: bool = False) -> float:
    """Mean of per-client test accuracies (CP-CFL); ``weighted`` weights by test-set size
    (FedRep's convention, which MpFedcon reuses), i.e. the pooled accuracy."""
    accs = np.array([accuracy(t, p) for t, p in zip(y_true, y_pred, strict=True)])
    sizes = np.array([len(t) for t in y_true], dtype=np.float64)
    return float(np.average(accs, weights=sizes if weighted else None))


def f1_scores(y_true, y_pred) -> dict[str, float]:
    """F1 averaged over the classes that occur in truth or prediction: plain and by support."""
    return {
        f"f1_{avg}": float(f1_score(y_true, y_pred, average=avg, zero_division=0))
        for avg in ("macro", "weighted")
    }


def _probabilities(probs) -> np.ndarray:
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or (p < 0).any():
        raise ValueError("probs must be a [samples, classes] matrix of softmax outputs")
    # float32 softmax rows sum to 1 only within ~1e-7; scikit-learn insists on sums of 1
    return p / p.sum(axis=1, keepdims=True)


def auroc_scores(y_true, probs) -> dict[str, float]:
    """AUROC one-vs-rest and one-vs-one, each macro and weighted (CP-CFL Tab. 4).

    OvO is Hand & Till's pairwise mean; its weighted form weights a pair by the fraction of
    samples in either class. Every class of ``probs`` must occur in ``y_true``.
    """
    p = _probabilities(probs)
    labels = np.arange(p.shape[1])
    return {
        f"auroc_{mode}_{avg}": float(
            roc_auc_score(y_true, p, multi_class=mode, average=avg, labels=labels)
        )
        for mode in ("ovr", "ovo")
        for avg in ("macro", "weighted")
    }


def classification_metrics(y_true, probs) -> dict[str, float]:
    """Accuracy, F1 (macro, weighted) and the four AUROCs of pooled softmax outputs."""
    y_pred = np.asarray(probs).argmax(axis=1)
    return {
        "accuracy": accuracy(y_true, y_pred),
        **f1_scores(y_true, y_pred),
        **auroc_scores(y_true, probs),
    }


# --------------------------------------------------------------------------- clustering
def _labelings(assign, truth) -> tuple[np.ndarray, np.ndarray]:
    assign, truth = np.asarray(assign), np.asarray(truth)
    if assign.shape != truth.shape or assign.ndim != 1 or assign.size == 0:
        raise ValueError("cluster assignments and true groups must be equal, non-empty 1-D arrays")
    return assign, truth


def adjusted_rand_index(assign, truth) -> float:
    """Hubert & Arabie's ARI (scikit-learn's): 1 for the same partition (any label names),
    ~0 for chance."""
    assign, truth = _labelings(assign, truth)
    return float(adjusted_rand_score(truth, assign))


def purity(assign, truth) -> float:
    """Share of clients that belong to the majority true group of their cluster."""
    assign, truth = _labelings(assign, truth)
    table = contingency_matrix(assign, truth)  # clusters x true groups
    return float(table.max(axis=1).sum() / table.sum())


def clusters_used(assign) -> int:
    return int(np.unique(np.asarray(assign)).size)


def collapsed(assign) -> bool:
    """IFCA's clustering failure: every client picked the same model."""
    return clusters_used(assign) == 1


def cluster_metrics(assign, truth) -> dict[str, float | int | bool]:
    return {
        "ari": adjusted_rand_index(assign, truth),
        "purity": purity(assign, truth),
        "clusters_used": clusters_used(assign),
        "collapsed": collapsed(assign),
    }


# --------------------------------------------------------------------------- relevance
def relevance_score(encoder_features_a, encoder_features_b) -> float:
    """Mean cosine similarity over all cross pairs (CP-CFL Tab. 5: 300 x 300 encodings).

    The mean of all pairwise cosines equals the dot product of the two means of unit
    vectors, so no N x M matrix is formed.
    """
    a, b = (
        torch.as_tensor(f).detach().to("cpu", torch.float64).flatten(1)
        for f in (encoder_features_a, encoder_features_b)
    )
    if a.shape[1] != b.shape[1] or not len(a) or not len(b):
        raise ValueError(
            f"need two non-empty feature sets of one width, got {tuple(a.shape)} "
            f"and {tuple(b.shape)}"
        )
    unit_a = torch.nn.functional.normalize(a, dim=1).mean(0)
    unit_b = torch.nn.functional.normalize(b, dim=1).mean(0)
    return float(unit_a @ unit_b)
