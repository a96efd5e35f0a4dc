"""Where a method that chooses K misses, by kind of federation, and whether the grouping was
within reach: read from results/runs.jsonl, nothing is run.

For one version and a set of halves (default: v7 on its six fresh validation halves), per
family of federations with structure (rotation, rotation at half participation, nested
rotation, Dirichlet inside the clusters, n-class, label swap, ...):
- how often the method finds the true K, splits too few and splits too many;
- "given K reaches it": the federations on which at least one method given the true K
  (IFCA, FeSEM, FedSoft, IFCA-CAM, FL+HC, PACFL or PCA+kM+HC with K) ends at ARI ≥ 0.99, so
  the runs' data and budget let a method see the groups;
- "an automatic method finds it": at least one of the methods that choose K finds the true K;
- each miss with FedAvg's accuracy on the same federation: where FedAvg itself stays near a
  uniform guess, the budget left the models unlearned and no method's clusters mean much.

With `--runs DIR` (the version's run folders, `benchmarks/transfer/runs/<version>`, kept out
of git), CFL's misses also get what refused a split after its last one: the round of the last
split and the shares of the refusal reasons its history.jsonl gives in the rounds after it.

    python benchmarks/transfer/misses.py [--version v7] [--method cfl]
        [--halves validation15 ... validation20] [--runs DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from tables import AUTO, load

HERE = Path(__file__).parent
GIVEN_ALL = ("ifca_k", "fesem_k", "fedsoft_k", "cam_k", "flhc_k", "pacfl_k", "pca_km_hc_k")
REACHED = 0.99
DATASET = re.compile(r"_(digits|mnist|fmnist|synth)(_lenet|_\d+)*$")


def family(federation: str) -> str:
    """`rot4_nested_digits_15` → `rot_nested`: the construction without its K, data and seed."""
    base = DATASET.sub("", federation)
    head, *rest = base.split("_")
    return "_".join([re.sub(r"\d+$", "", head), *rest])


def refusals(history: Path) -> str:
    """The round of the last split in `history` (a CFL run's history.jsonl) and the three
    commonest refusal reasons after it, with their shares."""
    ks, seen = [], Counter()
    for r in map(json.loads, history.read_text().splitlines()):
        ks.append(r["extras"].get("n_clusters"))
        seen[len(ks)] = Counter(re.sub(r"(patience) .*| \(.*", r"\1", str(x))
                                for x in r["extras"].get("refused") or [])
    last = max((t + 1 for t in range(1, len(ks)) if ks[t] != ks[t - 1]), default=0)
    after = sum((seen[t] for t in range(last + 1, len(ks) + 1)), Counter())
    total = sum(after.values()) or 1
    top = ", ".join(f"{why} {100 * n / total:.0f} %" for why, n in after.most_common(3))
    return f"{last or '–'} | {top or '–'}"


def tabulate(rows: list[dict[str, Any]], method: str,
             runs_dir: Path | None = None) -> tuple[list[str], list[str]]:
    """The table by family and the list of misses (markdown lines)."""
    runs: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        if not r["sets"] and r.get("error") is None:
            runs[(r["half"], r["federation"])][r["method"]] = r
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    misses = []
    for (half, fed), by in sorted(runs.items()):
        own = by.get(method)
        if own is None or own["k_true"] == 1 or own["k_found"] is None:
            continue
        k, found = own["k_true"], own["k_found"]
        given = [by[g]["ari"] for g in GIVEN_ALL if g in by and by[g]["ari"] is not None]
        autos = [a for a in AUTO if a in by and by[a]["k_found"] == by[a]["k_true"]]
        for key in (family(fed), "all"):
            c = counts[key]
            c["n"] += 1
            c["found"] += found == k
            c["under"] += found < k
            c["over"] += found > k
            c["reached"] += bool(given) and max(given) >= REACHED
            c["auto"] += bool(autos)
            c["reached_missed"] += bool(given) and max(given) >= REACHED and found != k
        if found != k:
            best = max(given) if given else None
            base = (by.get("fedavg") or {}).get("accuracy")
            history = None if runs_dir is None else runs_dir / fed / method / "history.jsonl"
            more = "" if history is None else \
                f" {refusals(history) if history.is_file() else '– | –'} |"
            misses.append(f"| {fed} | {half} | {k} | {found} | {own['ari']:.2f} | "
                          f"{'–' if best is None else f'{best:.2f}'} | "
                          f"{', '.join(a for a in autos) or '–'} | "
                          f"{'–' if base is None else f'{100 * base:.1f} %'} |{more}")
    table = ["| family | federations | true K found | too few | too many | given K reaches "
             "it | missed though given K reaches it | an automatic method finds it |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key in [*sorted(k for k in counts if k != "all"), "all"]:
        c = counts[key]
        name = "**all**" if key == "all" else key
        table.append(f"| {name} | {c['n']} | {c['found']} | {c['under']} | {c['over']} | "
                     f"{c['reached']} | {c['reached_missed']} | {c['auto']} |")
    head = ["| federation | half | true K | K found | ARI | best ARI given K | automatic "
            "methods that find it | FedAvg's accuracy |", "|---|---|---:|---:|---:|---:|---|---:|"]
    if runs_dir is not None:
        head = [head[0] + " last split (round) | refusals after it |", head[1] + "---:|---|"]
    return table, head + misses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--version", default="v7")
    p.add_argument("--method", default="cfl", choices=AUTO)
    p.add_argument("--halves", nargs="+",
                   default=[f"validation{i}" for i in range(15, 21)])
    p.add_argument("--runs", type=Path, help="the version's run folders (refusals of CFL)")
    p.add_argument("--out", type=Path, help="write the tables here (default: print)")
    a = p.parse_args()
    rows = [r for r in load(HERE / "results" / "runs.jsonl")
            if r["version"] == a.version and r["half"] in a.halves]
    if not rows:
        raise SystemExit(f"no runs of version {a.version} on {' '.join(a.halves)}")
    table, misses = tabulate(rows, a.method, a.runs)
    runs = f" --runs {a.runs}" if a.runs else ""
    text = "\n".join([f"# {a.method}, version {a.version}: {' '.join(a.halves)}", "",
                      "Command: `python benchmarks/transfer/misses.py --version "
                      f"{a.version} --method {a.method} --halves {' '.join(a.halves)}{runs}`",
                      "",
                      *table, "", "Misses:", "", *misses, ""])
    if a.out:
        a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
