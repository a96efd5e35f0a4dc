"""Print the markdown tables of `results.json` (ours beside the paper's numbers)."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = {"flt": "FLT (Enc2, case I)", "flt_clusters": "FLT (Enc2, case II)",
         "fedavg": "FedAvg", "local": "Local", "pca_km_hc": "PCA+kM+HC", "fesem": "FeSEM"}


def main() -> None:
    results = json.loads((HERE / "results.json").read_text())
    for scenario, rows in results.items():
        print(f"\n### {scenario}\n")
        print("| method | acc. (%) ± s.e. | var. (%²) | paper acc. | paper var. | ARI | "
              "clusters | clustering floats down / up | wall (s) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for method, r in rows.items():
            paper = r.get("paper") or ["—", "—"]
            cost = ("—" if r.get("clustering_floats_down") is None else
                    f"{r['clustering_floats_down']:,.0f} / {r['clustering_floats_up']:,.0f}")
            ari = "—" if r.get("ari") is None else f"{r['ari']:.3f}"
            print(f"| {NAMES.get(method, method)} | {r['accuracy']:.2f} ± {r['std_error']:.2f} "
                  f"| {r['variance']:.2f} | {paper[0]} | {paper[1]} | {ari} | "
                  f"{r['n_clusters']} | {cost} | {r['process_seconds']:.0f} |")


if __name__ == "__main__":
    main()
