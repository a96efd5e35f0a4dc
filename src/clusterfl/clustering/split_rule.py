"""CFL's split rules (Sattler et al. 2020, Algorithm 5 lines 14-18): does a cluster split along
the optimal bipartition of its clients' update similarities this round?

`clusterfl.algorithms.cfl` measures every cluster (`ClusterView.measure`: norms, cosine
similarities, Algorithm 1's bipartition, its cohesion, the stationarity ratio) and asks its
`SplitRule` for a `Decision`; the rule never changes anything itself: a decision says what
becomes of the cluster's rule state (`AutoNodeState`), and the method applies it.

- `EpsilonRule`, the paper's: ‖Δθ_c‖ < ε1 (eq. (30)), max_i ‖Δθ_i‖ > ε2 (eq. (31)), and the
  γ test of eq. (36) on the bipartition.
- `AutoRule`, ours (`split_rule = "auto"`, options `[algorithm.auto]`, `AutoRuleConfig`): no
  scale-dependent threshold; the paper's quantities as ratios and means of cosines. The
  candidate is Algorithm 1's cut, or, when that leaves a side below `min_side`, Algorithm 1's
  cut of the updates minus the cluster mean (`centred_cut`). The cluster splits when every
  condition of `CONDITIONS` holds (each a small predicate, named after what it checks), the
  cut is beyond noise (`contrasting`, and `significant`: beyond its shuffled cosines, at a
  stricter level when every client of the cluster answered; every cluster since issue 36,
  the root only before), and all of it in `patience` consecutive
  rounds whose cuts are unions of the same blocks (`meet`). A failed condition resets the
  streak; a round whose cut is not shown beyond noise neither counts nor resets it (rule v2,
  issue 36). docs/cfl.md explains each condition and tells how the rule came to
  be; docs/transfer.md gives the evidence of the transfer grid.

Every reason a cluster does not split is a `Refusal`; its value is the text the history
writes (`CFLExtras.refused`), and `Refusal.read` turns such a text back into the member.

The auto rule's conditions, their constants and the evidence for them: `TABLE`
(`clusterfl.clustering.split_rule_table`).
"""

from __future__ import annotations

import math
import re
import string
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Literal, TypedDict

import numpy as np
import torch
from pydantic import ConfigDict, Field, field_validator

from clusterfl.clustering.aggregate import weighted_mean
from clusterfl.clustering.cosine import (
    SHUFFLE_DRAWS,
    SHUFFLE_DRAWS_RANGE,
    SHUFFLE_MIN,
    Bipartition,
    BipartitionMethod,
    Cohesion,
    bipartition,
    cohesion,
    combined_floor,
    combined_pvalue,
    cross_cosine,
    gamma_bound,
    gamma_criterion,
    pairwise_cosine,
    shuffle_pvalue,
    stationarity_ratio,
)
from clusterfl.clustering.split_rule_table import TABLE
from clusterfl.config_util import Settings, changed_fields

PAIR_PATIENCE = 2
"""A cluster of two clients needs this many times `patience` rounds (its 1 | 1 cut is the same
every round, so the consistency of the cut is no evidence)."""

PAIR_NORM = 0.25
"""Both client update norms of a pair must exceed this × the run's largest cluster mean
update norm (the paper's ε2 = 2.5 ε1 with its rule of thumb ε1 = max_t ‖Δθ_c‖ / 10)."""


class AutoRuleConfig(Settings):
    """`[algorithm.auto]`: the options of CFL's auto split rule (module docstring, docs/cfl.md)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    stationarity_max: float = Field(
        0.7, gt=0.0, le=1.0, description="split only if ‖mean update‖ / mean client update "
        "norm is below this")
    separation: float = Field(
        0.5, ge=0.0, le=1.0, description="... and the mean cross similarity of the optimal "
        "bipartition is below this × the smaller mean within-side similarity")
    min_side: int = Field(
        2, ge=1, description="... and each side of the bipartition has at least this many "
        "clients")
    contrast_min: float = Field(
        0.0, ge=0.0, description="0 = off; ... and the contrast of the two sides (their mean "
        "directions' distance over what updates without a common direction would give, minus "
        "1) exceeds this (not for a 1 | 1 split of a pair)")
    progress: float = Field(
        0.0, ge=0.0, lt=1.0, description="0 = off (the default since CFL rule v6); split only "
        "once the cluster's mean local training loss is below (1 - progress) × the reference "
        "of progress_from (FL has left the plateau of the untrained model; 0.05 in rules "
        "v1-v5)")
    progress_from: Literal["uniform", "first"] = Field(
        "uniform", description="the reference loss of progress: 'uniform', ln C, the "
        "cross-entropy of a uniform guess over the model's C outputs (no condition for a "
        "model with one output, a regression); 'first', the first round's mean training loss "
        "(rule v1, which blocked for good a federation whose joint loss cannot fall)")
    nesting: bool = Field(
        False, description="on: ... and, for a cluster made by an earlier split, the "
        "bipartition sets its sides apart (larger within mean minus cross mean) more than that "
        "split set the cluster apart from its sibling (off by default since issue 36: in a "
        "hierarchy of groups the later, correct cuts are narrower)")
    significance: float = Field(
        0.002, ge=0.0, lt=1.0, description="... and the candidate's contrast has a "
        "shuffle-test p-value below this in a round in which every client of the cluster "
        "answered (every cluster, or the root only: test_every): Algorithm 1 finds a cut as "
        "contrasting on the cosine matrix with its entries shuffled in fewer than this "
        "fraction of null_draws shuffles; a round that fails this neither counts for patience "
        "nor resets it (0 = off; 0.002 with 999 draws: no shuffle reaches the cut)")
    significance_sampled: float = Field(
        0.01, gt=0.0, lt=1.0, description="the level instead of significance in a round in "
        "which some of the cluster's clients did not answer (a sample, a dropout): the rounds "
        "of a streak then test different clients (significance = 0 turns both off)")
    sampled_evidence: Literal["combined", "each"] = Field(
        "combined", description="in a round in which some of the cluster's clients did not "
        "answer: 'combined' (rule v7), the round counts for patience whatever its p-value, "
        "and the split needs Fisher's combination of the p-values of the streak's last "
        "patience tested rounds below significance_sampled (each round tests another "
        "sample); 'each' (rules v5, v6), each such round needs p < significance_sampled "
        "to count")
    null_draws: int = Field(
        SHUFFLE_DRAWS, description="shuffled matrices of the significance test, 19 to 99999 "
        "(the smallest p-value is 1 / (1 + null_draws))")
    patience: int = Field(
        3, ge=1, description="... in this many consecutive rounds of the cluster, with "
        "bipartitions that are all unions of the same blocks of >= min_side clients")
    test_every: bool = Field(
        True, description="the significance test for every cluster (default since issue 36, "
        "instead of nesting); false: the root only")
    cut: Literal["raw", "centred", "fallback"] = Field(
        "fallback", description="the candidate bipartition: Algorithm 1 (complete linkage with "
        "bipartition = 'complete') on the clients' update cosines ('raw', the paper), on the "
        "cosines of the updates minus the cluster's "
        "mean update ('centred'), or the raw cut unless a side is below min_side, then the "
        "centred one ('fallback'); the conditions read the raw cosines either way")

    @field_validator("null_draws")
    @classmethod
    def _draws_in_range(cls, value: int) -> int:
        """At least 19 shuffles (p down to 0.05), at most 99999 (there was no bound: each draw
        is one more cut of every tested cluster in every round)."""
        low, high = SHUFFLE_DRAWS_RANGE
        if not low <= value <= high:
            raise ValueError(f"allowed: {low}..{high} (the smallest p-value is 1 / (1 + "
                             f"null_draws), {1 / (1 + low):g} to {1 / (1 + high):g})")
        return value

    def too_few_draws(self) -> list[str]:
        """A warning per level the shuffle test's smallest p-value, 1 / (1 + null_draws), is
        not below (under "combined", Fisher's combination of `patience` of them for
        `significance_sampled`): the test would never pass there, unsaid."""
        if self.significance == 0:
            return []
        combined = self.sampled_evidence == "combined"
        tests = (("significance", "a round in which every client of a cluster answered",
                  lambda least: least),
                 ("significance_sampled", "a sampled round" + (
                     f" (Fisher's combination of {self.patience})" if combined else ""),
                  lambda least: combined_pvalue([least] * self.patience) if combined
                  else least))
        out = []
        for name, where, smallest in tests:
            level, p = getattr(self, name), smallest(1 / (1 + self.null_draws))
            if p >= level:
                low, high = SHUFFLE_DRAWS_RANGE  # the fewest draws that pass: bisection
                while low < high:
                    mid = (low + high) // 2
                    low, high = (low, mid) if smallest(1 / (1 + mid)) < level else (mid + 1, high)
                out.append(f"algorithm.auto.null_draws = {self.null_draws}: the smallest "
                           f"p-value in {where} is {p:.3g}, not below algorithm.auto.{name} "
                           f"= {level:g}: the shuffle test never passes there; allowed: "
                           f"null_draws >= {low}")
        return out

    def hopeless(self, n: int, sampled: bool) -> tuple[float, float] | None:
        """(the floor, the level) where the shuffle test of `n` answering clients (n ≥ 2) can
        never pass, its exact p-value never below the level of the round (`sampled`: some of
        the cluster's clients did not answer); the floor is `shuffle_floor(n)`, or, sampled
        under "combined", Fisher's combination of `patience` such floors (`combined_floor`);
        None where it can, or is off."""
        if self.significance == 0:
            return None
        together = sampled and self.sampled_evidence == "combined"
        floor = combined_floor([n] * (self.patience if together else 1))
        level = self.significance_sampled if sampled else self.significance
        return (floor, level) if floor >= level else None

    def switched_off(self) -> list[str]:
        """A warning per option set that another option turns off (it would do nothing)."""
        off = {"progress_from": ("progress", "the progress condition"),
               **{o: ("significance", "the shuffle test") for o in
                  ("significance_sampled", "sampled_evidence", "null_draws")}}
        return [f"algorithm.auto.{o} = {getattr(self, o)!r} does nothing: algorithm.auto.{by} "
                f"= 0 turns {what} off" for o, (by, what) in off.items()
                if getattr(self, by) == 0 and o in changed_fields(self)]


class Refusal(Enum):
    """Why a cluster did not split in a round; the value is the history's text (a template
    where it holds numbers: `text` fills it in, `read` parses it back)."""

    FEW_ANSWERED = "fewer than 2 clients answered"
    WARM_UP = "warm-up"
    SMALL_CLUSTER = "fewer than min_split_size clients answered"
    MEAN_NORM = "mean norm ≥ eps1"  # epsilon rule, eq. (30)
    MAX_NORM = "max norm ≤ eps2"  # epsilon rule, eq. (31)
    GAMMA = "gamma"  # eq. (36), both rules
    FEW_FOR_SIDES = "fewer than 2 × min_side clients answered"
    NO_PROGRESS = "no progress: loss ≥ {bar:g} × {reference}"
    NOT_STATIONARY = "not stationary"
    SMALL_SIDE = "side below min_side"
    NOT_SEPARATED = "sides not separated"
    NOT_COHESIVE = "sides not cohesive"
    NOT_NESTED = "sides less apart than when the cluster formed"
    NO_CONTRAST = "sides not apart beyond noise"
    PAIR_NORMS = "pair: client updates below {share:g} × peak"
    PAIR_DRIFTING = "pair: cluster still drifting"
    NOT_SIGNIFICANT = "cut not beyond shuffled cosines"
    #: NOT_SIGNIFICANT where the cluster's answering clients are too few for any cut to pass
    #: (the words before " (" as NOT_SIGNIFICANT's, which tables of reasons group by)
    TOO_FEW_TO_SHUFFLE = ("cut not beyond shuffled cosines ({n} clients never reach p < "
                          "{level:g}: exact p ≥ {floor:.3g})")
    NOT_SIGNIFICANT_TOGETHER = "cuts of the streak not beyond shuffled cosines together"
    #: NOT_SIGNIFICANT_TOGETHER where the streak's rounds had too few answering clients (their
    #: counts, `sizes`) for Fisher's combination ever to pass (`combined_floor`)
    TOO_FEW_TOGETHER = ("cuts of the streak not beyond shuffled cosines together (rounds of "
                        "{sizes} clients never reach p < {level:g}: exact p ≥ {floor:.3g})")
    PATIENCE = "patience {streak}/{need}"

    def text(self, **values: float | str) -> str:
        """The history's text, with the template's numbers filled in (others are ignored)."""
        return self.value.format(**values)

    @classmethod
    def read(cls, text: str) -> tuple[Refusal, dict[str, str]]:
        """The member whose text `text` is, and the numbers of its template (as written);
        ValueError for a text no member writes."""
        text = _LEGACY.get(text, text)
        for member, pattern in _PATTERNS.items():
            found = pattern.fullmatch(text)
            if found:
                return member, found.groupdict()
        raise ValueError(f"not a CFL refusal reason: {text!r}")


def _pattern(template: str) -> re.Pattern[str]:
    parts = [re.escape(literal) + (f"(?P<{name}>.+?)" if name else "")
             for literal, name, _, _ in string.Formatter().parse(template)]
    return re.compile("".join(parts))


_PATTERNS = {member: _pattern(member.value) for member in Refusal}
_LEGACY = {"root: cut not beyond shuffled cosines": Refusal.NOT_SIGNIFICANT.value,
           "fewer than min_split_size clients": Refusal.SMALL_CLUSTER.value}
"""Texts of older histories: before the test covered every cluster (issue 36); before the
refusal said that min_split_size counts the clients that answered (2026-11-29)."""


class CFLSplitEvent(TypedDict, total=False):
    """The split test of one cluster in one round (an entry of `CFLExtras.splits`): `node`,
    `alpha_cross_max`, `gamma_bound` and `accepted` always; the rest only for an accepted split
    (`children` … `similarity` written by the method, `stationarity` … `p_value` by the auto
    rule). (`total=False` rather than `NotRequired`: with postponed annotations Python 3.11
    would count `NotRequired` keys as required.)"""

    node: int  # the tree node (cluster) tested
    alpha_cross_max: float  # α_cross^max of its optimal bipartition
    gamma_bound: float  # sqrt((1 − α_cross^max)/2): the largest γ_max that accepts it (eq. 36)
    accepted: bool  # whether the split passed the γ test and happened
    children: list[int]  # the two new nodes
    groups: list[list[int]]  # the clients of each new node
    members: list[int]  # the clients whose updates were compared
    similarity: list[list[float]]  # their cosine similarities (5 digits)
    stationarity: float  # the stationarity ratio when it split
    within: list[float]  # the two sides' within-cosine means
    cross: float  # the cross-cosine mean
    contrast: float  # the contrast of the two sides (`Cohesion.contrast`)
    streak: int  # consecutive rounds the test had passed
    p_value: float | None  # shuffle-test p-value of the contrast (the root; None: not tested)


# ---------------------------------------------------------------------------- what a rule sees


@dataclass(frozen=True)
class ClusterView:
    """One cluster (tree node) in one round, as the split rules see it: its answering
    `members`, their updates (rows of `updates`, aggregation `weights`), and what follows."""

    node: int
    size: int  # the node's clients, answering or not
    members: np.ndarray
    updates: torch.Tensor
    weights: np.ndarray
    mean: torch.Tensor  # the weighted mean update Δθ_c (eq. (2))
    mean_norm: float  # ‖Δθ_c‖ (eq. (30))
    max_norm: float  # max_i ‖Δθ_i‖ (eq. (31))
    min_norm: float  # min_i ‖Δθ_i‖
    similarity: np.ndarray | None  # α of eq. (40) (None: fewer than two members)
    split: Bipartition | None  # the candidate bipartition
    cohesion: Cohesion | None  # its within-side and cross means
    stationarity: float = math.nan  # ‖Σ w_i Δθ_i‖ / Σ w_i ‖Δθ_i‖ (NaN: all updates zero)
    #: ᾱ − ᾱ_× of this node's side when the split that made it happened (None: the root)
    formed: float | None = None
    loss: float = math.nan  # the members' mean local training loss (NaN: none reported)
    drift: float = math.nan  # cosine of Δθ_c with the node's previous mean update (auto rule)
    peak: float = 0.0  # the run's largest cluster mean update norm so far (auto rule)
    first_loss: float | None = None  # the first round's mean training loss (auto rule)
    method: BipartitionMethod = "optimal"  # how `split` was found (the centred cut, the shuffles)

    @property
    def pair(self) -> bool:
        """A cluster of exactly two clients, both answering: the only case in which the auto
        rule lets a side hold a single client."""
        return self.size == 2 and len(self.members) == 2

    @property
    def sampled(self) -> bool:
        """Some of the cluster's clients did not answer this round (a sample, a dropout)."""
        return len(self.members) < self.size

    @staticmethod
    def measure(node: int, size: int, members: np.ndarray, updates: torch.Tensor,
                weights: np.ndarray, method: BipartitionMethod = "optimal",
                formed: float | None = None, loss: float = math.nan) -> ClusterView:
        """The view of the `members` (client ids) whose updates are the rows of `updates`."""
        if len(members) == 0:  # nobody of this cluster answered: the model stays
            zero = torch.zeros(updates.shape[1], dtype=updates.dtype, device=updates.device)
            return ClusterView(node, size, members, updates, np.zeros(0), zero, 0.0, 0.0, 0.0,
                               None, None, None, formed=formed, loss=loss, method=method)
        mean = weighted_mean(updates, weights)
        norms = torch.linalg.vector_norm(updates.double(), dim=1)
        sim, split, coh = None, None, None
        if len(members) >= 2:
            sim = pairwise_cosine(updates)
            split = bipartition(sim, method)
            coh = cohesion(sim, split.first, split.second)
        return ClusterView(node, size, members, updates, weights, mean,
                           float(torch.linalg.vector_norm(mean.double())), float(norms.max()),
                           float(norms.min()), sim, split, coh,
                           stationarity_ratio(updates, weights), formed, loss, method=method)


def within_max(c: Cohesion) -> float:
    """The larger within-side mean (a side of one client counts as 1, as in `within_min`)."""
    sides = [w for w in (c.within_first, c.within_second) if not math.isnan(w)]
    return max(sides) if len(sides) == 2 else 1.0


def within_min(c: Cohesion) -> float:
    """The smaller within-side mean; a side of one client counts as 1 (α_ii = 1, the
    convention of eq. (19)), so only `min_side` keeps single clients from splitting off."""
    sides = [w for w in (c.within_first, c.within_second) if not math.isnan(w)]
    return min(sides) if sides else 1.0


def apart(c: Cohesion) -> float:
    """How far a bipartition sets its sides apart: the larger within mean minus the cross
    mean (what `nested` compares, now and when a cluster formed)."""
    return within_max(c) - c.cross


# ---------------------------------------------------------------------------- state


@dataclass
class AutoNodeState:
    """What the auto rule remembers of one cluster (tree node) between rounds."""

    streak: int = 0  # consecutive rounds its test passed with consistent bipartitions ...
    candidate: list[list[int]] | None = None  # ... the blocks all those cuts are unions of
    last_mean: torch.Tensor | None = None  # its mean update of the last round it had members
    #: the shuffle p-values of the streak's tested rounds (the last `patience`; rule v7) ...
    evidence: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # ... and their answering clients


@dataclass
class RuleState:
    """What a split rule keeps between rounds (the epsilon rule: nothing but the first loss)."""

    first_loss: float | None = None  # mean training loss of the first round with a finite one
    peak: float = 0.0  # the largest cluster mean update norm ‖Δθ_c‖ so far (auto rule)
    nodes: dict[int, AutoNodeState] = field(default_factory=dict)  # auto rule, by node id


@dataclass(frozen=True)
class Decision:
    """A rule's verdict on one cluster: split (`refusal` None) or why not; the split test to
    record (`event`, None: none), the shuffle p-value (NaN: not tested) and the cluster's new
    rule state (`node`; None: unchanged — after a split the method drops it)."""

    refusal: Refusal | None = None
    reason: str | None = None  # the refusal's text in the history
    event: CFLSplitEvent | None = None
    p_value: float = math.nan
    node: AutoNodeState | None = None

    @property
    def splits(self) -> bool:
        return self.refusal is None


# ---------------------------------------------------------------------------- the rules


@dataclass(frozen=True, kw_only=True)
class SplitRule(ABC):
    """When a cluster splits. `decide` applies what both rules share (someone to compare, the
    warm-up, the smallest cluster that splits) and then the rule's own `test`."""

    gamma_max: float = 0.0
    warmup_rounds: int = 0
    min_split_size: int = 2

    def observe(self, state: RuleState, round_loss: float | None,
                views: Sequence[ClusterView]) -> tuple[RuleState, list[ClusterView]]:
        """Before the round's decisions: the state after this round's updates were seen, and
        the views with what the rule adds to them. Here: the first round's loss only."""
        if state.first_loss is None:
            state = replace(state, first_loss=round_loss)
        return state, list(views)

    def decide(self, v: ClusterView, state: RuleState, t: int) -> Decision:
        """The verdict on cluster `v` in round `t`."""
        if v.split is None:
            return self.refuse(Refusal.FEW_ANSWERED)
        if t <= self.warmup_rounds:
            return self.refuse(Refusal.WARM_UP)
        if len(v.members) < self.min_split_size:
            return self.refuse(Refusal.SMALL_CLUSTER)
        return self.test(v, state, t)

    @abstractmethod
    def test(self, v: ClusterView, state: RuleState, t: int) -> Decision:
        """The rule's own test of a cluster with a candidate bipartition."""

    def refuse(self, refusal: Refusal, event: CFLSplitEvent | None = None,
               p_value: float = math.nan, node: AutoNodeState | None = None) -> Decision:
        """A refusal with its text (the rule fills in the template's numbers)."""
        return Decision(refusal, self.reason(refusal), event, p_value, node)

    def reason(self, refusal: Refusal) -> str:
        return refusal.text()


def base_event(v: ClusterView, accepted: bool) -> CFLSplitEvent:
    """The keys every split test records."""
    assert v.split is not None
    return CFLSplitEvent(node=v.node, alpha_cross_max=v.split.max_cross,
                         gamma_bound=gamma_bound(v.split.max_cross), accepted=accepted)


@dataclass(frozen=True, kw_only=True)
class EpsilonRule(SplitRule):
    """The paper's rule (Alg. 5 lines 14-18): ‖Δθ_c‖ < ε1 (eq. (30)), max_i ‖Δθ_i‖ > ε2
    (eq. (31)), then the γ test (eq. (36)) accepts or rejects the bipartition (recorded
    either way)."""

    eps1: float = 0.4
    eps2: float = 1.6

    def test(self, v: ClusterView, state: RuleState, t: int) -> Decision:
        assert v.split is not None
        if not v.mean_norm < self.eps1:
            return self.refuse(Refusal.MEAN_NORM)
        if not v.max_norm > self.eps2:
            return self.refuse(Refusal.MAX_NORM)
        event = base_event(v, gamma_criterion(v.split.max_cross, self.gamma_max))
        return Decision(event=event) if event["accepted"] else \
            self.refuse(Refusal.GAMMA, event=event)


# The auto rule's conditions: each passes (True) or refuses with its `Refusal`. They read
# the cluster's view and the rule's settings only; `AutoRule.test` checks them in order.


def progressed(v: ClusterView, r: AutoRule) -> bool:
    """The cluster's mean local training loss is below (1 − progress) × its reference: FL has
    left the plateau of the untrained model, where updates are small and point every way
    (Algorithm 1's cuts unrelated to the clients' data). The reference (`progress_from`) is
    ln C, the cross-entropy of a uniform guess over the model's C outputs, or the first
    round's loss (rule v1). Passes when off (`progress = 0`), without a usable loss or
    reference (none reported; a model with one output, a regression, whose loss has no
    such plateau; C unknown)."""
    reference, _ = r.progress_reference(v.first_loss)
    if r.options.progress == 0 or reference is None or not reference > 0 or \
            math.isnan(v.loss):
        return True
    return v.loss < (1 - r.options.progress) * reference


def stationary(v: ClusterView, r: AutoRule) -> bool:
    """r < stationarity_max: FL on the cluster is near a stationary point (NaN refuses)."""
    return v.stationarity < r.options.stationarity_max


def sides_large_enough(v: ClusterView, r: AutoRule) -> bool:
    """Both sides have at least `min_side` clients (a pair may split 1 | 1)."""
    assert v.split is not None
    return v.pair or min(len(v.split.first), len(v.split.second)) >= r.options.min_side


def separated(v: ClusterView, r: AutoRule) -> bool:
    """ᾱ_× < separation · min(ᾱ_A, ᾱ_B): the sides are far apart."""
    assert v.cohesion is not None
    return v.cohesion.cross < r.options.separation * within_min(v.cohesion)


def cohesive(v: ClusterView, r: AutoRule) -> bool:
    """max(ᾱ_A, ᾱ_B) > −ᾱ_× and min(ᾱ_A, ᾱ_B) > 0: near a stationary point even pure noise
    has ᾱ_× ≈ −1/(n−1), so a side must be more alike inside than the sides are opposed, and
    no side's clients may disagree on average."""
    assert v.cohesion is not None
    return within_max(v.cohesion) > -v.cohesion.cross and within_min(v.cohesion) > 0


def nested(v: ClusterView, r: AutoRule) -> bool:
    """A cluster made by a split splits again only along a cut that sets its sides further
    apart than that split set it apart: max(ᾱ_A, ᾱ_B) − ᾱ_× > `formed`. Checked with
    `nesting = true`, and, with `test_every`, for the clusters below the root too small for
    the shuffle test (`SHUFFLE_MIN`). Passes at the root, for a side formed of one client
    (NaN) and for a pair."""
    formed = v.formed
    small = r.options.test_every and len(v.members) < SHUFFLE_MIN
    if not (r.options.nesting or small) or v.pair or formed is None or math.isnan(formed) \
            or v.cohesion is None:
        return True
    return apart(v.cohesion) > formed


def contrasting(v: ClusterView, r: AutoRule) -> bool:
    """The sides' contrast (`Cohesion.contrast`) exceeds `contrast_min` (off at 0; not for a
    pair)."""
    assert v.cohesion is not None
    return r.options.contrast_min == 0 or v.pair or v.cohesion.contrast > r.options.contrast_min


def pair_norms_large(v: ClusterView, r: AutoRule) -> bool:
    """A pair: both client update norms exceed PAIR_NORM × the run's peak mean norm (a
    congruent pair's updates collapse near its joint optimum)."""
    return not v.pair or v.min_norm > v.peak * PAIR_NORM


def pair_oscillating(v: ClusterView, r: AutoRule) -> bool:
    """A pair: its mean update points against the previous one (cosine < 0: FL oscillates
    about a stationary point instead of still moving; NaN, the first round, refuses)."""
    return not v.pair or v.drift < 0


def gamma_accepts(v: ClusterView, r: AutoRule) -> bool:
    """The γ test of eq. (36): sqrt((1 − α_cross^max)/2) > γ_max."""
    assert v.split is not None
    return gamma_criterion(v.split.max_cross, r.gamma_max)


Condition = Callable[[ClusterView, "AutoRule"], bool]

CONDITIONS: tuple[tuple[Refusal, Condition], ...] = (
    (Refusal.NO_PROGRESS, progressed),
    (Refusal.NOT_STATIONARY, stationary),
    (Refusal.SMALL_SIDE, sides_large_enough),
    (Refusal.NOT_SEPARATED, separated),
    (Refusal.NOT_COHESIVE, cohesive),
    (Refusal.NOT_NESTED, nested),
    (Refusal.PAIR_NORMS, pair_norms_large),
    (Refusal.PAIR_DRIFTING, pair_oscillating),
    (Refusal.GAMMA, gamma_accepts),
)
"""The auto rule's conditions in the order they are checked (the first that fails is the
reason recorded, and resets the cluster's streak). The evidence that the cut is beyond noise
(`contrasting`, then `shuffle_test`) comes after them and resets nothing."""


def shuffle_test(v: ClusterView, r: AutoRule, t: int) -> float:
    """The p-value of the candidate's contrast against `null_draws` shuffles of the cluster's
    cosines (`shuffle_pvalue`, each shuffle cut by the cluster's `bipartition` method); NaN
    where the test does not apply (off, a pair, not the root with `test_every` off); 1 for two
    answering clients of a larger cluster (one cosine: every shuffle is the same). The draws
    come from a generator seeded by the run's seed, the round and the node, so a resumed run
    repeats them and the run's other random numbers are untouched."""
    c = r.options
    below = v.formed is not None
    if c.significance == 0 or v.pair or (below and not c.test_every) or \
            (below and len(v.members) < SHUFFLE_MIN):
        return math.nan
    assert v.similarity is not None and v.cohesion is not None
    if len(v.members) < 3:  # two of a larger cluster answered (min_side = 1): one cosine,
        return 1.0  # every order of it a relabelling (shuffle_pvalue raised, a traceback)
    rng = np.random.default_rng([r.seed, t, v.node])
    return shuffle_pvalue(v.similarity, v.cohesion.contrast, c.null_draws, rng, v.method)


def significant(p_value: float, r: AutoRule, sampled: bool = False) -> bool:
    """The cut is beyond its shuffled cosines: p < significance, or < significance_sampled in
    a round in which some of the cluster's clients did not answer (`sampled`; NaN: not
    tested, passes). With the same clients every round, their own persistent differences
    recur in every round of a streak, so it asks more of each round than when each round
    tests another sample (docs/transfer.md, rule v5)."""
    c = r.options
    return math.isnan(p_value) or p_value < (c.significance_sampled if sampled else
                                             c.significance)


def significant_together(p_values: Sequence[float], r: AutoRule) -> bool:
    """The streak's last `patience` tested cuts, each on another sample of the cluster's
    clients, are beyond their shuffled cosines together: Fisher's combination of their
    p-values is below `significance_sampled` (none tested: passes, as one untested round)."""
    p = combined_pvalue(p_values[-r.options.patience:])
    return math.isnan(p) or p < r.options.significance_sampled


def meet(blocks: list[list[int]] | None, sides: list[list[int]],
         min_side: int) -> list[list[int]] | None:
    """The earlier candidate `blocks` refined by this round's bipartition `sides`, or None when
    the two disagree (the streak starts again).

    They disagree when the cut goes through an earlier block and leaves fewer than `min_side`
    of that block's clients (of those that answered this round) on one side. A block the cut
    goes through is replaced by its two answering parts (its members that did not answer are
    dropped from the candidate: their side is unknown); a block the cut does not go through
    stays whole, including members that did not answer (a sample or a dropout says nothing
    against it); clients new to the candidate form blocks by their side. With the same
    clients every round this is the common refinement of all the bipartitions, every block of
    at least `min_side` clients."""
    if blocks is None:
        return None
    here = [set(side) for side in sides]
    seen = {c for b in blocks for c in b}
    out = []
    for b in blocks:
        parts = [[c for c in b if c in side] for side in here]
        if all(parts):  # the cut goes through this block
            if min(len(p) for p in parts) < min_side:
                return None
            out.extend(parts)
        else:
            out.append(list(b))
    out.extend(new for new in ([c for c in side if c not in seen] for side in sides) if new)
    return out


def centred_cut(v: ClusterView) -> ClusterView:
    """`v` with its candidate bipartition found on the cosines of the updates minus the
    cluster's weighted mean update (by `v.method`, the bipartition of the raw cut), and that
    cut's α_cross^max and cohesion on the raw cosines (what the conditions read). Removing the
    shared direction keeps Algorithm 1 from cutting off the one client whose update is most out
    of line with the others."""
    if v.similarity is None or len(v.members) < 3:
        return v
    rest = v.updates.to(torch.float64) - v.mean.to(torch.float64)  # v.mean: weighted (eq. 2)
    found = bipartition(pairwise_cosine(rest), v.method)
    raw = v.similarity
    split = Bipartition(found.first, found.second,
                        float(raw[np.ix_(found.first, found.second)].max()))
    return replace(v, split=split, cohesion=cohesion(raw, split.first, split.second))


def finite(x: float) -> float | None:
    """A float for the history (JSON has no NaN): None when undefined."""
    return None if math.isnan(x) else float(x)


@dataclass(frozen=True, kw_only=True)
class AutoRule(SplitRule):
    """Our rule (module docstring): every condition of `CONDITIONS`, the root's shuffle test,
    in `patience` consecutive rounds with consistent cuts. `seed` is the run's (it seeds the
    shuffles with the round and the node)."""

    options: AutoRuleConfig = field(default_factory=AutoRuleConfig)
    seed: int = 0
    #: the model's number of outputs C (progress's ln C); 0: not known, 1: a regression
    n_outputs: int = 0

    def observe(self, state: RuleState, round_loss: float | None,
                views: Sequence[ClusterView]) -> tuple[RuleState, list[ClusterView]]:
        """Each answering cluster's drift (the cosine of its mean update with its previous
        one) and the run's peak mean norm, this round's included; the views carry both."""
        state, _ = super().observe(state, round_loss, views)
        nodes, peak, out = dict(state.nodes), state.peak, []
        for v in views:
            if len(v.members) == 0:
                out.append(v)
                continue
            mine = nodes.get(v.node, AutoNodeState())
            drift = math.nan if mine.last_mean is None else \
                float(cross_cosine(v.mean[None], mine.last_mean[None])[0, 0])
            nodes[v.node] = replace(mine, last_mean=v.mean.clone())
            peak = max(peak, v.mean_norm)
            out.append(replace(self._candidate(v), drift=drift))
        state = replace(state, peak=peak, nodes=nodes)
        return state, [replace(v, peak=peak, first_loss=state.first_loss) for v in out]

    def _candidate(self, v: ClusterView) -> ClusterView:
        """`v` with the candidate bipartition of option `cut`."""
        cut = self.options.cut
        if cut == "raw" or v.split is None or v.pair:
            return v
        if cut == "fallback" and min(len(v.split.first), len(v.split.second)) >= \
                self.options.min_side:
            return v
        return centred_cut(v)

    def progress_reference(self, first_loss: float | None) -> tuple[float | None, str]:
        """The progress condition's reference loss (None: none) and its name in the history:
        ln C (`progress_from = "uniform"`; none for one output or C unknown) or the first
        round's loss."""
        if self.options.progress_from == "first":
            return first_loss, "first round's"
        return (math.log(self.n_outputs) if self.n_outputs > 1 else None), \
            f"ln {self.n_outputs}"

    def reason(self, refusal: Refusal) -> str:
        return refusal.text(bar=1 - self.options.progress, share=PAIR_NORM,
                            reference=self.progress_reference(None)[1])

    def test(self, v: ClusterView, state: RuleState, t: int) -> Decision:
        c = self.options
        assert v.split is not None and v.cohesion is not None
        if not v.pair and len(v.members) < 2 * c.min_side:
            # no bipartition with min_side a side: no test, the streak stays (a round's sample
            # of a larger cluster says nothing against its candidate)
            return self.refuse(Refusal.FEW_FOR_SIDES)
        mine = state.nodes.get(v.node, AutoNodeState())
        for refusal, holds in CONDITIONS:
            if not holds(v, self):
                return self.refuse(refusal, node=replace(mine, streak=0, candidate=None,
                                                         evidence=[], sizes=[]))
        # the evidence that the cut is beyond noise: a round without it (a weak contrast, a
        # shuffle p-value not small) neither counts nor resets the streak
        if not contrasting(v, self):
            return self.refuse(Refusal.NO_CONTRAST)
        p = shuffle_test(v, self, t)
        together = v.sampled and c.sampled_evidence == "combined"
        if not together and not significant(p, self, v.sampled):
            hopeless = c.hopeless(len(v.members), v.sampled)
            if hopeless is None:
                return self.refuse(Refusal.NOT_SIGNIFICANT, p_value=p)
            floor, level = hopeless  # the same decision, with the reason it can never pass
            return Decision(Refusal.TOO_FEW_TO_SHUFFLE, Refusal.TOO_FEW_TO_SHUFFLE.text(
                n=len(v.members), level=level, floor=floor), p_value=p)
        sides = [v.members[v.split.first].tolist(), v.members[v.split.second].tolist()]
        blocks = meet(mine.candidate, sides, c.min_side)
        streak = 1 if blocks is None else mine.streak + 1
        need = c.patience * (PAIR_PATIENCE if v.pair else 1)
        tested, n = ([], []) if math.isnan(p) else ([p], [len(v.members)])
        evidence = (tested if blocks is None else mine.evidence + tested)[-c.patience:]
        sizes = (n if blocks is None else mine.sizes + n)[-c.patience:]
        kept = replace(mine, streak=streak, candidate=sides if blocks is None else blocks,
                       evidence=evidence, sizes=sizes)
        if streak < need:
            return Decision(Refusal.PATIENCE, Refusal.PATIENCE.text(streak=streak, need=need),
                            p_value=p, node=kept)
        if together and not significant_together(evidence, self):
            floor = combined_floor(sizes) if sizes and len(sizes) == len(evidence) else 0.0
            if floor < c.significance_sampled:  # (sizes unknown: a checkpoint before them)
                return self.refuse(Refusal.NOT_SIGNIFICANT_TOGETHER, p_value=p, node=kept)
            return Decision(Refusal.TOO_FEW_TOGETHER, Refusal.TOO_FEW_TOGETHER.text(
                sizes=", ".join(map(str, sizes)), level=c.significance_sampled, floor=floor),
                p_value=p, node=kept)
        event = base_event(v, True)
        event["stationarity"] = v.stationarity
        event["within"] = [v.cohesion.within_first, v.cohesion.within_second]
        event["cross"], event["contrast"] = v.cohesion.cross, v.cohesion.contrast
        event["streak"], event["p_value"] = streak, finite(p)
        return Decision(event=event, p_value=p)


__all__ = ["CONDITIONS", "PAIR_NORM", "PAIR_PATIENCE", "SHUFFLE_MIN", "TABLE", "AutoNodeState",
           "AutoRule", "AutoRuleConfig", "CFLSplitEvent", "ClusterView", "Decision",
           "EpsilonRule", "Refusal", "RuleState", "SplitRule", "apart", "combined_pvalue",
           "finite", "meet", "shuffle_test", "significant", "significant_together"]
