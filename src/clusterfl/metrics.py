"""Metrics (README, the results section): per-client accuracy/macro-F1 aggregated, fairness, ARI."""

from __future__ import annotations

import math

import numpy as np
from sklearn.metrics import adjusted_rand_score

from clusterfl.protocol import WORD_ACCURACY, WORD_TARGETS, EvaluateReply


def _nanmean(a: np.ndarray) -> float | None:
    a = np.asarray(a, dtype=float)
    a = a[~np.isnan(a)]
    return float(a.mean()) if len(a) else None


def summarize(reply: EvaluateReply) -> dict[str, float | None]:
    """Mean over clients, sample-weighted mean, fairness (variance of accuracy in %²)."""
    acc = np.asarray(reply.accuracy, dtype=float)
    n = np.asarray(reply.n_samples, dtype=float)
    ok = ~np.isnan(acc)
    weighted = float((acc[ok] * n[ok]).sum() / n[ok].sum()) if ok.any() and n[ok].sum() else None
    return {
        "accuracy": _nanmean(acc),
        "accuracy_weighted": weighted,
        "macro_f1": _nanmean(reply.macro_f1),
        "fairness_var": float(np.var(100 * acc[ok])) if ok.any() else None,
        "loss": _nanmean(reply.loss),
        "mse": _diverged_mean(reply.extras.get("mse"), n),
        "perplexity": token_perplexity(reply),
        WORD_ACCURACY: word_accuracy(reply),
    }


def _diverged_mean(values: np.ndarray | None, n: np.ndarray) -> float | None:
    """Mean over the clients with test samples (n > 0) of a metric every such client has
    when it has any (a regression's MSE): None when none has a finite one (not a regression);
    infinite when some have and another has a non-finite one (its model diverged: NaN is
    no better than the inf that makes the mean infinite)."""
    if values is None:
        return None
    v = np.asarray(values, dtype=float)[n > 0]
    finite = np.isfinite(v)
    if not finite.any():
        return None
    return float(v.mean()) if finite.all() else math.inf


def token_perplexity(reply: EvaluateReply) -> float | None:
    """A language model's perplexity over all the clients' test tokens: exp of the mean
    token loss, each client's mean loss weighted by its sequences (every sequence has the
    same number of tokens, so this is the token-weighted mean). None for other tasks (no
    `perplexity` extra) or when no client has test sequences; infinite when a client with
    test sequences has a non-finite loss (its model diverged): clients without (or not
    asked: no sequences in the reply) are left out."""
    if "perplexity" not in reply.extras:
        return None
    loss = np.asarray(reply.loss, dtype=float)
    n = np.asarray(reply.n_samples, dtype=float)
    ok = n > 0
    if not ok.any():
        return None
    if not np.isfinite(loss[ok]).all():
        return math.inf
    mean = float((loss[ok] * n[ok]).sum() / n[ok].sum())
    return math.exp(mean) if mean < 709.0 else math.inf


def word_accuracy(reply: EvaluateReply) -> float | None:
    """A language model's accuracy on all the clients' test targets that are words of the
    vocabulary (not `<unk>`, not `<eos>`), pooled: the clients' right predictions over their
    such targets. None for other tasks, when the vocabulary is unknown (no extra) or when no
    client has such a target."""
    if WORD_ACCURACY not in reply.extras:
        return None
    acc = np.asarray(reply.extras[WORD_ACCURACY], dtype=float)
    n = np.nan_to_num(np.asarray(reply.extras[WORD_TARGETS], dtype=float))
    ok = (n > 0) & ~np.isnan(acc)
    return float((acc[ok] * n[ok]).sum() / n[ok].sum()) if ok.any() else None


def lone_clusters(assignment: np.ndarray) -> np.ndarray:
    """A copy of `assignment` (int64) where each client without a cluster (−1) has a
    cluster of its own, numbered after the others."""
    a = np.array(assignment, dtype=np.int64)
    lone = np.flatnonzero(a < 0)
    a[lone] = a.max(initial=-1) + 1 + np.arange(len(lone))
    return a


def ari(true: np.ndarray | None, assignment: np.ndarray) -> float | None:
    """Adjusted Rand index of an assignment against the true clusters (None if unknown).

    A client without a cluster (−1: never sampled yet, dropped, placed nowhere) is a cluster
    of its own: it is grouped with nobody, so unassigned clients never raise the index by
    sharing the label −1 (two true groups of four, three clients of the second in one cluster
    and five unassigned: 0.276; with −1 as one more label it read 0.495)."""
    if true is None:
        return None
    value = float(adjusted_rand_score(np.asarray(true), lone_clusters(assignment)))
    return None if math.isnan(value) else value


def ari_ceiling(true: np.ndarray, groups: np.ndarray) -> float:
    """The best ARI an assignment can reach when clients of the same group (e.g. clients
    holding the same set of classes: the same data distribution) must share a cluster.

    Search: every group starts in its most frequent true cluster; then, while it raises the
    ARI, one group at a time moves to another group's cluster or to a new one. The result is
    reachable (a lower bound on the exact maximum, which could in principle be higher); when
    no group mixes true clusters it is 1.
    """
    true, groups = np.asarray(true), np.asarray(groups)
    if len(true) != len(groups):
        raise ValueError(f"true ({len(true)}) and groups ({len(groups)}) differ in length")
    ids, inverse = np.unique(groups, return_inverse=True)
    label = np.array([np.bincount(true[inverse == g]).argmax() for g in range(len(ids))])
    best = float(adjusted_rand_score(true, label[inverse]))
    improved = True
    while improved:
        improved = False
        for g in range(len(ids)):
            for cand in [*np.unique(label), label.max() + 1]:
                if cand == label[g]:
                    continue
                trial = label.copy()
                trial[g] = cand
                score = float(adjusted_rand_score(true, trial[inverse]))
                if score > best + 1e-12:
                    best, label, improved = score, trial, True
    return best
