"""The markdown tables of the transfer grid (`run_grid.py --table`), from results/runs.jsonl.

Per version and half:
- for every method that chooses K: how often it finds the true K (federations with structure;
  without structure: how often it keeps 1 cluster and how often it makes more than 2), mean
  ARI, mean accuracy minus FedAvg's and minus the same method given K (or IFCA given K for
  CFL and CFL-GP), and its confusion table of true K against K found;
- for every method given K: mean ARI and how often a cluster collapsed;
- one row per federation with every method's K found and ARI.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

AUTO = ("cfl", "flhc", "pacfl", "pca_km_hc", "flt", "cfl_gp")
GIVEN = ("ifca_k", "fesem_k", "fedsoft_k", "cam_k")
REFERENCE = {"cfl": "ifca_k", "cfl_gp": "ifca_k", "flhc": "flhc_k", "pacfl": "pacfl_k",
             "pca_km_hc": "pca_km_hc_k", "flt": "ifca_k"}


def load(table: Path) -> list[dict[str, Any]]:
    """Every row; a run repeated under one version and settings: the last line counts."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in map(json.loads, table.read_text().splitlines()):
        if isinstance(r.get("accuracy"), float) and math.isnan(r["accuracy"]):
            r["accuracy"] = None  # v0's runner wrote a regression's missing accuracy as NaN
        rows[(r["version"], r["federation"], r["method"], tuple(r["sets"]))] = r
    return list(rows.values())


def fmt(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "–" if x is None else f"{scale * x:.{digits}f}"


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of one method on one half (rows: its runs without --set)."""
    ok = [r for r in rows if r.get("error") is None and r["k_found"] is not None]
    structured = [r for r in ok if r["k_true"] > 1]
    flat = [r for r in ok if r["k_true"] == 1]
    return {
        "runs": len(rows), "errors": len(rows) - len(ok),
        "found": sum(r["k_found"] == r["k_true"] for r in structured),
        "structured": len(structured),
        "flat_one": sum(r["k_found"] == 1 for r in flat),
        "flat_over2": sum(r["k_found"] > 2 for r in flat), "flat": len(flat),
        "ari": mean([r["ari"] for r in structured if r["ari"] is not None]),
    }


#: the versions of the rules the tables show (the dev-only variants of RESULTS.md's history
#: ran with --set and are summed up there)
VERSIONS = ("v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8")


def halves(names: list[str]) -> list[str]:
    """The distinct halves among `names`: development, then validation, validation2, ..."""
    return sorted(set(names), key=lambda h: (h != "development", len(h), h))


def print_tables(table: Path, versions: list[str] | None = None) -> None:
    rows = [r for r in load(table) if not r["sets"]]
    for version in versions or VERSIONS:
        for half in halves([r["half"] for r in rows]):
            mine = [r for r in rows if r["version"] == version and r["half"] == half]
            if mine:
                print_half(version, half, mine, rows)


def print_half(version: str, half: str, rows: list[dict[str, Any]],
               everything: list[dict[str, Any]]) -> None:
    """One half of one version. FedAvg and the methods given K do not depend on the rules of
    issue 36: where this version did not run them, the table takes another version's runs
    of the same half (v1 ran only CFL on validation3 to validation6, v2 only CFL on
    validation5 and validation6, v4 only CFL on validation9 and validation10)."""
    by = {(r["federation"], r["method"]): r for v in ("v6", "v5", "v4", "v3", "v2", "v1")
          for r in everything
          if r["version"] == v and r["half"] == half and r["method"] not in AUTO}
    by.update({(r["federation"], r["method"]): r for r in rows})
    feds = sorted({r["federation"] for r in rows}, key=lambda f: (by_k(rows, f), f))
    print(f"\n### Version {version}, {half} half ({len(feds)} federations)\n")
    print("| method | true K found (structure) | iid: 1 cluster | iid: > 2 clusters | "
          "mean ARI (structure) | accuracy − FedAvg | accuracy − K given | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for m in AUTO:
        mine = [r for r in rows if r["method"] == m]
        if not mine:
            continue
        s = summary(mine)
        vs_avg, vs_ref = [], []
        for r in mine:
            base, ref = by.get((r["federation"], "fedavg")), by.get((r["federation"],
                                                                    REFERENCE[m]))
            if r.get("accuracy") is None:
                continue
            if base and base.get("accuracy") is not None:
                vs_avg.append(r["accuracy"] - base["accuracy"])
            if ref and ref.get("accuracy") is not None:
                vs_ref.append(r["accuracy"] - ref["accuracy"])
        pct = "–" if not s["structured"] else \
            f"{s['found']} / {s['structured']} ({100 * s['found'] / s['structured']:.0f} %)"
        print(f"| {m} | {pct} | {s['flat_one']} / {s['flat']} | {s['flat_over2']} / "
              f"{s['flat']} | {fmt(s['ari'])} | {fmt(mean(vs_avg), 100, 1)} pt | "
              f"{fmt(mean(vs_ref), 100, 1)} pt | {s['errors']} |")
    given = [m for m in GIVEN if any(r["method"] == m for r in rows)]
    if given:
        print("\n| method given K | mean ARI | a cluster collapsed | errors |")
        print("|---|---|---|---|")
        for m in given:
            mine = [r for r in rows if r["method"] == m]
            ok = [r for r in mine if r.get("error") is None]
            print(f"| {m} | {fmt(mean([r['ari'] for r in ok if r['ari'] is not None]))} | "
                  f"{sum(bool(r['collapsed']) for r in ok)} / {len(ok)} | "
                  f"{len(mine) - len(ok)} |")
    for m in AUTO:
        mine = [r for r in rows if r["method"] == m and r.get("error") is None
                and r["k_found"] is not None]
        if not mine:
            continue
        true_ks = sorted({r["k_true"] for r in mine})
        found = sorted({min(r["k_found"], 10) for r in mine})
        counts: dict[tuple[int, int], int] = defaultdict(int)
        for r in mine:
            counts[(r["k_true"], min(r["k_found"], 10))] += 1
        print(f"\n{m}: true K (rows) against K found (columns; 10 = 10 or more)\n")
        print("| true K | " + " | ".join(map(str, found)) + " |")
        print("|---" * (len(found) + 1) + "|")
        for k in true_ks:
            print(f"| {k} | " + " | ".join(str(counts[(k, f)] or "") for f in found) + " |")
    methods = [m for m in ("fedavg", *AUTO, *GIVEN) if any(r["method"] == m for r in rows)]
    print("\nPer federation: K found / ARI / accuracy % (run folders: "
          f"benchmarks/transfer/runs/{version}/<federation>/<method>)\n")
    print("| federation | K | " + " | ".join(methods) + " |")
    print("|---|---|" + "---|" * len(methods))
    for f in feds:
        cells = []
        for m in methods:
            r = by.get((f, m))
            if r is None:
                cells.append("")
            elif r.get("error"):
                cells.append("refused")
            else:
                cells.append(f"{r['k_found']} / {fmt(r['ari'])} / "
                             f"{fmt(r['accuracy'], 100, 1)}")
        print(f"| {f} | {by_k(rows, f)} | " + " | ".join(cells) + " |")


def by_k(rows: list[dict[str, Any]], fed: str) -> int:
    return next(r["k_true"] for r in rows if r["federation"] == fed)


def print_grid(grid: dict[str, Any]) -> None:
    """The federations of grid.toml, one row each, by half."""
    for half in halves([f["half"] for f in grid["federation"].values()]):
        print(f"\n{half.capitalize()} half\n")
        print("| federation | pair | true K | data | scenario | clients | model | rounds | "
              "participation | seed |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, f in grid["federation"].items():
            if f["half"] != half:
                continue
            sc = dict(f["scenario"])
            kind = sc.pop("name")
            n = sc.pop("n_clients")
            extra = ", ".join(f"{k} {v}" for k, v in sc.items())
            model = grid["train"][f["train"]]["model"]["name"]
            print(f"| {name} | {f['pair']} | {f['k']} | {f['source']} | {kind} ({extra}) | "
                  f"{n} | {model} | {f['rounds']} | {f['participation']} | {f['seed']} |")
