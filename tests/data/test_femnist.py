"""fedssl.data.femnist against tiny data sets written in LEAF's JSON layout."""

from __future__ import annotations

import numpy as np
import pytest

from fedssl.data.femnist import FemnistSplit, femnist_parties, load_femnist, per_user
from fedssl.data.sources import DataNotFound
from tests.formats import LETTER_A, write_leaf_file


def pixels(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 28, 28), dtype=np.uint8)


@pytest.fixture
def tiny_leaf(tmp_path):
    """Three writers over two train files and one test file; 'f2' appears only in test."""
    data = {
        "train/all_data_0_niid_0_keep_0_train_9.json": {
            "f0": (pixels(3, 0), [LETTER_A, 5, LETTER_A + 9]),
            "f1": (pixels(2, 1), [61, 10]),
        },
        "train/all_data_1_niid_0_keep_0_train_9.json": {"f3": (pixels(1, 2), [LETTER_A + 1])},
        "test/all_data_0_niid_0_keep_0_test_9.json": {
            "f0": (pixels(1, 3), [LETTER_A + 2]),
            "f2": (pixels(2, 4), [0, LETTER_A]),
        },
    }
    for name, users in data.items():
        write_leaf_file(tmp_path / "femnist" / "data" / name, users)
    return tmp_path / "femnist", data


def test_load_reads_pixels_labels_and_writers(tiny_leaf):
    root, data = tiny_leaf
    splits = load_femnist(str(root))
    train, test = splits["train"], splits["test"]
    assert train.user_ids == test.user_ids == ["f0", "f1", "f2", "f3"]
    assert train.images.dtype == np.uint8 and train.images.shape == (6, 1, 28, 28)
    np.testing.assert_array_equal(train.labels, [LETTER_A, 5, LETTER_A + 9, 61, 10, LETTER_A + 1])
    np.testing.assert_array_equal(train.users, [0, 0, 0, 1, 1, 3])
    # k / 255 written as a float comes back as exactly k
    first_file = data["train/all_data_0_niid_0_keep_0_train_9.json"]
    np.testing.assert_array_equal(train.images[:3, 0], first_file["f0"][0])
    np.testing.assert_array_equal(test.users, [0, 2, 2])
    np.testing.assert_array_equal(test.images[1:, 0], pixels(2, 4))


def test_per_user_groups_by_writer(tiny_leaf):
    root, _ = tiny_leaf
    users = per_user(load_femnist(str(root))["train"])
    assert sorted(users) == ["f0", "f1", "f3"]
    images, labels = users["f1"]
    assert images.shape == (2, 1, 28, 28)
    np.testing.assert_array_equal(labels, [61, 10])


def test_data_folder_itself_is_accepted_as_root(tiny_leaf):
    root, _ = tiny_leaf
    assert load_femnist(str(root / "data"))["train"].labels.size == 6


def test_missing_data_says_how_to_get_it(tmp_path):
    with pytest.raises(DataNotFound) as err:
        load_femnist(str(tmp_path / "nowhere"))
    msg = str(err.value)
    assert "nowhere" in msg and "TalwalkarLab/leaf" in msg and "preprocess.sh" in msg


def letters_data(per_letter: int, seed: int = 0) -> dict:
    """In-memory splits with ``per_letter`` images of every letter a-j, plus digits."""
    labels = np.concatenate(
        [np.full(per_letter, LETTER_A + k) for k in range(10)] + [np.arange(10)]
    )
    images = pixels(labels.size, seed)[:, None]
    return {"train": FemnistSplit(images, labels, np.zeros(labels.size, np.int64), ["u"])}


def test_parties_follow_the_fedrep_class_rule_and_90_10_split():
    parties = femnist_parties(
        letters_data(400), num_parties=12, size_offset=0.0, lognormal_mean=3.0, seed=1
    )
    assert parties.images.shape[0] == 4000  # digits dropped, letters relabelled 0-9
    assert set(np.unique(parties.labels)) == set(range(10))
    for i in range(12):
        np.testing.assert_array_equal(parties.classes[i], [i % 10, (i + 1) % 10, (i + 2) % 10])
        train, test = parties.train[i], parties.test[i]
        everything = np.concatenate([train, test])
        counts = np.bincount(parties.labels[everything], minlength=10)
        held = counts[parties.classes[i]]
        assert held[0] == held[1] == held[2] >= 2 and counts.sum() == held.sum()
        assert len(train) == int(0.9 * len(everything) + 1e-9)
        assert len(np.unique(everything)) == len(everything)
    # enough images per letter: no image is given to two parties
    alltrain = np.concatenate(parties.train + parties.test)
    assert len(np.unique(alltrain)) == len(alltrain)


def test_images_keep_their_letter():
    data = letters_data(30)
    parties = femnist_parties(data, num_parties=4, size_offset=0.0, lognormal_mean=2.0)
    source = data["train"]
    for idx in parties.train[0]:
        matches = np.flatnonzero((source.images == parties.images[idx]).all(axis=(1, 2, 3)))
        assert source.labels[matches[0]] - LETTER_A == parties.labels[idx]


def test_party_sizes_are_lognormal_plus_offset():
    # 30 images per letter: pools wrap around, which must still give every party its share
    parties = femnist_parties(letters_data(30), num_parties=600, seed=3)
    sizes = np.array([len(a) + len(b) for a, b in zip(parties.train, parties.test)])
    assert np.all(sizes % 3 == 0)
    # E[lognormal(4, 1)] = e^4.5 = 90.0; minus ~1 for flooring to a multiple of 3
    assert abs(sizes.mean() - (np.exp(4.5) + 100 - 1)) < 20  # sd of the mean ~4.8
    assert abs(np.median(sizes) - (np.exp(4.0) + 100 - 1)) < 10
    assert sizes.min() >= 100 - 3


def test_parties_are_seeded_and_reject_missing_letters():
    a = femnist_parties(letters_data(50), num_parties=5, seed=7)
    b = femnist_parties(letters_data(50), num_parties=5, seed=7)
    c = femnist_parties(letters_data(50), num_parties=5, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a.train, b.train))
    assert not all(np.array_equal(x, y) for x, y in zip(a.train, c.train))
    with pytest.raises(ValueError, match="letter 'k'"):
        femnist_parties(letters_data(50), num_parties=5, letters="abcdefghijk")
