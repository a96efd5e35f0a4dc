"""Statistics over seeds: mean ± spread with a 95 % interval, and paired comparisons.

Seeds are the replicates of an experiment: each seed draws a new federation (the data split,
the clients' groups where the scenario draws them) and a new initialisation and sampling, so
runs of two methods *on the same seed* share their federation and are paired.

- `describe`: mean, sample standard deviation (n − 1 in the denominator) and the 95 %
  confidence interval of the mean from Student's t with n − 1 degrees of freedom,
  mean ± t₀.₉₇₅(n−1)·s/√n. One value has no spread and no interval (None).
- `paired`: for methods A and B run on the same seeds, the per-seed differences d = A − B,
  their mean with its 95 % t interval (as `describe` of d), the **paired t-test** of
  "mean difference = 0" (t = mean(d)/(s_d/√n), two-sided, n − 1 degrees of freedom; what
  `scipy.stats.ttest_rel` computes) and, beside it, the exact two-sided **Wilcoxon
  signed-rank** p-value (`scipy.stats.wilcoxon`), which does not assume normal differences
  (with tied |differences|: every sign flip up to 13 pairs, the normal approximation beyond).
  With 3 seeds the smallest possible Wilcoxon p is 0.25: few seeds can show a difference
  only through the t-test, whose normality assumption is then untestable.
- `holm`: Holm's step-down adjustment of the p-values of one family of comparisons (every
  pair of methods of one cell), so "some pair differs" is not found by chance alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

LEVEL = 0.95


@dataclass(frozen=True)
class Described:
    """Mean, spread and 95 % interval of the values of one cell."""

    n: int
    mean: float | None
    std: float | None
    low: float | None
    high: float | None

    def text(self, digits: int | str = 1, scale: float = 1.0) -> str:
        """"81.2 ± 1.3 [79.0, 83.4]" (or "–" without values); `scale` multiplies every value;
        `digits`: decimals, or a format spec (".4g" for an MSE, which may be 1e-5 or 1e37)."""
        if self.mean is None:
            return "–"
        out = number(self.mean * scale, digits)
        if self.std is not None:
            out += f" ± {number(self.std * scale, digits)}"
        if self.low is not None and self.high is not None:
            out += f" [{number(self.low * scale, digits)}, {number(self.high * scale, digits)}]"
        return out


SECONDS = "seconds"
"""`number`'s digits for a duration: one decimal from 0.1 s on, two significant digits below
(0.0258 -> "0.026", not "0.0")."""


def number(value: float, digits: int | str) -> str:
    """`value` with `digits` decimals, or in the format spec `digits` (".4g"), or as a
    duration (`SECONDS`)."""
    if digits == SECONDS:
        return f"{value:.1f}" if abs(value) >= 0.1 else f"{value:.2g}"
    return f"{value:{f'.{digits}f' if isinstance(digits, int) else digits}}"


def _finite(values: Sequence[float | None]) -> np.ndarray:
    xs = np.array([v for v in values if v is not None], dtype=float)
    return xs[np.isfinite(xs)]


def describe(values: Sequence[float | None]) -> Described:
    """Mean, sample std and 95 % t interval of the finite values (None and NaN left out)."""
    xs = _finite(values)
    n = len(xs)
    if n == 0:
        return Described(0, None, None, None, None)
    mean = float(xs.mean())
    if n == 1:
        return Described(1, mean, None, None, None)
    std = float(xs.std(ddof=1))
    half = float(sps.t.ppf(0.5 + LEVEL / 2, n - 1)) * std / math.sqrt(n)
    return Described(n, mean, std, mean - half, mean + half)


@dataclass(frozen=True)
class Paired:
    """A − B on the seeds both finished: the difference's description, the paired t-test
    (`t`, `df`, two-sided `p`) and the exact Wilcoxon signed-rank p-value."""

    n: int
    diff: Described
    t: float | None
    df: int | None
    p: float | None
    p_wilcoxon: float | None

    @property
    def identical(self) -> bool:
        """Every paired difference is 0 (t undefined; nothing to test)."""
        return self.n > 0 and self.diff.mean == 0.0 and not self.diff.std


def paired(a: Sequence[float | None], b: Sequence[float | None]) -> Paired:
    """Paired comparison of a[i] and b[i] (same seed i); pairs with a missing or non-finite
    value are left out. Needs 2 pairs for the t-test; with differences that are all equal
    and not 0, t is ±inf and p = 0 (scipy gives NaN there: no spread at all)."""
    if len(a) != len(b):
        raise ValueError(f"paired: {len(a)} values against {len(b)}")
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None
             and math.isfinite(x) and math.isfinite(y)]
    d = np.array([x - y for x, y in pairs], dtype=float)
    n = len(d)
    diff = describe(list(d))
    if n < 2:
        return Paired(n, diff, None, None, None, None)
    if not np.any(d):  # all zero: no difference to test
        return Paired(n, diff, 0.0, n - 1, 1.0, 1.0)
    if np.all(d == d[0]):  # a constant, non-zero difference: no spread
        t, p = math.copysign(math.inf, float(d[0])), 0.0
    else:
        res = sps.ttest_rel([x for x, _ in pairs], [y for _, y in pairs])
        t, p = float(res.statistic), float(res.pvalue)
    nonzero = d[d != 0]  # Wilcoxon's own convention: zero differences are left out
    # scipy's "auto": the exact null distribution of ranks 1..n without ties; with tied |d|
    # (method="exact" would read that table, too small a p) every sign flip up to 13 pairs,
    # the normal approximation beyond
    w = float(sps.wilcoxon(nonzero, method="auto").pvalue)
    return Paired(n, diff, t, n - 1, p, w)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's adjusted p-values (same order; None stays None): the i-th smallest of m is
    multiplied by m − i, then made non-decreasing and capped at 1."""
    known = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(known)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(known):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out
