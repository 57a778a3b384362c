"""Confidence for results over a few seeds: a 95 % interval of a mean (Student's t), the
comparison of two lines over the seeds they share (a paired t-test; Welch's t-test where they
share fewer than two), Holm's step-down and Benjamini-Hochberg's step-up adjustment of a
family of such comparisons, a linear model of many lines' runs whose contrasts borrow the
variance of every line (:class:`LineModel`), and the minimum detectable effect of a test.

Pairing by seed is the first board's design: seed s of every line starts from the same
initial network, draws the same client sample, and reads the same partition, so the
difference of two lines at seed s removes what the seed alone decides."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import optimize as _optimize
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


def benjamini_hochberg(pvalues: Sequence[float | None]) -> list[float | None]:
    """Benjamini-Hochberg adjusted p-values (the false-discovery rate of a screening; None
    stays None and does not count): the k-th smallest of m becomes min over j >= k of
    min(1, m p_(j) / j)."""
    tested = sorted(((p, i) for i, p in enumerate(pvalues) if p is not None), reverse=True)
    out: list[float | None] = [None] * len(pvalues)
    running = 1.0
    for k, (p, i) in enumerate(tested):
        running = min(running, len(tested) * p / (len(tested) - k))
        out[i] = running
    return out


@dataclass(frozen=True)
class Contrast:
    """Line ``a`` minus line ``b`` under a linear model of the runs: the difference of their
    estimated means, its standard error and degrees of freedom, the two-sided p-value and
    the unadjusted 95 % interval."""

    difference: float
    se: float
    df: int
    p: float
    interval: tuple[float, float]

    def mde(self, alpha: float = ALPHA, power: float = 0.8) -> float:
        """The minimum detectable effect: the true difference this contrast's two-sided t-test
        at level ``alpha`` detects with probability ``power`` (the noncentral t's answer)."""
        return minimum_detectable(self.se, self.df, alpha, power)


def minimum_detectable(se: float, df: int, alpha: float = ALPHA, power: float = 0.8) -> float:
    """The smallest true difference that a two-sided t-test of standard error ``se`` with
    ``df`` degrees of freedom at level ``alpha`` rejects with probability ``power``."""
    if se == 0.0:
        return 0.0
    crit = _scipy.t.ppf(1 - alpha / 2, df)

    def shortfall(nc: float) -> float:  # in units of se: the noncentrality
        return _scipy.nct.sf(crit, df, nc) + _scipy.nct.sf(crit, df, -nc) - power

    # power at crit + t_power is about `power`; twice that is beyond it
    upper = 2 * (crit + _scipy.t.ppf(power, df)) + 1
    return se * float(_optimize.brentq(shortfall, 0.0, upper))


class LineModel:
    """A linear model of runs (line, block, value): each line its own mean (fixed) and, when
    ``blocked``, each block its own shift (a seed, or a seed with the partition it drew, shared
    by every line run on it: the fixed-effect form of a random block intercept, which on a
    balanced grid gives the same line contrasts). The residual variance is pooled over all
    lines (``df`` = runs - parameters), so a contrast of two lines of three runs each borrows
    the other lines' runs to know its noise."""

    def __init__(self, runs: Sequence[tuple[str, str, float]], blocked: bool = False):
        import numpy as np

        self.lines = list(dict.fromkeys(line for line, _, _ in runs))
        blocks = list(dict.fromkeys(block for _, block, _ in runs))[1:] if blocked else []
        x = np.zeros((len(runs), len(self.lines) + len(blocks)))
        for row, (line, block, _) in enumerate(runs):
            x[row, self.lines.index(line)] = 1.0
            if block in blocks:
                x[row, len(self.lines) + blocks.index(block)] = 1.0
        y = np.array([v for _, _, v in runs])
        self._beta, *_ = np.linalg.lstsq(x, y, rcond=None)
        self.df = len(runs) - int(np.linalg.matrix_rank(x))
        residual = y - x @ self._beta
        self.variance = float(residual @ residual / self.df) if self.df > 0 else math.nan
        self._inverse = np.linalg.pinv(x.T @ x)

    def contrast(self, a: str, b: str, level: float = LEVEL) -> Contrast | None:
        """Line ``a`` minus line ``b`` (None: the model has no residual degrees of freedom)."""
        import numpy as np

        if self.df < 1:
            return None
        c = np.zeros(len(self._beta))
        c[self.lines.index(a)], c[self.lines.index(b)] = 1.0, -1.0
        difference = float(c @ self._beta)
        se = math.sqrt(self.variance * float(c @ self._inverse @ c))
        if se == 0.0:
            p = 0.0 if abs(difference) > 1e-12 else 1.0
            return Contrast(difference, se, self.df, p, (difference, difference))
        p = float(2 * _scipy.t.sf(abs(difference) / se, self.df))
        half = float(_scipy.t.ppf(0.5 + level / 2, self.df)) * se
        return Contrast(difference, se, self.df, p, (difference - half, difference + half))
