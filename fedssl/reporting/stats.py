"""Confidence for results over a few seeds: a 95 % interval of a mean (Student's t), the
comparison of two lines over the seeds they share (a paired t-test; Welch's t-test where they
share fewer than two), and Holm's step-down correction of a family of such comparisons.

Pairing by seed is the design of the board: seed s of every line starts from the same
initial network, draws the same client sample, and reads the same partition, so the
difference of two lines at seed s removes what the seed alone decides."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as _scipy

LEVEL = 0.95  # the intervals' coverage
ALPHA = 0.05  # the family-wise error rate of a partition's comparisons (Holm)


def interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float] | None:
    """The two-sided ``level`` confidence interval of the mean of ``values`` (Student's t with
    n - 1 degrees of freedom, sample SD); None under two values."""
    n = len(values)
    if n < 2:
        return None
    mean, sd = statistics.mean(values), statistics.stdev(values)
    half = _scipy.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


@dataclass(frozen=True)
class Comparison:
    """``a`` against ``b``: the difference of their means (over the seeds the test used), the
    test's two-sided p-value (None: too few runs to test), which test it was, and for a
    paired test the 95 % interval of the paired difference (unadjusted: one comparison on
    its own, where the p-value a board shows is adjusted over a family)."""

    difference: float
    p: float | None
    test: str  # "paired t" | "Welch t" | "untested"
    n: int  # seeds (paired) or the smaller line's runs (Welch)
    interval: tuple[float, float] | None = None


def compare(a: dict[str, float], b: dict[str, float]) -> Comparison:
    """Line ``a`` against line ``b``, each given as seed -> value: a paired t-test over the
    seeds both have (two or more), else Welch's t-test when each has two runs or more, else
    no test. Paired differences that are all equal are certain (p = 0 if they are not zero,
    1 if they are): the t statistic is then undefined, not the answer."""
    common = sorted(set(a) & set(b))
    if len(common) >= 2:
        diffs = [a[s] - b[s] for s in common]
        mean, ci = statistics.mean(diffs), interval(diffs)
        if max(diffs) - min(diffs) < 1e-12:
            p = 0.0 if abs(mean) > 1e-12 else 1.0
            return Comparison(mean, p, "paired t", len(common), ci)
        p = float(_scipy.ttest_rel([a[s] for s in common], [b[s] for s in common]).pvalue)
        return Comparison(mean, p, "paired t", len(common), ci)
    x, y = list(a.values()), list(b.values())
    difference = statistics.mean(x) - statistics.mean(y) if x and y else math.nan
    if len(x) >= 2 and len(y) >= 2:
        p = float(_scipy.ttest_ind(x, y, equal_var=False).pvalue)
        return Comparison(
            difference, p if math.isfinite(p) else 1.0, "Welch t", min(len(x), len(y))
        )
    return Comparison(difference, None, "untested", min(len(x), len(y)))


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values of a family (None stays None and does not count):
    the i-th smallest of m becomes max over j <= i of min(1, (m - j + 1) p_(j))."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        out[i] = running
    return out
