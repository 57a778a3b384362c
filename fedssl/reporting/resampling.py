"""Test-image noise: intervals from a two-level bootstrap over runs and their test images,
and McNemar's exact test of two lines on one test set, both read from per-test-image
correctness (an array of 0/1 per run: 1 where the model's top-1 is the image's label).

A run is one array of its test images' correctness (a probe or k-NN on the shared test split)
or a list of arrays, one per client (personal evaluation: each client's model on its own test
images). The bootstrap resamples every level: the runs (seeds and the partitions they drew),
then within a run its images, or its clients and then each client's images; its accuracy is
the mean over images, or over clients of each client's mean, as the board reports it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _scipy

DRAWS = 2000


Run = np.ndarray | Sequence[np.ndarray]  # images, or clients -> images


def _stack(runs: Sequence[Sequence[Run]]) -> list:
    """Lines' runs aligned (line -> runs) into runs of tuples: each leaf an array of shape
    (lines, images), so one resampling of indices serves every line (paired on the test set)."""

    def zip_level(nodes):
        if _is_images(nodes[0]):
            arrays = [np.asarray(n, dtype=float) for n in nodes]
            if len({a.shape for a in arrays}) != 1:
                raise ValueError("lines compared on one test set need the same test images")
            return np.stack(arrays)
        if len({len(n) for n in nodes}) != 1:
            raise ValueError("lines compared on one test set need the same clients")
        return [zip_level([n[i] for n in nodes]) for i in range(len(nodes[0]))]

    if len({len(r) for r in runs}) != 1:
        raise ValueError("lines compared on one test set need the same runs (seeds)")
    return [zip_level([line[i] for line in runs]) for i in range(len(runs[0]))]


def _is_images(node) -> bool:
    """A run's (or a client's) test images: an array, or a list of 0/1 numbers, where a list
    of arrays is clients (of as many images each as they hold)."""
    return isinstance(node, np.ndarray) or (len(node) > 0 and np.isscalar(node[0]))


def _accuracy(node, rng: np.random.Generator | None) -> np.ndarray:
    """A node's accuracy per line (mean over its children), its children resampled with
    replacement when ``rng`` is given."""
    if isinstance(node, np.ndarray):
        n = node.shape[1]
        idx = rng.integers(0, n, n) if rng is not None else slice(None)
        return node[:, idx].mean(axis=1)
    idx = rng.integers(0, len(node), len(node)) if rng is not None else range(len(node))
    return np.mean([_accuracy(node[i], rng) for i in idx], axis=0)


@dataclass(frozen=True)
class Bootstrap:
    """A statistic in points (accuracy, or line a minus line b), its two-level bootstrap
    standard error and percentile interval."""

    estimate: float
    se: float
    interval: tuple[float, float]


def two_level_bootstrap(
    a: Sequence[Run],
    b: Sequence[Run] | None = None,
    draws: int = DRAWS,
    seed: int = 0,
    level: float = 0.95,
) -> Bootstrap:
    """Line ``a``'s accuracy in points (its runs, each its per-test-image correctness), or
    ``a`` minus ``b`` on the same runs and test images (paired: one resampling serves both),
    with the interval of a bootstrap that resamples the runs, then within each its images
    (or its clients, then their images)."""
    lines = [a] if b is None else [a, b]
    root = _stack(lines)
    sign = np.array([1.0]) if b is None else np.array([1.0, -1.0])
    rng = np.random.default_rng(seed)
    estimate = 100 * float(_accuracy(root, None) @ sign)
    values = 100 * np.array([_accuracy(root, rng) @ sign for _ in range(draws)])
    tail = (1 - level) / 2
    lo, hi = np.quantile(values, [tail, 1 - tail])
    return Bootstrap(estimate, float(values.std(ddof=1)), (float(lo), float(hi)))


@dataclass(frozen=True)
class McNemar:
    """Two lines on one run's test images: images only ``a`` gets right, only ``b`` does, and
    the exact two-sided p-value (binomial on the discordant images)."""

    only_a: int
    only_b: int
    p: float


def mcnemar(a: np.ndarray, b: np.ndarray) -> McNemar:
    """McNemar's exact test of two models' correctness on the same test images."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"the two lines' test images differ: {a.shape} and {b.shape}")
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    n = only_a + only_b
    p = 1.0 if n == 0 else float(_scipy.binomtest(only_a, n, 0.5).pvalue)
    return McNemar(only_a, only_b, p)


def mcnemar_per_seed(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, McNemar]:
    """McNemar's test per seed both lines ran (seed -> its test images' correctness)."""
    return {s: mcnemar(a[s], b[s]) for s in sorted(set(a) & set(b))}


def personal_correctness(labels: np.ndarray, probs: np.ndarray, client: np.ndarray) -> list:
    """A personalised run's per-test-image correctness, one array per client, from the arrays
    of the ``personal.npz`` its step wrote (:class:`fedssl.eval.personal.PersonalLog`: each test
    image's label, the final model's softmax outputs and its client; read them with
    :func:`fedssl.data.load_npz`, which refuses pickles): the run's input to
    :func:`two_level_bootstrap`. Its accuracy is the final round's, where the board reads the
    mean over the last rounds."""
    right = (probs.argmax(1) == labels).astype(float)
    return [right[client == c] for c in range(int(client.max()) + 1 if client.size else 0)]
