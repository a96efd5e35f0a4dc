"""Markdown tables of `run_auto.py` results (one row per federation, seeds side by side).

    python benchmarks/cfl/summarize_auto.py results/auto_val_v4.jsonl [...]

Per federation: the seeds, ARI at the last round per seed, clusters, the accepted splits
(round: sizes), mean client accuracy, and CPU / wall seconds per run. When a (federation,
seed, settings) ran more than once in a file, the last line counts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def rows(paths: list[str]) -> dict[tuple[str, tuple[str, ...]], dict[int, dict[str, Any]]]:
    out: dict[tuple[str, tuple[str, ...]], dict[int, dict[str, Any]]] = {}
    for p in paths:
        for line in Path(p).read_text().splitlines():
            r = json.loads(line)
            out.setdefault((r["name"], tuple(r["sets"])), {})[r["seed"]] = r
    return out


def main() -> None:
    here = Path(__file__).resolve().parent
    paths = [str(here / p) if not Path(p).exists() else p for p in sys.argv[1:]]
    print("| federation | settings | seeds | ARI per seed | clusters | splits (round: sizes) "
          "| mean accuracy | CPU / wall s per run |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, sets), by_seed in rows(paths).items():
        seeds = sorted(by_seed)
        rs = [by_seed[s] for s in seeds]
        splits = "; ".join(
            f"s{r['seed']}: " + (", ".join(f"{x['round']} ({'/'.join(map(str, x['sizes']))})"
                                           for x in r["splits"]) or "none") for r in rs)
        ari = ", ".join(f"{r['ari']:.2f}" for r in rs)
        clusters = ", ".join(str(r["n_clusters"]) for r in rs)
        acc = ", ".join(f"{100 * r['accuracy']:.1f}" for r in rs)
        cost = ", ".join(f"{r['cpu_s']:.0f} / {r['wall_s']:.0f}" for r in rs)
        print(f"| {name} | {' '.join(sets) or 'defaults'} | {', '.join(map(str, seeds))} | "
              f"{ari} | {clusters} | {splits} | {acc} % | {cost} |")

if __name__ == "__main__":
    main()
