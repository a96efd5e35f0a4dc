"""A development probe (issue 36): would a SigClust-style test (Liu, Hayes, Nobel & Marron 2008:
is a cluster one Gaussian cloud?) tell CFL's correct splits from its noise splits?

For every split CFL's auto rule made in the runs of one version (`runs/<version>/*/cfl` of the
development and first validation halves; the split events keep the members' cosine matrix),
it computes the cut's cluster index CI (within-side over total sum of squares of the members'
unit update vectors, from the Gram matrix = the cosines) and its p-value against a Gaussian
null with the same spectrum: n points drawn from N(0, diag(λ)) with λ the eigenvalues of the
centred Gram matrix, their best 2-means CI (every bipartition for n ≤ 14; 20 Lloyd restarts
and at most 99 draws above), p = (1 + #{null CI ≤ CI}) / (1 + draws). A split is "correct"
when no true cluster has members on both sides.

    python benchmarks/transfer/probe_sigclust.py --version v1 [--draws 499]

Measured on v1's development and validation runs (RESULTS.md, "Development probes"): it does
not separate them, so it was not made a rule.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
LARGE_DRAWS = 99  # null draws above 14 members (each a 2-means search by Lloyd restarts)


def cluster_index(gram: np.ndarray, side: np.ndarray) -> float:
    """Within-side sum of squares over the total, for unit vectors with Gram matrix `gram`."""
    n = len(gram)
    total = np.trace(gram) - gram.sum() / n
    within = 0.0
    for mask in (side, ~side):
        block = gram[np.ix_(mask, mask)]
        if mask.any():
            within += np.trace(block) - block.sum() / mask.sum()
    return float(within / total)


def best_index(points: np.ndarray, rng: np.random.Generator) -> float:
    """The smallest 2-means cluster index of `points` (exact for up to 14 points)."""
    n = len(points)
    x = points - points.mean(0)
    total = float((x**2).sum())
    if n <= 14:
        bits = np.arange(1, 2 ** (n - 1))[:, None] >> np.arange(n)[None] & 1
        k1 = bits.sum(1)
        s1 = bits @ x  # the centred data sum to zero: the other side's sum is -s1
        between = (s1**2).sum(1) * (1 / k1 + 1 / (n - k1))
        return float((total - between.max()) / total)
    best = 1.0
    for _ in range(20):
        centres = x[rng.choice(n, 2, replace=False)]
        for _ in range(30):
            label = ((x[:, None] - centres[None]) ** 2).sum(2).argmin(1)
            if label.min() == label.max():
                break
            centres = np.stack([x[label == j].mean(0) for j in (0, 1)])
        if label.min() != label.max():
            within = sum(float(((x[label == j] - x[label == j].mean(0)) ** 2).sum())
                         for j in (0, 1))
            best = min(best, within / total)
    return best


def p_value(gram: np.ndarray, side: np.ndarray, draws: int,
            rng: np.random.Generator) -> tuple[float, float]:
    n = len(gram)
    centre = np.eye(n) - 1 / n
    lam = np.clip(np.linalg.eigvalsh(centre @ gram @ centre), 0, None)[::-1][: n - 1]
    observed = cluster_index(gram, side)
    draws = draws if n <= 14 else min(draws, LARGE_DRAWS)
    hits = sum(best_index(rng.standard_normal((n, n - 1)) * np.sqrt(lam), rng) <= observed
               for _ in range(draws))
    return observed, (1 + hits) / (1 + draws)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--version", default="v1")
    p.add_argument("--draws", type=int, default=499)
    p.add_argument("--halves", nargs="*", default=["development", "validation"],
                   help="the grid's halves to read (default: the two that rules were "
                   "developed or judged on; a half kept for judging a later rule stays unread)")
    args = p.parse_args()
    grid = tomllib.loads((HERE / "grid.toml").read_text())["federation"]
    rng = np.random.default_rng(0)
    print("| split | federation | round | sides | shuffle p | CI | Gaussian-null p |")
    print("|---|---|---|---|---|---|---|")
    for run in sorted((HERE / "runs" / args.version).glob("*/cfl")):
        if grid.get(run.parent.name, {}).get("half") not in args.halves:
            continue
        truth = json.loads((run / "summary.json").read_text())["true_clusters"]
        for line in (run / "history.jsonl").read_text().splitlines():
            record = json.loads(line)
            for ev in record["extras"].get("splits", []):
                if not ev.get("accepted") or "similarity" not in ev:
                    continue
                first = set(ev["groups"][0])
                side = np.array([m in first for m in ev["members"]])
                a, b = ({truth[c] for c in g} for g in ev["groups"])
                observed, p_gauss = p_value(np.array(ev["similarity"], float), side,
                                            args.draws, rng)
                print(f"| {'correct' if not a & b else 'through a cluster'} | "
                      f"{run.parent.name} | {record['round']} | "
                      f"{len(ev['groups'][0])} \\| {len(ev['groups'][1])} | "
                      f"{ev['p_value']} | {observed:.3f} | {p_gauss:.3f} |", flush=True)


if __name__ == "__main__":
    main()
