"""Print the markdown tables of `results.json` (ours beside the paper's numbers), then the
rows run over several seeds (mean ± std over seeds) and the γ sweeps of `gamma_sweep.json`
(per run family, i.e. names that differ only by `_seed<k>`: the mean over its seeds, with each
seed's automatic-C result)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
NAMES = {"flt": "FLT (Enc2, case I)", "flt_clusters": "FLT (Enc2, case II)",
         "flt_matched": "FLT (Enc2, case I), matched distance",
         "flt_cc": "FLT (Enc2, case I), components rule",
         "flt_matched_cc": "FLT (Enc2, case I), matched distance, components rule",
         "fedavg": "FedAvg", "local": "Local", "pca_km_hc": "PCA+kM+HC", "fesem": "FeSEM"}


def name(row: str) -> str:
    base = re.sub(r"_seed\d+$", "", row)
    for key in sorted(NAMES, key=len, reverse=True):
        if base == key or base.startswith(key + "_"):
            return NAMES[key] + base[len(key):].replace("_", " ")
    return row


def ms(values: list[float], digits: int = 2) -> str:
    a = np.asarray(values, dtype=float)
    if len(a) == 1:
        return f"{a[0]:.{digits}f}"
    return f"{a.mean():.{digits}f} ± {a.std(ddof=1):.{digits}f}"


def rows_table(results: dict[str, Any]) -> None:
    for scenario, rows in results.items():
        print(f"\n### {scenario}\n")
        print("| row | method | acc. (%) ± s.e. | var. (%²) | paper acc. | paper var. | ARI | "
              "clusters | clustering floats down / up | overrides | wall (s) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for method, r in rows.items():
            paper = r.get("paper") or ["—", "—"]
            cost = ("—" if r.get("clustering_floats_down") is None else
                    f"{r['clustering_floats_down']:,.0f} / {r['clustering_floats_up']:,.0f}")
            ari = "—" if r.get("ari") is None else f"{r['ari']:.3f}"
            print(f"| {method} | {name(method)} | {r['accuracy']:.2f} ± {r['std_error']:.2f} "
                  f"| {r['variance']:.2f} | {paper[0]} | {paper[1]} | {ari} | "
                  f"{r['n_clusters']} | {cost} | {' '.join(r.get('overrides', [])) or '—'} | "
                  f"{r['process_seconds']:.0f} |")


def seeds_table(results: dict[str, Any]) -> None:
    """Rows whose names differ only by `_seed<k>` (seed 0 has no suffix), over seeds."""
    print("\n### Over seeds (mean ± std over seeds; s.e. and variance are over clients, "
          "averaged)\n")
    print("| scenario | row | seeds | acc. (%) | per seed | s.e. | var. (%²) | ARI | "
          "clusters | wall (s), sum |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for scenario, rows in results.items():
        groups: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for row, r in rows.items():
            m = re.match(r"(.*?)(?:_seed(\d+))?$", row)
            assert m is not None
            groups.setdefault(m.group(1), []).append((int(m.group(2) or 0), r))
        for base, members in groups.items():
            if len(members) < 2:
                continue
            members.sort(key=lambda t: t[0])
            rs = [r for _, r in members]
            per_seed = ", ".join(f"{r['accuracy']:.2f}" for r in rs)
            print(f"| {scenario} | {base} | {', '.join(str(s) for s, _ in members)} | "
                  f"{ms([r['accuracy'] for r in rs])} | "
                  f"{per_seed} | "
                  f"{np.mean([r['std_error'] for r in rs]):.2f} | "
                  f"{np.mean([r['variance'] for r in rs]):.2f} | "
                  f"{ms([r['ari'] for r in rs], 3)} | "
                  f"{', '.join(str(r['n_clusters']) for r in rs)} | "
                  f"{sum(r['process_seconds'] for r in rs):.0f} |")


def sweep_table() -> None:
    path = HERE / "gamma_sweep.json"
    if not path.is_file():
        return
    for scenario, all_runs in json.loads(path.read_text()).items():
        families: dict[str, dict[str, Any]] = {}  # runs that differ only by `_seed<k>`
        for run, rows in all_runs.items():
            families.setdefault(re.sub(r"_seed\d+$", "", run), {})[run] = rows
        for family, runs in families.items():
            sweep_family(scenario, family, runs)


def sweep_family(scenario: str, family: str, runs: dict[str, Any]) -> None:
    names = sorted(runs)
    print(f"\n### γ sweep, {scenario}, {family} (linked shares: mean over {len(names)} "
          f"runs: {', '.join(names)}; automatic C: clusters / ARI per run)\n")
    print("| distance | γ | within pairs linked | cross pairs sharing a class linked | "
          "cross pairs sharing none linked | gap rule: C / ARI | components: C / ARI |")
    print("|---|---|---|---|---|---|---|")
    for i, first in enumerate(runs[names[0]]):
        rs = [runs[n][i] for n in names]
        assert all(r["distance"] == first["distance"] and r["gamma"] == first["gamma"]
                   for r in rs)

        def share(key: str, rs: list[dict[str, Any]] = rs) -> str:
            v = [r[key] for r in rs if r[key] is not None]
            return "–" if not v else f"{np.mean(v):.2f}"

        gap = ", ".join(f"{r['gap_clusters']} / {r['gap_ari']:.2f}" for r in rs)
        comp = ", ".join(f"{r['components']} / {r['components_ari']:.2f}" for r in rs)
        print(f"| {first['distance']} | {first['gamma']} | {share('linked_within')} | "
              f"{share('linked_cross_shared')} | {share('linked_cross_disjoint')} | "
              f"{gap} | {comp} |")


def main() -> None:
    results = json.loads((HERE / "results.json").read_text())
    rows_table(results)
    seeds_table(results)
    sweep_table()


if __name__ == "__main__":
    main()
