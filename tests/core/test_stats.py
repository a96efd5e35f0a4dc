"""`clusterfl.stats` against hand-computed values and against scipy on known numbers."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from clusterfl.stats import describe, holm, paired


def test_describe_by_hand() -> None:
    d = describe([1.0, 2.0, 3.0])
    # mean 2, s = 1, half width t(0.975, 2) · 1/√3 with t(0.975, 2) = 4.302653 (t tables)
    assert (d.n, d.mean, d.std) == (3, 2.0, 1.0)
    assert d.low == pytest.approx(2 - 4.302653 / math.sqrt(3), abs=1e-6)
    assert d.high == pytest.approx(2 + 4.302653 / math.sqrt(3), abs=1e-6)
    assert d.text(1) == "2.0 ± 1.0 [-0.5, 4.5]"
    assert d.text(0, 100.0) == "200 ± 100 [-48, 448]"


def test_describe_matches_scipy_interval_on_known_numbers() -> None:
    xs = [81.2, 79.4, 83.0, 80.1, 82.6]
    d = describe(xs)
    low, high = sps.t.interval(0.95, len(xs) - 1, loc=np.mean(xs), scale=sps.sem(xs))
    assert d.std == pytest.approx(np.std(xs, ddof=1), abs=1e-12)
    assert (d.low, d.high) == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12))


def test_describe_leaves_out_missing_and_nan_and_gives_no_spread_for_one_value() -> None:
    assert describe([None, float("nan"), 4.0]) == describe([4.0])
    one = describe([4.0])
    assert (one.n, one.mean, one.std, one.low, one.high) == (1, 4.0, None, None, None)
    assert one.text() == "4.0"
    assert describe([]).text() == "–"


def test_paired_by_hand() -> None:
    # differences 1, 2, 3: mean 2, s_d 1, t = 2 / (1/√3) = 2√3, df 2
    res = paired([3.0, 4.0, 6.0], [2.0, 2.0, 3.0])
    assert res.n == 3 and res.df == 2
    assert res.t == pytest.approx(2 * math.sqrt(3), abs=1e-12)
    assert res.p == pytest.approx(2 * sps.t.sf(2 * math.sqrt(3), 2), abs=1e-12)
    assert res.p == pytest.approx(0.0741799, abs=1e-6)
    # exact signed-rank: 3 positive ranks; P(W⁺ = 6) = 1/8 on each side → 0.25
    assert res.p_wilcoxon == pytest.approx(0.25, abs=1e-12)
    assert res.diff.mean == 2.0 and res.diff.std == 1.0


def test_paired_matches_scipy_on_known_numbers() -> None:
    a = [0.91, 0.88, 0.93, 0.90, 0.95, 0.89, 0.92]
    b = [0.87, 0.86, 0.92, 0.91, 0.90, 0.85, 0.90]
    res = paired(a, b)
    ref = sps.ttest_rel(a, b)
    assert res.t == pytest.approx(ref.statistic, abs=1e-12)
    assert res.p == pytest.approx(ref.pvalue, abs=1e-12)
    d = np.subtract(a, b)
    assert res.p_wilcoxon == pytest.approx(sps.wilcoxon(d, method="exact").pvalue, abs=1e-12)
    low, high = sps.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
    assert res.diff.low == pytest.approx(low, abs=1e-12)
    assert res.diff.high == pytest.approx(high, abs=1e-12)


def test_paired_edge_cases() -> None:
    same = paired([1.0, 2.0], [1.0, 2.0])
    assert same.identical and same.p == 1.0 and same.t == 0.0
    constant = paired([2.0, 3.0, 4.0], [1.0, 2.0, 3.0])  # always +1: no spread at all
    assert constant.t == math.inf and constant.p == 0.0 and not constant.identical
    missing = paired([1.0, None, 3.0, float("nan")], [0.5, 2.0, 2.0, 1.0])
    assert missing.n == 2  # only the seeds both finished
    one = paired([1.0], [0.0])
    assert one.n == 1 and one.p is None and one.t is None
    with pytest.raises(ValueError, match="3 values against 2"):
        paired([1.0, 2.0, 3.0], [1.0, 2.0])


def test_holm_by_hand() -> None:
    # sorted 0.01, 0.03, 0.04 → 3·0.01, 2·0.03, max(0.06, 1·0.04)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, None, 0.6]) == [pytest.approx(1.0), None, pytest.approx(1.0)]
    assert holm([]) == []


def _signed_rank_p_by_enumeration(d: list[float]) -> float:
    """Two-sided signed-rank p by flipping every sign (2ⁿ equally likely outcomes under H0),
    tied |d| with their mean rank: the exact p, ties or not."""
    ranks = sps.rankdata(np.abs(d))
    centre = ranks.sum() / 2
    seen = abs(ranks[np.asarray(d) > 0].sum() - centre)
    signs = np.array(list(itertools.product([0, 1], repeat=len(d))), dtype=bool)
    sums = np.where(signs, ranks, 0.0).sum(axis=1)
    return float(np.mean(np.abs(sums - centre) >= seen - 1e-9))


def test_paired_wilcoxon_is_exact_when_differences_tie() -> None:
    # A − B = +1, +1, −1, +2 (points): |d| ties (ranks 2, 2, 2, 4), W⁺ = 8, W⁻ = 2; of the 16
    # sign patterns, 4 give W⁻ ≤ 2 and 4 give W⁺ ≤ 2 → p = 8/16 = 0.5 (the no-ties table
    # of ranks 1..4 reads 0.375)
    a, b = [61.0, 72.0, 50.0, 66.0], [60.0, 71.0, 51.0, 64.0]
    res = paired(a, b)
    assert _signed_rank_p_by_enumeration([1.0, 1.0, -1.0, 2.0]) == 0.5
    assert res.p_wilcoxon == pytest.approx(0.5, abs=1e-12)
    # and with a zero difference left out and ties among the rest
    a, b = [3.0, 5.0, 7.0, 9.0, 4.0, 6.0], [2.0, 4.0, 7.0, 6.0, 5.0, 4.0]
    want = _signed_rank_p_by_enumeration([1.0, 1.0, 3.0, -1.0, 2.0])
    assert paired(a, b).p_wilcoxon == pytest.approx(want, abs=1e-12)
