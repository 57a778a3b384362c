"""The shared evaluations' defining rules against outside implementations on tiny data (each
kills one-line mutants of ``benchmarks/mutants.yaml``, section "shared: evaluations"): the
weighted k-NN against scikit-learn's ``KNeighborsClassifier`` with cosine distance and
weights exp(cos / T), the linear probe against scikit-learn's ``StandardScaler`` fitted on the
training features and ``LogisticRegression``, the evaluate stage's bank and probe training
set (the training split, never the queries), the personalised summary and the clustering
metrics against a hand computation and scikit-learn's ``adjusted_rand_score``."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import adjusted_rand_score
from sklearn.neighbors import KNeighborsClassifier
from sklearn.preprocessing import StandardScaler

from fedssl.eval.personal import PersonalLog, client_outputs, summarize
from fedssl.eval.probes import knn_accuracy, linear_probe
from fedssl.params import KnnParams, LinearProbeParams, PersonalEvalParams

CPU = torch.device("cpu")


def _features(rng, labels, width=6, sep=2.5):
    """Class centres on the first axes plus unit noise: overlapping, so rules show."""
    return np.eye(labels.max() + 1, width)[labels] * sep + rng.normal(size=(len(labels), width))


# ------------------------------------------------------------------ k-NN
@pytest.mark.parametrize("k, t", [(1, 0.07), (5, 0.07), (7, 0.5), (20, 1.0)])
def test_knn_predicts_as_sklearns_cosine_neighbours_voting_exp_cos_over_t(k, t):
    """Rows of norms 0.1 to 10 (cosine, not Euclidean, neighbours; a query's norm must not
    sharpen its votes), queries in chunks of 7: the predictions are scikit-learn's, one for
    one (its cosine distance d = 1 - cos, so a weight exp(cos / T) is exp((1 - d) / T))."""
    rng = np.random.default_rng(0)
    ytr, yte = rng.integers(0, 4, 80), rng.integers(0, 4, 50)
    xtr, xte = (
        (_features(rng, y, sep=1.0) * rng.uniform(0.1, 10, (len(y), 1))).astype(np.float32)
        for y in (ytr, yte)
    )
    sk = KNeighborsClassifier(
        k, metric="cosine", algorithm="brute", weights=lambda d: np.exp((1 - d) / t)
    ).fit(xtr, ytr)
    pred = sk.predict(xte)
    p = KnnParams(k=k, temperature=t)
    assert knn_accuracy(xtr, ytr, xte, pred, p, CPU, chunk=7)["knn_top1"] == 100.0
    assert knn_accuracy(xtr, ytr, xte, yte, p, CPU, chunk=7)["knn_top1"] == pytest.approx(
        100 * (pred == yte).mean()
    )


# ------------------------------------------------------------------ linear probe
def test_the_linear_probe_scores_as_sklearns_regression_on_train_standardised_features():
    """Features on scales 0.1 to 30 around offsets of -40 to 40; a test split of 150 class-0
    and 10 class-1 samples, whose own mean and spread are far from the training split's (so
    standardising it by its own statistics, not the training ones, moves most of it across a
    boundary: scikit-learn scores 41% that way, 95% the right way). The probe agrees with
    scikit-learn's multinomial regression on >= 97% of the test samples and its accuracy is
    within 2 points (measured: 99.4% agreement, 94.4% against 95.0%)."""
    rng = np.random.default_rng(0)
    shift, scale = np.linspace(-40, 40, 6), np.geomspace(0.1, 30, 6)
    ytr, yte = np.repeat([0, 1, 2], 200), np.repeat([0, 1], [150, 10])
    xtr, xte = ((_features(rng, y) * scale + shift).astype(np.float32) for y in (ytr, yte))
    scaler = StandardScaler().fit(xtr)  # the training split's statistics only
    sk = LogisticRegression(C=1e4, max_iter=2000).fit(scaler.transform(xtr), ytr)
    pred = sk.predict(scaler.transform(xte))
    p = LinearProbeParams(epochs=20, lr=0.05, batch_size=64)
    agreement = linear_probe(xtr, ytr, xte, pred, p, CPU)["linear_top1"]
    ours = linear_probe(xtr, ytr, xte, yte, p, CPU)["linear_top1"]
    assert agreement >= 97 and abs(ours - 100 * (pred == yte).mean()) <= 2


# ------------------------------------------------------------------ the evaluate stage
def test_the_evaluate_stage_probes_on_the_training_features_and_scores_the_test_ones(tmp_path):
    """Test labels renamed (y + 1 mod 3) against the training ones: the probes, trained and
    banked on the training features, score ~0 on the test split. Trained or banked on the test
    features themselves, they would score ~100 (each query its own nearest neighbour); scored
    on the training features, ~100 too."""
    from fedssl.evaluations import evaluate

    rng = np.random.default_rng(1)
    ytr, yte = rng.integers(0, 3, 300), rng.integers(0, 3, 120)
    xtr, xte = (_features(rng, y, sep=4.0).astype(np.float32) for y in (ytr, yte))
    np.savez(tmp_path / "features.npz", train_x=xtr, train_y=ytr, test_x=xte, test_y=(yte + 1) % 3)
    exp = SimpleNamespace(
        linear_probe=LinearProbeParams(epochs=5, lr=0.05, batch_size=64), knn=KnnParams(k=5)
    )
    ctx = SimpleNamespace(
        exp=exp,
        device=CPU,
        info={},
        results_dir=tmp_path,
        input=lambda _: tmp_path,
        run=nullcontext,
    )
    evaluate.run(ctx)
    got = ctx.info["metrics"]
    assert got["linear_top1"] < 3 and got["knn_top1"] < 3 and got["linear_train_top1"] > 97


# ------------------------------------------------------------------ personalised evaluation
def _personal_run(tmp_path, rounds=5):
    """Three clients with 3, 8 and 5 test images of 4 pixels, each its own linear model that
    changes every round; returns the npz and the per-round, per-client accuracies by hand."""
    rng = np.random.default_rng(2)
    images = torch.from_numpy(rng.integers(0, 256, (20, 1, 2, 2), dtype=np.uint8))
    labels = torch.from_numpy(rng.integers(0, 3, 20))
    tests = [
        np.array([4, 0, 9]),
        np.array([1, 2, 3, 5, 6, 7, 8, 10]),
        np.array([19, 11, 15, 13, 17]),
    ]
    log, by_hand = PersonalLog({}), []
    for _ in range(rounds):
        weights = torch.from_numpy(rng.normal(size=(3, 4, 3)).astype(np.float32))
        accs, ys, ps = client_outputs(
            lambda c, x, w=weights: x.flatten(1) @ w[c], images, labels, tests, batch=3
        )
        log.record(accs)
        x = images.numpy().reshape(20, 4) / 255.0
        by_hand.append(
            [
                100 * np.mean((x[idx] @ weights[c].numpy()).argmax(1) == labels.numpy()[idx])
                for c, idx in enumerate(tests)
            ]
        )
    log.save(tmp_path / "personal.npz", ys, ps)
    return tmp_path / "personal.npz", np.array(by_hand), [len(t) for t in tests]


def test_personal_accuracy_is_each_clients_own_model_on_its_own_test_images(tmp_path):
    """Client c's model (a different one per client) scores client c's test indices, in
    batches of 3: the accuracies are the hand computation's, client by client and round by
    round (max difference measured: < 1e-12 points)."""
    path, by_hand, _ = _personal_run(tmp_path)
    with np.load(path) as z:
        assert np.abs(z["accuracy"] - by_hand).max() < 1e-9
    assert len(set(map(tuple, by_hand.round(6)))) == len(by_hand)  # rounds differ


def test_personal_summary_is_the_clients_plain_mean_averaged_over_the_last_rounds(tmp_path):
    """The clients' mean is plain (docs: "the clients' mean"), not weighted by their 3, 8 and
    5 test images; ``personal_last2`` averages it over the last 2 of 5 rounds, ``_at_r`` over
    the 2 rounds up to r; the pooled accuracy (all outputs together) is the size-weighted one."""
    path, by_hand, sizes = _personal_run(tmp_path)
    mean = by_hand.mean(1)
    weighted = np.average(by_hand, axis=1, weights=sizes)
    assert np.abs(mean - weighted).min() > 0.5  # the two conventions differ every round
    out = summarize(path, PersonalEvalParams(last_rounds=2, checkpoints=(0.6,)))
    assert out["personal_top1"] == round(mean[-1], 2)
    assert out["personal_last2"] == round(mean[-2:].mean(), 2)
    assert out["personal_best"] == round(mean.max(), 2)
    assert out["personal_at_3"] == round(mean[2], 2)
    assert out["personal_last2_at_3"] == round(mean[1:3].mean(), 2)
    assert out["pooled_top1"] == pytest.approx(weighted[-1] / 100, abs=1e-4)


# ------------------------------------------------------------------ clustering
def test_the_clustering_summary_is_sklearns_ari_of_the_last_rounds_choice(tmp_path):
    """Six clients in two true groups choosing among three models over five rounds: ARI and
    purity of the last round's choice (scikit-learn's ARI; purity by hand: 5 of 6), and the
    groups counted as found from the first round whose choice, and every later one, has
    ARI 1 (round 4 here: rounds 2 and 4-5 recover them, round 3 not)."""
    truth = [0, 0, 0, 1, 1, 1]
    choice = [
        [0, 1, 2, 0, 1, 2],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 1, 1, 1, 1],
        [2, 2, 2, 0, 0, 0],
        [0, 0, 0, 2, 2, 2],
    ]

    def summary(rounds):
        log = PersonalLog({})
        for c in rounds:
            log.record([50.0] * 6, c)
        log.save(tmp_path / "p.npz", [np.arange(3)], [np.eye(3)])
        return summarize(tmp_path / "p.npz", PersonalEvalParams(last_rounds=1), truth)

    found = summary(choice)
    assert found["ari"] == 1.0 and found["purity"] == 1.0 and found["groups_found_at"] == 4
    imperfect = summary(choice[1:] + [[0, 0, 1, 1, 1, 1]])
    assert imperfect["ari"] == round(adjusted_rand_score(truth, [0, 0, 1, 1, 1, 1]), 4)
    assert imperfect["ari"] != round(adjusted_rand_score(truth, choice[1]), 4)
    assert imperfect["purity"] == round(5 / 6, 4) and imperfect["groups_found_at"] is None
    assert imperfect["clusters_used"] == 2
