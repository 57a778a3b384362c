"""Per-test-image predictions of the probes (``predictions.npz``): what the probes return
with them, the file's arrays, types and bytes, and the correctness the board reads back."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
import torch

from fedssl.data import load_npz
from fedssl.eval.predictions import correctness, write_predictions
from fedssl.eval.probes import knn_accuracy, linear_probe
from fedssl.params import KnnParams, LinearProbeParams

CPU = torch.device("cpu")


def blobs(n, seed, sep=1.5):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    return (np.eye(3, 8)[y] * sep + rng.normal(size=(n, 8))).astype(np.float32), y


def test_the_probes_predictions_give_their_accuracy_and_change_nothing():
    """Each probe's per-image classes reproduce its top-1 exactly, and asking for them
    leaves the metrics as they were, bit for bit (same_outputs: metrics.json unchanged)."""
    (xtr, ytr), (xte, yte) = blobs(400, 0), blobs(250, 1)
    p = LinearProbeParams(epochs=3, lr=0.01, batch_size=64)
    predicted: dict = {}
    linear = linear_probe(xtr, ytr, xte, yte, p, CPU, None, predicted)
    knn = knn_accuracy(xtr, ytr, xte, yte, KnnParams(k=5), CPU, chunk=64, predicted=predicted)
    assert linear == linear_probe(xtr, ytr, xte, yte, p, CPU)
    assert knn == knn_accuracy(xtr, ytr, xte, yte, KnnParams(k=5), CPU, chunk=64)
    assert set(predicted) == {"linear_top1", "knn_top1"}
    for key, top1 in (("linear_top1", linear), ("knn_top1", knn)):
        assert predicted[key].shape == yte.shape
        assert 100 * (predicted[key] == yte).mean() == pytest.approx(top1[key], abs=1e-4)
    assert 40 < knn["knn_top1"] < 100  # some right, some wrong: the test means something


def test_the_file_holds_index_label_and_classes_in_small_types_and_same_bytes(tmp_path):
    labels = np.array([3, 1, 4, 1, 5, 9, 2, 6] * 1250, dtype=np.int64)  # 10,000 images
    guess = labels.copy()
    guess[::4] = 0
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    write_predictions(a, labels, {"linear_top1": guess, "knn_top1": labels})
    write_predictions(b, labels, {"linear_top1": guess, "knn_top1": labels})
    assert a.read_bytes() == b.read_bytes()  # no clock in the archive
    arrays = load_npz(a, ("index", "label", "linear_top1", "knn_top1"))
    assert arrays["index"].dtype == np.uint16 and arrays["label"].dtype == np.uint8
    assert arrays["linear_top1"].dtype == np.uint8
    assert (arrays["index"] == np.arange(10_000)).all() and (arrays["label"] == labels).all()
    assert a.stat().st_size < 20_000  # four int64 arrays: 320 KB
    with zipfile.ZipFile(a) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_DEFLATED}
    right = correctness(a, "linear_top1")
    assert right.tolist() == (guess == labels).astype(float).tolist() and right.mean() == 0.75
    assert correctness(a, "knn_top1").mean() == 1.0


def test_predictions_of_another_length_or_a_negative_class_are_refused(tmp_path):
    labels = np.arange(4)
    with pytest.raises(ValueError, match="linear_top1"):
        write_predictions(tmp_path / "p.npz", labels, {"linear_top1": labels[:3]})
    with pytest.raises(ValueError, match="non-negative"):
        write_predictions(tmp_path / "p.npz", labels, {"knn_top1": labels - 1})
    assert not (tmp_path / "p.npz").exists()
