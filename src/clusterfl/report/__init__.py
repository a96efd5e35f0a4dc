"""Reporting: read run directories, draw figures, write summary tables and markdown reports.

Typical use::

    from clusterfl.report import write_run_report, write_comparison_report
    write_run_report("runs/ifca")                      # runs/ifca/report.md + figures/
    write_comparison_report(["runs/fedavg", "runs/ifca"], "runs/compare")

A run directory is read as typed records (`clusterfl.records`): `read_history(run_dir)` gives
one `RoundRecord` per round, `read_summary(run_dir)` the `RunSummary`.
"""

from clusterfl.records import RunDirError, read_history, read_summary
from clusterfl.report.figures import (
    human_units,
    plot_accuracy,
    plot_ari,
    plot_client_accuracy,
    plot_cluster_sizes,
    plot_communication,
    plot_comparison,
    plot_matrix,
    plot_run,
    plot_series,
)
from clusterfl.report.history import (
    accuracy_series,
    ari_series,
    client_accuracy_matrix,
    client_accuracy_quantiles,
    cluster_size_matrix,
    cluster_sizes_series,
    comm_series,
    evaluated_rounds,
    final_client_accuracy,
    is_language_model,
    is_regression,
    load_config_text,
    metric_series,
    n_clusters_series,
    run_label,
    split_rounds,
)
from clusterfl.report.markdown import (
    comparison_warnings,
    run_setup,
    summary_markdown,
    summary_rows,
    summary_table,
    write_comparison_report,
    write_run_report,
)

__all__ = [
    "RunDirError",
    "accuracy_series",
    "ari_series",
    "client_accuracy_matrix",
    "client_accuracy_quantiles",
    "cluster_size_matrix",
    "cluster_sizes_series",
    "comm_series",
    "comparison_warnings",
    "evaluated_rounds",
    "final_client_accuracy",
    "human_units",
    "is_language_model",
    "is_regression",
    "load_config_text",
    "metric_series",
    "n_clusters_series",
    "plot_accuracy",
    "plot_ari",
    "plot_client_accuracy",
    "plot_cluster_sizes",
    "plot_communication",
    "plot_comparison",
    "plot_matrix",
    "plot_run",
    "plot_series",
    "read_history",
    "read_summary",
    "run_label",
    "run_setup",
    "split_rounds",
    "summary_markdown",
    "summary_rows",
    "summary_table",
    "write_comparison_report",
    "write_run_report",
]
