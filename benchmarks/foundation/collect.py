"""Collect the foundation reproduction runs into a markdown table (stdout)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import numpy as np

from clusterfl.records import read_summary


def main(root: str) -> None:
    rows = []
    for summary_path in sorted(Path(root).glob("rmnist_fedavg_s*/summary.json")):
        final = read_summary(summary_path.parent).final
        cfg = tomllib.loads((summary_path.parent / "config.toml").read_text())
        accuracy = None if final.metrics is None else final.metrics.accuracy
        rows.append((summary_path.parent.name, accuracy, final.wall_time,
                     cfg["backend"]["name"]))
    accs = np.array([r[1] for r in rows]) * 100
    print("# Foundation reproduction: one global FedAvg model on rotated MNIST\n")
    print("Setting: CFL-GP §5.2/F.5 rotated MNIST (authors' preset angles "
          "0,15,90,105,180,195,270,275; 32 clients; 70/30 per client), MLP 784-200-10, one SGD "
          "step per round on a batch of 64, lr 0.1, 200 rounds.\n")
    print("Command: `CLUSTERFL_DATA=../shared/datasets benchmarks/foundation/run.sh`\n")
    print("| run | mean client accuracy (%) | wall time (s) | backend |\n|---|---:|---:|---|")
    for name, acc, wall, backend in rows:
        print(f"| {name} | {100 * acc:.2f} | {wall:.1f} | {backend} |")
    print(f"| **mean ± std** | **{accs.mean():.2f} ± {accs.std():.2f}** | | |")
    print("\nPaper (CFL-GP Table 3, one global model): 58.3%. Authors' code run by the DESIGN "
          "authors: 59.8%.")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/foundation")
