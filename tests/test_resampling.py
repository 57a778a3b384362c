"""Test-image noise: the two-level bootstrap and McNemar's test on per-test-image
correctness, against answers known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedssl.reporting import resampling


def _exact(accuracy: float, n: int) -> np.ndarray:
    """n test images of which exactly ``accuracy`` are right."""
    return (np.arange(n) < round(accuracy * n)).astype(float)


def test_mcnemar_counts_the_discordant_images_and_tests_them_exactly():
    """10 images only a gets right, 2 only b: p = 2 (C(12,0) + C(12,1) + C(12,2)) / 2^12."""
    a = np.array([1] * 10 + [0] * 2 + [1] * 30 + [0] * 8)
    b = np.array([0] * 10 + [1] * 2 + [1] * 30 + [0] * 8)
    got = resampling.mcnemar(a, b)
    assert (got.only_a, got.only_b) == (10, 2)
    assert got.p == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert resampling.mcnemar(a, a).p == 1.0
    with pytest.raises(ValueError, match="test images differ"):
        resampling.mcnemar(a, b[:-1])
    per_seed = resampling.mcnemar_per_seed({"0": a, "1": a, "2": a}, {"0": b, "1": a})
    assert list(per_seed) == ["0", "1"] and per_seed["1"].p == 1.0


def test_between_run_spread_dominates_when_runs_differ_and_images_are_many():
    """Runs at 50, 70 and 90 % on 20,000 images each: resampling the runs gives the SD of a
    mean of three draws from them, sqrt(pvar / 3) = 9.43 points; the images add ~0.2."""
    runs = [_exact(p, 20000) for p in (0.5, 0.7, 0.9)]
    got = resampling.two_level_bootstrap(runs, draws=4000)
    assert got.estimate == pytest.approx(70.0)
    assert got.se == pytest.approx(100 * math.sqrt(np.var([0.5, 0.7, 0.9]) / 3), rel=0.05)


def test_image_noise_is_in_the_interval_when_runs_agree():
    """Four runs all at 80 % of 500 images: the spread left is the images', sqrt(0.16 / 2000)
    = 0.89 points (a one-level bootstrap over runs would say 0)."""
    runs = [_exact(0.8, 500) for _ in range(4)]
    got = resampling.two_level_bootstrap(runs, draws=3000)
    assert got.estimate == pytest.approx(80.0)
    assert got.se == pytest.approx(100 * math.sqrt(0.16 / 2000), rel=0.1)
    assert got.interval[0] < 80.0 < got.interval[1]


def test_personalised_runs_resample_clients_then_their_images():
    """One run of 10 clients, five all right and five all wrong (50 images each): the images
    of a client add nothing, the clients give sqrt(0.25 / 10) = 15.8 points."""
    run = [np.ones(50) if i % 2 else np.zeros(50) for i in range(10)]
    got = resampling.two_level_bootstrap([run], draws=3000)
    assert got.estimate == pytest.approx(50.0)
    assert got.se == pytest.approx(100 * math.sqrt(0.25 / 10), rel=0.1)


def test_a_difference_on_one_test_set_is_paired():
    """b is a with 5 of its 500 right images flipped on each of three runs: the difference is
    exactly 1 point and every resampling keeps it near (the shared images cancel); lines of
    different images or runs are refused."""
    rng = np.random.default_rng(0)
    a = [(rng.random(500) < 0.7).astype(float) for _ in range(3)]
    b = []
    for run in a:
        flipped = run.copy()
        flipped[np.flatnonzero(run)[:5]] = 0.0
        b.append(flipped)
    got = resampling.two_level_bootstrap(a, b, draws=2000)
    assert got.estimate == pytest.approx(1.0)
    assert got.se < 0.5 and got.interval[0] > 0.0
    assert resampling.two_level_bootstrap(a, a, draws=200).interval == (0.0, 0.0)
    with pytest.raises(ValueError, match="same test images"):
        resampling.two_level_bootstrap(a, [r[:-1] for r in b])
    with pytest.raises(ValueError, match="same runs"):
        resampling.two_level_bootstrap(a, b[:2])


def test_a_personalised_runs_images_come_from_its_personal_record(tmp_path):
    """personal.npz (labels, softmax outputs, client per test image, as PersonalLog writes it)
    gives one correctness array per client, in the record's order."""
    from fedssl.data import load_npz
    from fedssl.eval.personal import PersonalLog

    labels = [np.array([0, 1, 1]), np.array([2, 2])]
    probs = [np.eye(3)[[0, 0, 1]], np.eye(3)[[2, 1]]]  # client 0: 2 of 3 right; client 1: 1 of 2
    log = PersonalLog({})
    log.record([66.7, 50.0])
    log.save(tmp_path / "personal.npz", labels, probs)
    record = load_npz(tmp_path / "personal.npz", ("labels", "probs", "client"))
    got = resampling.personal_correctness(**record)
    assert [a.tolist() for a in got] == [[1.0, 0.0, 1.0], [1.0, 0.0]]
    assert resampling.two_level_bootstrap([got], draws=50).estimate == pytest.approx(
        100 * (2 / 3 + 1 / 2) / 2
    )
