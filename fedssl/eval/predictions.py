"""Per-test-image predictions of the probes (``predictions.npz``, committed beside the
evaluation's metrics): each test image's index into the test split, its label, and the class
each probe predicted, under the probe's metric key (``linear_top1``, ``knn_top1``). The board
reads them back as correctness (1 where the prediction is the label) to bootstrap over test
images and to run McNemar's test of two lines on one test set
(:mod:`fedssl.reporting.resampling`).

The arrays take the smallest integer type that holds them (10,000 test images of 10 classes:
2 bytes an index, 1 a class), and the archive is compressed and written with fixed entry
times, so a rerun that predicts the same classes writes the same bytes."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

from fedssl.data import load_npz
from fedssl.stage.runtime import replacing, writing

FILE = "predictions.npz"
INDEX, LABEL = "index", "label"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the zip format's earliest time: no clock in the file


def _small(values: np.ndarray) -> np.ndarray:
    """``values`` (non-negative integers) in the smallest unsigned type that holds them."""
    values = np.asarray(values)
    if values.size and values.min() < 0:
        raise ValueError("indices and classes are non-negative")
    top = int(values.max()) if values.size else 0
    return values.astype(np.min_scalar_type(top))


def write_predictions(path: Path, labels: np.ndarray, predicted: dict[str, np.ndarray]) -> None:
    """``predictions.npz`` at ``path`` (atomically): the test images' ``index`` and ``label``
    and, per metric key, each image's predicted class."""
    labels = np.asarray(labels)
    for key, guess in predicted.items():
        if np.shape(guess) != labels.shape:
            raise ValueError(f"{key}: {np.shape(guess)} predictions for {labels.shape} labels")
    arrays = {INDEX: np.arange(len(labels)), LABEL: labels, **predicted}
    with writing(path), replacing(path) as tmp:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for name, values in arrays.items():
                buffer = io.BytesIO()
                np.lib.format.write_array(buffer, _small(values), allow_pickle=False)
                entry = zipfile.ZipInfo(f"{name}.npy", _EPOCH)
                z.writestr(entry, buffer.getvalue(), zipfile.ZIP_DEFLATED)


def correctness(path: Path, key: str) -> np.ndarray:
    """Per test image (in index order), 1.0 where the probe ``key`` predicted its label, else
    0.0; read through :func:`fedssl.data.load_npz`, which refuses pickles."""
    arrays = load_npz(path, (INDEX, LABEL, key))
    order = np.argsort(arrays[INDEX], kind="stable")
    return (arrays[key][order] == arrays[LABEL][order]).astype(float)
