"""Figures of a FeSEM run: the cluster balance of `clusterfl.report.methods.cam` (collapse)."""

from __future__ import annotations

from pathlib import Path

from clusterfl.records import RoundRecord, RunSummary
from clusterfl.report.methods.cam import figures as _cam_figures


def figures(run_dir: Path, records: list[RoundRecord], summary: RunSummary) -> list[Path]:
    """`cluster_balance.png`: largest-cluster share and used clusters per round."""
    return _cam_figures(run_dir, records, summary)


__all__ = ["figures"]
