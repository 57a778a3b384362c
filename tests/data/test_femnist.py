"""fedssl/data/sets/femnist.py against tiny data sets written in LEAF's JSON layout."""

from __future__ import annotations

import numpy as np
import pytest

from fedssl.data.sets import DataNotFound
from fedssl.data.sets.femnist import load_femnist, per_user
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
