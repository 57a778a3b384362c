"""The data sets' readers (fedssl/data/sets/) against tiny fixtures written in each data set's
real on-disk format."""

import pickle
from pathlib import Path

import numpy as np
import pytest

from fedssl.data.catalog import dataset_spec, datasets, load_dataset
from fedssl.data.sets import DataNotFound, Split
from tests.formats import (
    write_cifar10,
    write_cifar100,
    write_fashion_mnist,
    write_stl10,
    write_tiny_imagenet,
)

RNG = np.random.default_rng(0)


def _pixels(*shape: int) -> np.ndarray:
    return RNG.integers(0, 256, size=shape, dtype=np.uint8)


def _check_split(split: Split, n: int, chw: tuple) -> None:
    assert isinstance(split, Split)
    assert split.images.dtype == np.uint8 and split.images.shape == (n, *chw)
    assert split.labels.dtype == np.int64 and split.labels.shape == (n,)


# --------------------------------------------------------------------------- Fashion-MNIST


def _write_fashion(folder: Path, gz: bool) -> dict:
    data = {
        "train": (_pixels(5, 28, 28), np.array([0, 9, 3, 3, 7])),
        "t10k": (_pixels(3, 28, 28), np.array([1, 2, 9])),
    }
    write_fashion_mnist(folder, data, gz)
    return data


def _check_fashion(splits: dict, data: dict) -> None:
    assert set(splits) == {"train", "test"}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images, labels = data[prefix]
        _check_split(splits[split], len(labels), (1, 28, 28))
        np.testing.assert_array_equal(splits[split].images[:, 0], images)
        np.testing.assert_array_equal(splits[split].labels, labels)


def test_fashion_mnist_flat_gz_layout(tmp_path):
    data = _write_fashion(tmp_path, gz=True)
    _check_fashion(load_dataset("fashion_mnist", str(tmp_path)), data)


def test_fashion_mnist_torchvision_layout_uncompressed(tmp_path):
    data = _write_fashion(tmp_path / "FashionMNIST" / "raw", gz=False)
    _check_fashion(load_dataset("fashion_mnist", str(tmp_path)), data)


def test_idx_fixture_matches_torchvision_reader(tmp_path):
    # Guards the hand-written idx header: torchvision's own parser must agree with it.
    from torchvision.datasets.mnist import read_image_file, read_label_file

    data = _write_fashion(tmp_path, gz=False)
    np.testing.assert_array_equal(
        read_image_file(str(tmp_path / "train-images-idx3-ubyte")).numpy(), data["train"][0]
    )
    np.testing.assert_array_equal(
        read_label_file(str(tmp_path / "train-labels-idx1-ubyte")).numpy(), data["train"][1]
    )


@pytest.mark.parametrize("gz", [True, False])
def test_planning_reads_the_training_size_from_the_idx_header(tmp_path, gz):
    """The partition-size check asks the reader for its raw files' training size (a header,
    no images read); a format without one answers None, and so do missing files."""
    from fedssl.data.catalog import raw_train_size
    from fedssl.params import DatasetParams
    from fedssl.presets import train_size_of

    _write_fashion(tmp_path / "FashionMNIST" / "raw", gz=gz)
    assert raw_train_size("fashion_mnist", str(tmp_path)) == 5
    params = DatasetParams(name="fashion_mnist", data_root=str(tmp_path))
    assert train_size_of(params, tmp_path / "not_prepared") == 5
    assert raw_train_size("fashion_mnist", str(tmp_path / "nowhere")) is None
    assert raw_train_size("cifar10", str(tmp_path)) is None


def test_fashion_mnist_missing(tmp_path):
    with pytest.raises(DataNotFound) as err:
        load_dataset("fashion_mnist", str(tmp_path / "nowhere"))
    msg = str(err.value)
    assert "fashion_mnist" in msg and "nowhere" in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "download: true" in msg


REAL_FASHION = Path(dataset_spec("fashion_mnist").root)


@pytest.mark.skipif(
    not (REAL_FASHION / "train-images-idx3-ubyte.gz").is_file(),
    reason="dataset-fashion-mnist not installed",
)
def test_real_fashion_mnist():
    splits = load_dataset("fashion_mnist")
    spec = dataset_spec("fashion_mnist")
    _check_split(splits["train"], spec.train_size, spec.shape)
    _check_split(splits["test"], 10000, (1, 28, 28))
    counts = np.bincount(splits["train"].labels, minlength=spec.classes)
    np.testing.assert_array_equal(counts, np.full(10, 6000))
    assert splits["train"].images.max() == 255


# --------------------------------------------------------------------------- CIFAR


@pytest.mark.parametrize("name, writer", [("cifar10", write_cifar10), ("cifar100", write_cifar100)])
def test_cifar(tmp_path, name, writer):
    data = writer(tmp_path)
    splits = load_dataset(name, str(tmp_path))
    assert set(splits) == {"train", "test"}
    for split, (images, labels) in data.items():
        _check_split(splits[split], len(labels), dataset_spec(name).shape)
        assert splits[split].images.flags["C_CONTIGUOUS"]
        np.testing.assert_array_equal(splits[split].images, images)
        np.testing.assert_array_equal(splits[split].labels, labels)


def test_cifar_fixture_has_real_pickle_keys(tmp_path):
    write_cifar10(tmp_path)
    with open(tmp_path / "cifar-10-batches-py" / "data_batch_1", "rb") as f:
        batch = pickle.load(f, encoding="bytes")  # how the CIFAR web page says to read the files
    assert {b"data", b"labels"} <= set(batch) and batch[b"data"].dtype == np.uint8


def test_cifar_missing_file_named(tmp_path):
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "batches.meta").unlink()
    with pytest.raises(DataNotFound, match="batches.meta"):
        load_dataset("cifar10", str(tmp_path))


@pytest.mark.parametrize(
    "name, folder",
    [
        ("cifar10", "cifar-10-batches-py"),
        ("cifar100", "cifar-100-python"),
        ("stl10", "stl10_binary"),
    ],
)
def test_torchvision_sets_missing(tmp_path, name, folder):
    with pytest.raises(DataNotFound) as err:
        load_dataset(name, str(tmp_path))
    msg = str(err.value)
    assert name in msg and str(tmp_path / folder) in msg
    assert f"params/datasets/{name}.yaml" in msg and "download: true" in msg


# --------------------------------------------------------------------------- STL-10


def test_stl10(tmp_path):
    data = write_stl10(tmp_path)
    splits = load_dataset("stl10", str(tmp_path))
    assert set(splits) == {"train", "test", "unlabeled"}
    for split, (images, labels) in data.items():
        _check_split(splits[split], len(images), dataset_spec("stl10").shape)
        np.testing.assert_array_equal(splits[split].images, images)
        expected = np.full(len(images), -1) if labels is None else labels - 1
        np.testing.assert_array_equal(splits[split].labels, expected)


def test_stl10_column_major_orientation(tmp_path):
    data = write_stl10(tmp_path)
    raw = np.fromfile(tmp_path / "stl10_binary" / "test_X.bin", dtype=np.uint8)
    # Byte (channel c, column x, row y) of image 0 sits at c*96*96 + x*96 + y.
    c, y, x = 2, 5, 70
    assert raw[c * 96 * 96 + x * 96 + y] == data["test"][0][0, c, y, x]
    assert (
        load_dataset("stl10", str(tmp_path))["test"].images[0, c, y, x]
        == raw[c * 96 * 96 + x * 96 + y]
    )


# --------------------------------------------------------------------------- Tiny-ImageNet

# wnids.txt lists these deliberately unsorted; a class index follows the sorted order
COLOURS = {"n03": (30, 30, 200), "n01": (200, 30, 30), "n02": (30, 200, 30)}
TRAIN = [("n01", 2), ("n02", 1), ("n03", 2)]
VAL = ["n02", "n03", "n01", "n03"]


def _write_tiny(base: Path, val_sorted: bool) -> tuple[list, list]:
    return write_tiny_imagenet(base, TRAIN, VAL, COLOURS, val_sorted, grey=("n02",))


def _check_tiny(splits: dict, train: list, val: list, val_sorted: bool) -> None:
    index = {w: i for i, w in enumerate(sorted(COLOURS))}
    assert set(splits) == {"train", "test"}
    _check_split(splits["train"], len(train), dataset_spec("tiny_imagenet").shape)
    _check_split(splits["test"], len(val), dataset_spec("tiny_imagenet").shape)
    np.testing.assert_array_equal(splits["train"].labels, [index[w] for w in train])
    expected_val = sorted(val) if val_sorted else val  # ImageFolder form is read class by class
    np.testing.assert_array_equal(splits["test"].labels, [index[w] for w in expected_val])
    # JPEG is lossy: only check each image is close to its solid colour (catches channel order).
    # n02 was saved grey and converted to RGB, so all three channels are equal there.
    for images, wnids in ((splits["train"].images, train), (splits["test"].images, expected_val)):
        for image, wnid in zip(images, wnids):
            mean = image.reshape(3, -1).mean(axis=1)
            if wnid == "n02" and images is splits["train"].images:
                assert np.ptp(mean) < 2
            else:
                np.testing.assert_allclose(mean, COLOURS[wnid], atol=6)


def test_tiny_imagenet_official_layout(tmp_path):
    train, val = _write_tiny(tmp_path / "tiny-imagenet-200", val_sorted=False)
    _check_tiny(load_dataset("tiny_imagenet", str(tmp_path)), train, val, val_sorted=False)


def test_tiny_imagenet_root_is_folder_and_val_sorted(tmp_path):
    train, val = _write_tiny(tmp_path / "tin", val_sorted=True)
    _check_tiny(load_dataset("tiny-imagenet", str(tmp_path / "tin")), train, val, val_sorted=True)


def test_tiny_imagenet_missing(tmp_path):
    with pytest.raises(DataNotFound) as err:
        load_dataset("tiny_imagenet", str(tmp_path))
    msg = str(err.value)
    assert "tiny_imagenet" in msg and str(tmp_path) in msg and "tiny-imagenet-200.zip" in msg


# --------------------------------------------------------------------------- general


def test_unknown_name_lists_known():
    with pytest.raises(ValueError) as err:
        load_dataset("imagenet21k")
    for name in datasets():
        assert name in str(err.value)


def test_default_roots():
    assert issubclass(DataNotFound, FileNotFoundError)
    assert all(
        spec.root == f"data/{name}" for name, spec in datasets().items() if name != "fashion_mnist"
    )
