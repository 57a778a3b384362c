"""MpFedcon's data: FEMNIST's letters a-j as a prepared data set (LEAF's json files), FedRep's
cyclic log-normal partition, per-party test splits sized as a fraction of the training data,
and the smoke partition (20 parties x 100 images of S classes, 50 test images each)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from fedssl.data.catalog import load_dataset
from fedssl.data.partition import cyclic_lognormal, deal, split_clients
from fedssl.params import ClientTestSplit, CyclicLognormalScheme, ShardsScheme
from tests.data.test_femnist import pixels
from tests.fixtures import make_tiny_project, run
from tests.formats import LETTER_A, write_leaf_file


def test_femnist_data_set_keeps_the_letters_a_to_j_of_leafs_splits(tmp_path):
    write_leaf_file(
        tmp_path / "data/train/a.json",
        {
            "w0": (pixels(5, 0), [LETTER_A, LETTER_A + 9, 3, LETTER_A + 10, 12]),
            "w1": (pixels(2, 1), [LETTER_A + 4, 61]),
        },
    )
    write_leaf_file(tmp_path / "data/test/a.json", {"w0": (pixels(2, 2), [LETTER_A + 1, 0])})
    splits = load_dataset("femnist", str(tmp_path))
    train, test = splits["train"], splits["test"]
    np.testing.assert_array_equal(train.labels, [0, 9, 4])  # digits, capitals, 'k'-'z' dropped
    np.testing.assert_array_equal(
        train.images[:, 0], pixels(5, 0)[[0, 1]].tolist() + [pixels(2, 1)[0].tolist()]
    )
    np.testing.assert_array_equal(test.labels, [1])
    assert train.images.dtype == np.uint8 and train.images.shape == (3, 1, 28, 28)
    from fedssl.data.sets import DataNotFound

    with pytest.raises(DataNotFound, match="cannot be downloaded"):
        load_dataset("femnist", str(tmp_path), download=True)


def test_cyclic_lognormal_follows_fedreps_class_rule_and_sizes():
    labels = np.repeat(np.arange(10), 400)
    rng = np.random.default_rng(0)
    parts = cyclic_lognormal(labels, 300, 3, 4.0, 1.0, 100.0, rng)
    sizes = np.array([len(p) for p in parts])
    for i in (0, 7, 9, 299):
        counts = np.bincount(labels[parts[i]], minlength=10)
        held = np.flatnonzero(counts)
        assert sorted(held) == sorted({(i + j) % 10 for j in range(3)})
        assert len(set(counts[held])) == 1  # split evenly over its letters
        assert len(np.unique(parts[i])) == len(parts[i])  # no image twice within a party
    # size ~ lognormal(4, 1) + 100, floored to a multiple of 3: median e^4 + 100 - ~1
    assert abs(np.median(sizes) - (np.exp(4.0) + 99)) < 12 and sizes.min() >= 97
    # with 400 images per letter the pools wrap: images are shared only then
    assert np.concatenate(parts).size > 4000
    small = cyclic_lognormal(labels, 10, 3, 2.0, 0.1, 0.0, np.random.default_rng(1))
    every = np.concatenate(small)
    assert len(np.unique(every)) == len(every)  # enough images: all distinct
    with pytest.raises(ValueError, match="classes_per_client=11"):
        cyclic_lognormal(labels, 10, 11, 4.0, 1.0, 100.0, rng)


def test_a_pool_that_runs_out_deals_each_item_once_per_call():
    rng = np.random.default_rng(0)
    pool, cursor = rng.permutation(10), 0
    for _ in range(50):
        items, pool, cursor = deal(pool, cursor, 7, rng)  # wraps every second call or so
        assert len(np.unique(items)) == 7 and sorted(pool) == list(range(10))
    items, _, _ = deal(pool, cursor, 25, rng)  # more than the pool: repeats only then
    assert sorted(np.unique(items)) == list(range(10)) and len(items) == 25


def test_cyclic_lognormal_is_a_partition_scheme():
    scheme = CyclicLognormalScheme(classes_per_client=2, lognormal_mean=3.0, size_offset=10)
    labels = np.repeat(np.arange(4), 100)
    a = split_clients(labels, 6, scheme, seed=3, num_classes=4)
    b = split_clients(labels, 6, scheme, seed=3, num_classes=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert sorted(np.unique(labels[a[5]])) == [1, 2]


def test_client_test_split_takes_a_size_or_a_fraction():
    assert ClientTestSplit(fraction=0.25).per_client is None
    with pytest.raises(ValidationError, match="not both"):
        ClientTestSplit(per_client=10, fraction=0.25)


@pytest.fixture
def tiny(tmp_path):
    return make_tiny_project(tmp_path, git=False)


def test_partition_stage_sizes_test_splits_as_a_fraction_of_training(tiny):
    (tiny / "params/partitions/p.yaml").write_text(
        "dataset: tiny\nnum_clients: 4\nseed: 0\nscheme: {kind: cyclic_lognormal, "
        "classes_per_client: 2, lognormal_mean: 2.5, lognormal_sigma: 0.5, size_offset: 8}\n"
        "client_tests: {fraction: 0.5}\n"
    )
    run(["python", "-m", "stages.prepare_data", "tiny"], tiny)
    run(["python", "-m", "stages.partition", "p"], tiny)
    counts = json.loads((tiny / "artifacts/partitions/p/class_counts.json").read_text())
    for train, test_size in zip(counts["clients"], counts["test_sizes"]):
        assert test_size == round(0.5 * sum(train))
        assert len([c for c in train if c]) == 2


def test_the_smoke_partitions_give_20_parties_100_images_of_s_classes(monkeypatch):
    """The shards scheme on a 2000-image stratified subset: exactly S classes and 100 images
    per party, as the smoke grid needs (the test split then mirrors that mix)."""
    from fedssl.data.client_tests import matching_test_split
    from fedssl.data.partition import class_counts, stratified_subset

    labels = np.repeat(np.arange(10), 6000)
    for s in (2, 5):
        pool = stratified_subset(labels, 2000, 0)
        parts = split_clients(labels[pool], 20, ShardsScheme(classes_per_client=s), 0, 10)
        counts = class_counts(labels, [pool[p] for p in parts], 10)
        assert (counts.sum(1) == 100).all() and ((counts > 0).sum(1) == s).all()
        tests = matching_test_split(counts, np.repeat(np.arange(10), 1000), 50, 0)
        for c, t in zip(counts, tests):
            assert len(t) == 50
            assert (np.bincount(np.repeat(np.arange(10), 1000)[t], minlength=10) == c // 2).all()
