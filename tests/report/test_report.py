"""Tests of clusterfl.report on synthetic run directories (20 rounds, 12 clients, 3 clusters)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.image import imread
from numpy.testing import assert_allclose, assert_array_equal
from rich.console import Console

from clusterfl.errors import ClusterFLError
from clusterfl.records import RoundRecord, RunSummary
from clusterfl.report import (
    accuracy_series,
    ari_series,
    client_accuracy_quantiles,
    cluster_size_matrix,
    cluster_sizes_series,
    comm_series,
    evaluated_rounds,
    human_units,
    is_regression,
    n_clusters_series,
    plot_client_accuracy,
    plot_cluster_sizes,
    plot_matrix,
    plot_run,
    plot_series,
    read_history,
    read_summary,
    split_rounds,
    summary_markdown,
    summary_rows,
    summary_table,
    write_comparison_report,
    write_run_report,
)
from clusterfl.report.figures import _cluster_layers

N_CLIENTS, ROUNDS, TRUE = 12, 20, [0] * 4 + [1] * 4 + [2] * 4


# --------------------------------------------------------------------------- fake runs


def _assignment(kind: str, t: int, rng: np.random.Generator) -> list[int]:
    """Cluster ids of the 12 clients at round t for a run of the given kind."""
    true = np.array(TRUE)
    if kind == "fedavg":
        return [0] * N_CLIENTS
    if kind == "ifca":  # random at first, then the true clusters under ids (c + 1) % 4
        noisy = rng.integers(0, 4, N_CLIENTS)
        return [int(x) for x in np.where(rng.random(N_CLIENTS) < min(1.0, t / 8), true + 1, noisy)]
    if kind == "collapse":  # clients drain into cluster 0 by round 10
        return [0 if rng.random() < t / 10 else int(x) for x in (true + 1)]
    if kind == "cfl":  # one cluster, split at rounds 6 and 11; client 11 dropped at round 3
        ids = np.zeros(N_CLIENTS, dtype=int) if t < 6 else np.where(true == 0, 1, 2)
        ids = ids if t < 11 else np.where(true == 2, 3, ids)
        return [int(x) for x in ids[:-1]] + ([-1] if t == 3 else [int(ids[-1])])
    raise ValueError(kind)


def _fraction_correct(assignment: Sequence[int]) -> float:
    """A cheap stand-in for ARI: fraction of client pairs whose co-membership is right."""
    a, b = np.array(assignment), np.array(TRUE)
    same_a, same_b = a[:, None] == a[None, :], b[:, None] == b[None, :]
    return float(2 * np.mean(same_a == same_b) - 1)


def _metrics(rng: np.random.Generator, t: int, quality: float, regression: bool) -> tuple:
    """(metrics, client_accuracy) of an evaluated round."""
    acc = np.clip(0.35 + 0.55 * quality * (1 - np.exp(-t / 6)) + rng.normal(0, 0.04, 12), 0, 1)
    if regression:
        mse = float(2.0 * np.exp(-t / 7) + 0.1)
        keys = ("accuracy", "accuracy_weighted", "macro_f1", "fairness_var")
        return {**dict.fromkeys(keys), "loss": mse, "mse": mse}, None
    metrics = {
        "accuracy": float(acc.mean()),
        "accuracy_weighted": float(acc.mean() + 0.01),
        "macro_f1": float(acc.mean() - 0.03),
        "fairness_var": float(np.var(100 * acc)),
        "loss": float(1.5 * (1 - acc.mean())),
        "mse": None,
    }
    return metrics, [float(a) for a in acc]


def make_run(
    run_dir: Path,
    kind: str,
    label: str,
    *,
    regression: bool = False,
    seed: int = 0,
    extra_final: dict[str, Any] | None = None,
) -> Path:
    """Write config.toml, history.jsonl and summary.json of a synthetic run; return run_dir."""
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    quality = {"fedavg": 0.6, "ifca": 1.0, "collapse": 0.7, "cfl": 0.95}[kind]
    records, down = [], 0.0
    for t in range(1, ROUNDS + 1):
        assignment = _assignment(kind, t, rng)
        evaluated = t % 2 == 0 or t == 1
        metrics, client_acc = _metrics(rng, t, quality, regression) if evaluated else (None, None)
        n_models = len({a for a in assignment if a >= 0})
        down += 1.1e5 * N_CLIENTS * n_models  # each client receives every cluster model
        records.append({
            "round": t,
            "wall_time": 0.8 * t,
            "n_clusters": n_models,
            "assignment": assignment,
            "ari": _fraction_correct(assignment),
            "floats_down": down,
            "floats_up": 1.1e5 * N_CLIENTS * t,
            "metrics": metrics,
            "client_accuracy": client_acc,
            "rejected": 0,
            "extras": {"split": kind == "cfl" and t in (6, 11), "mean_update_norm": 1 / t},
        })
    with (run_dir / "history.jsonl").open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    last = records[-1]
    final = {
        **(last["metrics"] or {}),
        "ari": last["ari"],
        "n_clusters": last["n_clusters"],
        "floats_down": last["floats_down"],
        "floats_up": last["floats_up"],
        "wall_time": last["wall_time"],
        **(extra_final or {}),
    }
    summary = {
        "algorithm": kind,
        "label": label,
        "federation": "synthetic_rotated",
        "n_clients": N_CLIENTS,
        "rounds": ROUNDS,
        "true_clusters": TRUE,
        "final": final,
        "client_accuracy": last["client_accuracy"],
        "assignment": last["assignment"],
        "extras": {"cfl_gap": 0.42, "singular_values": [3.0, 1.0], "train_loss": None,
                   "split": False, "n_found": 3},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "config.toml").write_text(f'algorithm = "{kind}"\n[scenario]\nn_clients = 12\n')
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three runs on the same federation: fedavg, a good ifca, and a collapsing ifca."""
    base = tmp_path_factory.mktemp("runs")
    return [
        make_run(base / "fedavg", "fedavg", "fedavg"),
        make_run(base / "ifca", "ifca", "ifca(K=4)", seed=1),
        make_run(base / "collapse", "collapse", "ifca(K=4) collapse", seed=2),
    ]


def assert_png(path: Path, min_h: int = 250, min_w: int = 350) -> None:
    """`path` is a readable PNG image of at least min_h × min_w pixels."""
    assert path.is_file() and path.suffix == ".png", path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] >= min_h and image.shape[1] >= min_w, image.shape


# --------------------------------------------------------------------------- history


def test_cluster_size_matrix_hand_example() -> None:
    ids, counts = cluster_size_matrix([[0, 0, 1, -1], [2, 2, 2, 2], [1, 0, 1, 1]])
    assert_array_equal(ids, [-1, 0, 1, 2])
    assert_array_equal(counts, [[1, 2, 1, 0], [0, 0, 0, 4], [0, 1, 3, 0]])


def test_cluster_sizes_series_rows_sum_to_clients(runs: list[Path]) -> None:
    rounds, ids, counts = cluster_sizes_series(read_history(runs[2]))
    assert_array_equal(rounds, np.arange(1, ROUNDS + 1))
    assert counts.shape == (ROUNDS, ids.size)
    assert_array_equal(counts.sum(axis=1), N_CLIENTS)
    assert counts[-1, list(ids).index(0)] == N_CLIENTS  # collapsed into cluster 0


def test_series_helpers(runs: list[Path]) -> None:
    history = read_history(runs[1])
    expected = np.array([1, *range(2, ROUNDS + 1, 2)])
    assert_array_equal(evaluated_rounds(history), expected)
    rounds, acc = accuracy_series(history)
    assert_array_equal(rounds, expected)
    assert history[-1].metrics is not None
    assert_allclose(acc[-1], history[-1].metrics.accuracy)
    q_rounds, low, high = client_accuracy_quantiles(history)
    assert_array_equal(q_rounds, expected)
    assert np.all(low <= high)
    assert ari_series(history)[0].size == ROUNDS
    assert_array_equal(n_clusters_series(history)[1][:1], [history[0].n_clusters])
    _, down, up = comm_series(history)
    assert np.all(np.diff(down) > 0) and np.all(np.diff(up) > 0)
    assert not is_regression(history)


def test_split_rounds_and_unassigned(tmp_path: Path) -> None:
    history = read_history(make_run(tmp_path / "cfl", "cfl", "cfl"))
    assert split_rounds(history) == [6, 11]
    ids, counts = cluster_size_matrix([history[2].assignment])
    assert ids[0] == -1 and counts[0, 0] == 1


def _line(t: int, n_clusters: int = 1) -> str:
    """A history.jsonl line of round t (an unevaluated round)."""
    return json.dumps(_record(t, n_clusters).to_json_dict())


def _record(t: int, n_clusters: int = 1, assignment: list[int] | None = None) -> RoundRecord:
    return RoundRecord(round=t, wall_time=0.1 * t, n_clusters=n_clusters,
                       assignment=assignment or [0] * N_CLIENTS, ari=None, floats_down=0.0,
                       floats_up=0.0)


def test_read_history_sorts_and_keeps_last_of_repeated_round(tmp_path: Path) -> None:
    lines = [_line(2, 1), _line(1, 1), _line(2, 5)]
    (tmp_path / "history.jsonl").write_text("\n".join(lines) + "\n\n")
    history = read_history(tmp_path)
    assert [r.round for r in history] == [1, 2] and history[1].n_clusters == 5


def test_missing_files_are_named(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(ClusterFLError, match=r"missing history\.jsonl"):
        read_history(tmp_path)
    with pytest.raises(ClusterFLError, match=r"missing history\.jsonl"):
        write_run_report(tmp_path)
    (tmp_path / "summary.json").unlink()
    (tmp_path / "history.jsonl").write_text(_line(1) + "\n")  # begun, not finished
    with pytest.raises(ClusterFLError, match=r"has not finished \(no summary\.json"):
        write_run_report(tmp_path)


def test_not_a_directory_and_bad_lines(tmp_path: Path) -> None:
    with pytest.raises(ClusterFLError, match="not a directory"):
        read_history(tmp_path / "absent")
    (tmp_path / "history.jsonl").write_text(_line(1) + '\n{"round": 2,\n')
    with pytest.raises(ClusterFLError, match=r"history\.jsonl:2: not valid JSON"):
        read_history(tmp_path)
    (tmp_path / "history.jsonl").write_text(_line(1) + '\n{"round": 2}\n')
    with pytest.raises(ClusterFLError, match=r"history\.jsonl:2: a history record lacks"):
        read_history(tmp_path)
    (tmp_path / "history.jsonl").write_text("\n")
    with pytest.raises(ClusterFLError, match="empty"):
        read_history(tmp_path)


# --------------------------------------------------------------------------- figures


def test_plot_run_writes_all_figures(runs: list[Path]) -> None:
    paths = plot_run(runs[1])
    names = ["accuracy", "ari", "client_accuracy", "cluster_sizes", "communication"]
    assert [p.name for p in paths] == [f"{n}.png" for n in names]
    for path in paths:
        assert path.parent == runs[1] / "figures"
        assert_png(path)


def test_plot_run_regression_and_unknown_truth(tmp_path: Path) -> None:
    run = make_run(tmp_path / "reg", "cfl", "cfl", regression=True)
    summary = replace(read_summary(run), true_clusters=None)
    (run / "summary.json").write_text(json.dumps(summary.to_json_dict()))
    history = [replace(r, ari=None) for r in read_history(run)]
    (run / "history.jsonl").write_text(
        "".join(json.dumps(r.to_json_dict()) + "\n" for r in history))
    assert is_regression(history)
    paths = plot_run(run)
    assert "client_accuracy.png" not in {p.name for p in paths}  # no per-client accuracy
    for path in paths:
        assert_png(path)
    # a real regression run writes a null accuracy per client: still no figure (it was an
    # empty chart with the legend "mean nan%")
    nulls = replace(summary, client_accuracy=[None] * N_CLIENTS)
    (run / "summary.json").write_text(json.dumps(nulls.to_json_dict()))
    assert "client_accuracy.png" not in {p.name for p in plot_run(run)}


def test_a_methods_figures_are_captioned_from_its_report_module() -> None:
    """Before: `![](figures/cluster_balance.png)`, no name and no caption."""
    from clusterfl.report.markdown import _figure_links

    text = _figure_links([Path("r/figures/cluster_balance.png"),
                          Path("r/figures/cfl_similarity_12_3.png")], Path("r"))
    assert "![cluster_balance](figures/cluster_balance.png)\n\n*The share of clients in " \
        "the largest cluster" in text
    assert "![cfl_similarity_12_3](figures/cfl_similarity_12_3.png)\n\n*For every accepted " \
        "split" in text


def test_plot_matrix_and_series(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    truth = np.array(TRUE)[rng.permutation(N_CLIENTS)]
    same = truth[:, None] == truth[None, :]
    similarity = np.where(same, 0.8, -0.3) + rng.normal(0, 0.05, (N_CLIENTS, N_CLIENTS))
    order = np.argsort(truth, kind="stable")
    assert_png(plot_matrix(similarity, order, tmp_path / "sim.png", "cosine", labels=truth))
    adjacency = (similarity > 0).astype(float)
    assert_png(plot_matrix(adjacency, order, tmp_path / "adj.png", "adjacency"))
    series = {"mean": ([1, 2, 3], [0.1, 0.3, 0.2]), "max": ([1, 2, 3], [0.4, 0.9, 0.5])}
    assert_png(plot_series(series, tmp_path / "s" / "gap.png", "gap", "norm", marks=[2]))


def test_client_accuracy_and_many_clusters_cap_legend(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    truth = rng.integers(0, 15, 60)
    path = plot_client_accuracy(rng.random(60), tmp_path / "c.png", "x", truth.tolist())
    assert_png(path)
    history = [_record(t, 30, rng.integers(0, 30, 60).tolist()) for t in range(1, 6)]
    assert_png(plot_cluster_sizes(history, tmp_path / "sizes.png", "flt"))
    ids, counts = cluster_size_matrix([r.assignment for r in history])
    layers, names, _ = _cluster_layers(ids, counts)
    assert len(names) == 11 and names[-1].startswith("other (20")
    assert_allclose(layers.sum(axis=0), 60)


# --------------------------------------------------------------------------- tables, reports


@pytest.mark.parametrize(
    ("value", "text"),
    [(950, "950"), (1234, "1.2k"), (1.2e6, "1.2M"), (3.44e9, "3.4G"), (123.4e6, "123M"),
     (0, "0"),
     # rounding up to 1000 of a unit is the next unit (was "1000", "1000k", "100.0k")
     (999.6, "1.0k"), (999_950, "1.0M"), (99_960, "100k"), (-999_950, "-1.0M"),
     (5e15, "5000T")],
)
def test_human_units(value: float, text: str) -> None:
    assert human_units(value) == text


def _summary(label: str, **final: Any) -> RunSummary:
    base = dict.fromkeys(["accuracy_weighted", "macro_f1", "fairness_var", "loss", "mse",
                          "ari", "n_clusters", "floats_down", "floats_up", "wall_time"])
    return RunSummary.from_json_dict(
        {"label": label, "algorithm": label, "final": {**base, **final}})


def test_summary_markdown_formats_numbers() -> None:
    summaries = [
        _summary("ifca(K=4)", accuracy=0.8734, accuracy_weighted=0.9, macro_f1=0.81234,
                 fairness_var=12.345, ari=0.91234, n_clusters=4, floats_down=1.2e6,
                 floats_up=3.4e9, rejected=7, wall_time=12.34),
        _summary("fedavg", accuracy=0.5),
        _summary("fast", accuracy=0.5, wall_time=0.0258),  # before: "0.0" s for a run of 26 ms
    ]
    text = summary_markdown(summaries)
    lines = text.strip().splitlines()
    assert lines[0].startswith("| method | accuracy (%) | weighted acc (%) | macro-F1 (%)")
    assert "| rejected |" in lines[0]  # rejected updates over the run
    assert "MSE" not in lines[0] and lines[1].count("---:") == 10
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells == ["ifca(K=4)", "87.34", "90.00", "81.23", "12.35", "0.912", "4", "1.2M",
                     "3.4G", "7", "12.3"]
    assert re.fullmatch(r"\| fedavg \| 50\.00 (\| — ){9}\|", lines[3])
    assert lines[4].endswith("| 0.026 |")


def test_mse_column_only_with_regression() -> None:
    headers, rows = summary_rows([_summary("a", accuracy=0.5), _summary("b", mse=0.012345)])
    assert headers[5] == "MSE" and rows[1][5] == "0.01235" and rows[0][5] == "—"


def test_a_diverged_regression_keeps_its_mse_column() -> None:
    """Before: a regression whose MSE overflowed (null in summary.json) lost the MSE column,
    and its row read four "—" accuracies and nothing of its own metric."""
    diverged = _summary("reg", accuracy=None, n_clusters=1)
    headers, rows = summary_rows([diverged])
    assert headers[1:6] == ["accuracy (%)", "weighted acc (%)", "macro-F1 (%)",
                            "fairness var (%²)", "MSE"] and rows[0][5] == "—"
    not_evaluated = RunSummary.from_json_dict({"label": "x", "final": {"ari": 0.5}})
    assert "MSE" not in summary_rows([not_evaluated, _summary("a", accuracy=0.5)])[0]
    words = _summary("lm", accuracy=None, perplexity=12.5)  # a language model: no MSE
    assert "MSE" not in summary_rows([words])[0]


def test_the_progress_line_of_a_regression_says_its_mse_was_not_finite(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before: an evaluated round of a diverged regression showed no metric at all
    ("round 2/2   clusters 1"), where the results table shows "—"."""
    from clusterfl.progress import Progress

    def record(t: int, mse: float | None, evaluated: bool = True) -> RoundRecord:
        metrics = dict.fromkeys(["accuracy", "accuracy_weighted", "macro_f1", "fairness_var",
                                 "loss"]) | {"mse": mse}
        return RoundRecord.from_json_dict({
            "round": t, "wall_time": 0.1, "n_clusters": 1, "assignment": [0, 0], "ari": None,
            "floats_down": 2.0, "floats_up": 2.0, "rejected": 0, "extras": {},
            "metrics": metrics if evaluated else None,
            "client_accuracy": [None, None] if evaluated else None,
            **({"client_mse": [mse, mse]} if evaluated else {})})

    for records, shown in (([record(1, 0.25), record(2, None)], "round 2/2 mse —  clusters 1"),
                           ([record(1, None, evaluated=False)], "round 1/1 clusters 1 "),
                           ([record(1, 0.123456)], "round 1/1 mse 0.1235  clusters 1")):
        with Progress(True, len(records), 0, "FedAvg") as bar:
            for rec in records:
                bar.update(rec)
        assert shown in capsys.readouterr().err


def test_a_round_not_evaluated_shows_the_last_evaluated_metric_with_its_round(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before: with eval_every > 1 the bar showed no metric between evaluations ("round 4/4
    clusters 2"); now the last evaluated one, labelled with its round, and the record (what
    history.jsonl gets) is left as it is."""
    from clusterfl.progress import Progress

    def record(t: int, metrics: dict[str, float | None] | None) -> RoundRecord:
        keys = ["accuracy", "accuracy_weighted", "macro_f1", "fairness_var", "loss", "mse"]
        return RoundRecord.from_json_dict({
            "round": t, "wall_time": 0.1, "n_clusters": 2, "assignment": [0, 1], "ari": None,
            "floats_down": 2.0, "floats_up": 2.0, "rejected": 0, "extras": {},
            "metrics": None if metrics is None else dict.fromkeys(keys) | metrics,
            "client_accuracy": None if metrics is None else [None, None]})

    acc, words = {"accuracy": 0.9123}, {"perplexity": 12.345, "accuracy_no_oov_no_eos": 0.25}
    for records, evaluated, shown in (
            ([record(1, None), record(2, acc), record(3, None), record(4, None)], None,
             "round 4/4 acc 91.2% (r2)  clusters 2"),
            ([record(1, None), record(2, words), record(3, None)], None,
             "round 3/3 perplexity 12.35  acc no oov/eos 25.0% (r2)  clusters 2"),
            ([record(2, None)], record(1, acc), "round 2/2 acc 91.2% (r1)  clusters 2"),
            ([record(1, None)], None, "round 1/1 clusters 2 "),  # nothing evaluated yet
            ([record(1, acc), record(2, {}), record(3, None)], None,  # r2: no metric to show
             "round 3/3 clusters 2 ")):
        done = 0 if evaluated is None else evaluated.round
        with Progress(True, done + len(records), done, "FedAvg", evaluated) as bar:
            for rec in records:
                bar.update(rec)
        assert shown in capsys.readouterr().err
        assert records[-1].metrics is None  # the record (history.jsonl) untouched


def test_participation_column_only_when_a_run_sampled() -> None:
    full = _summary("a", accuracy=0.5, participation=1.0)
    assert "participation (%)" not in summary_rows([full, _summary("b")])[0]
    headers, rows = summary_rows([full, _summary("c", participation=0.25)])
    col = headers.index("participation (%)")
    assert headers[col + 1] == "wall time (s)" and [r[col] for r in rows] == ["100.00", "25.00"]


def test_summary_table_renders() -> None:
    table = summary_table([_summary("ifca|x", accuracy=0.8734, floats_up=3.4e9)], title="T")
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(table)
    out = console.file.getvalue()
    assert "87.34" in out and "3.4G" in out and "ifca|x" in out
    assert "ifca\\|x" in summary_markdown([_summary("ifca|x")])  # pipes escaped in markdown


def test_write_run_report(runs: list[Path]) -> None:
    path = write_run_report(runs[2])
    text = path.read_text()
    assert path == runs[2] / "report.md"
    assert text.startswith("# ifca(K=4) collapse\n") and "synthetic_rotated" in text
    assert '```toml\nalgorithm = "collapse"' in text
    summary = read_summary(runs[2])
    assert summary.final.metrics is not None and summary.final.metrics.accuracy is not None
    assert f"| {100 * summary.final.metrics.accuracy:.2f} |" in text
    assert "| cfl_gap | 0.42 |" in text and "singular_values" not in text
    assert "| train_loss | — |" in text  # null (a diverged run's loss): shown, not dropped
    assert "| split | false |" in text and "| n_found | 3 |" in text  # before: "False"
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == 5 and all((runs[2] / link).is_file() for link in links)


def test_write_comparison_report(runs: list[Path], tmp_path: Path) -> None:
    (runs[0] / "report.md").write_text("# fedavg\n")  # as left by write_run_report
    order = [runs[2], runs[0], runs[1]]
    text = write_comparison_report(order, tmp_path / "cmp").read_text()
    for name in ("accuracy_compare", "ari_compare", "communication_compare"):
        assert_png(tmp_path / "cmp" / f"{name}.png")
    labels = ["ifca(K=4) collapse", "fedavg", "ifca(K=4)"]
    results = text.split("## Results", 1)[1].split("\n## ", 1)[0]
    table_rows = [line for line in results.splitlines()
                  if line.startswith("| ") and "%" not in line]
    assert [row.split("|")[1].strip() for row in table_rows] == labels
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert images == ["accuracy_compare.png", "ari_compare.png", "communication_compare.png"]
    runs = text.split("## Runs", 1)[1]
    runs_links = re.findall(r"\| \[[^\]]+\]\(<([^)]+)>\)", runs)
    assert len(runs_links) == 3 and all((tmp_path / "cmp" / r).exists() for r in runs_links)
    assert runs_links[1].endswith("fedavg/report.md")
    # one federation: no warning; each run's federation and folder in the runs table
    assert "Warning" not in text
    assert "| `synthetic_rotated`, 12 clients | `fedavg` |" in runs


def test_runs_of_one_label_are_told_apart_by_their_folders(tmp_path: Path) -> None:
    """Before: `report sweep/*/*/seed*` gave four rows all named "FedAvg", and warnings that
    could not be told apart."""
    dirs = [make_run(tmp_path / cell / "fedavg" / seed, "fedavg", "FedAvg")
            for cell in ("lr_0.1", "lr_0.05") for seed in ("seed0", "seed1")]
    text = write_comparison_report(dirs, tmp_path / "cmp").read_text()
    for cell in ("lr_0.1", "lr_0.05"):
        for seed in ("seed0", "seed1"):
            assert f"| FedAvg [{cell}/fedavg/{seed}] |" in text
    other = make_run(tmp_path / "x" / "ifca", "ifca", "IFCA")
    text = write_comparison_report([dirs[0], other], tmp_path / "cmp2").read_text()
    assert "| FedAvg |" in text and "FedAvg [" not in text  # distinct labels stay as they are


def test_a_run_that_has_not_finished_is_named_so_not_a_missing_file(tmp_path: Path) -> None:
    """Before: `RUN is not a run directory: missing summary.json` for a stopped or running
    run (its history and checkpoint there)."""
    from clusterfl.records import RunDirError

    run = make_run(tmp_path / "live", "fedavg", "FedAvg")
    (run / "summary.json").unlink()
    with pytest.raises(RunDirError) as err:
        read_summary(run)
    assert f"{run} is a run that has not finished (no summary.json; its history ends at " \
        f"round {ROUNDS})" in str(err.value) and "--resume" in str(err.value)


def test_the_console_table_shows_a_label_with_brackets_as_written() -> None:
    """`shared_layers=["layers"]` in a label showed as `shared_layers=`: rich read
    `[layers]` as markup and dropped it."""
    import io

    from rich.console import Console

    from clusterfl.records import RunSummary
    from clusterfl.report.markdown import summary_table

    label = 'CFL-GP (K=4, shared_layers=["layers"], [bold])'
    console = Console(file=io.StringIO(), width=300)
    console.print(summary_table([RunSummary(label=label)], title="runs [dim]"))
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert label in shown and "runs [dim]" in shown


def _compare_figures(monkeypatch: pytest.MonkeyPatch, dirs: list[Path], out: Path) -> dict:
    """The comparison figures of `dirs`, as matplotlib figures by file name."""
    from clusterfl.report import figures

    drawn: dict[str, Any] = {}
    save = figures._save

    def keep(fig: Any, path: str | Path) -> Path:
        drawn[Path(path).name] = fig
        return save(fig, path)

    monkeypatch.setattr(figures, "_save", keep)
    figures.plot_comparison(dirs, out)
    return drawn


def test_a_run_evaluated_only_in_its_last_round_is_drawn_in_the_comparison(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a run with `eval_every` above its rounds (one evaluated round) was in the
    legend of accuracy_compare.png but drew nothing: a line of one point without a marker."""
    once = make_run(tmp_path / "once", "ifca", "IFCA once")
    lines = (once / "history.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    for row in rows[:-1]:
        row["metrics"], row["client_accuracy"] = None, None
    (once / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    every = make_run(tmp_path / "every", "fedavg", "FedAvg")
    drawn = _compare_figures(monkeypatch, [once, every], tmp_path / "cmp")
    ax = drawn["accuracy_compare.png"].axes[0]
    line = next(line for line in ax.get_lines() if line.get_label() == "IFCA once")
    assert line.get_xdata().tolist() == [ROUNDS]
    assert line.get_marker() not in (None, "None", "", " ") and line.get_markersize() > 0
    assert line.get_ydata()[0] == pytest.approx(100 * rows[-1]["metrics"]["accuracy"])


def test_a_regression_run_left_out_of_an_accuracy_comparison_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: comparing a regression run with classification runs drew accuracy only, and the
    regression run was missing from the figure (and its legend) without a word."""
    reg = make_run(tmp_path / "reg", "cfl", "CFL regression", regression=True)
    cls = make_run(tmp_path / "cls", "ifca", "IFCA")
    drawn = _compare_figures(monkeypatch, [reg, cls], tmp_path / "cmp")
    ax = drawn["accuracy_compare.png"].axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["IFCA"]
    assert "not drawn (no accuracy): CFL regression" in ax.get_xlabel()
    other = make_run(tmp_path / "fedavg", "fedavg", "FedAvg")
    drawn = _compare_figures(monkeypatch, [other, cls], tmp_path / "cmp2")
    assert drawn["accuracy_compare.png"].axes[0].get_xlabel() == "round"


def test_the_held_out_section_says_how_its_client_ids_map_to_the_figures(tmp_path: Path) -> None:
    """Before: the held-out table named clients by their ids in the whole federation (3, 9)
    while the figures above number the trained clients 0..n_train−1, without a word: the
    figures' "client 3" is another client than the table's."""
    run = make_run(tmp_path / "hold", "ifca", "IFCA")
    summary = json.loads((run / "summary.json").read_text())
    trained = [c for c in range(N_CLIENTS + 2) if c not in (3, 9)]
    summary["holdout"] = {"fraction": 0.15, "n_trained": N_CLIENTS, "n_held_out": 2,
                          "trained_clients": trained, "clients": [3, 9],
                          "true_clusters": [0, 2], "placed_clusters": [1, 3],
                          "accuracy": [0.5, 0.7], "placement_ari": 1.0,
                          "placement_match": 1.0, "holdout_accuracy": 0.6}
    (run / "summary.json").write_text(json.dumps(summary))
    text = write_run_report(run).read_text()
    section = text.split("## Held-out clients", 1)[1].split("\n## ", 1)[0]
    assert (f"the figures above number the {N_CLIENTS} trained clients 0..{N_CLIENTS - 1} "
            f"(federation clients {', '.join(map(str, trained))})") in section
    assert "| 3 | 0 | 1 | 50.00 |" in section and "| 9 | 2 | 3 | 70.00 |" in section
    assert "Privacy of the placement" not in section  # a run without [privacy]


def test_the_held_out_section_of_a_regression_gives_the_mse(tmp_path: Path) -> None:
    """Before: a regression's held-out clients (`holdout.mse` in summary.json) read "mean
    accuracy — %" and an accuracy of "—" each: their MSE was said nowhere in the report."""
    run = make_run(tmp_path / "hold", "ifca", "IFCA", regression=True)
    summary = json.loads((run / "summary.json").read_text())
    summary["holdout"] = {"fraction": 0.2, "n_trained": N_CLIENTS, "n_held_out": 3,
                          "clients": [3, 9, 13], "true_clusters": [0, 2, 1],
                          "placed_clusters": [1, 3, 2], "accuracy": [None, None, None],
                          "mse": [0.0125, 0.0375, None], "placement_ari": 1.0,
                          "placement_match": 1.0, "holdout_accuracy": None}
    (run / "summary.json").write_text(json.dumps(summary))
    section = write_run_report(run).read_text().split("## Held-out clients", 1)[1]
    section = section.split("\n## ", 1)[0]
    # (0.0125 + 0.0375) / 2: the client whose MSE is null (no finite one) is named in the count
    assert "mean MSE 0.025 (over the 2 of 3 clients with a finite one);" in section
    assert "| client | true cluster | placed cluster | MSE |" in section
    assert "| 3 | 0 | 1 | 0.0125 |" in section and "| 13 | 1 | 2 | — |" in section
    assert "accuracy" not in section


def test_the_results_table_gives_a_regressions_held_out_mse(tmp_path: Path) -> None:
    """Before: the console table and the report's results table had only "held-out acc (%)",
    "—" for a regression's held-out clients: their MSE was not on the console at all."""
    held = {"clients": [3, 9, 13], "accuracy": [None] * 3, "mse": [0.0125, 0.0375, None]}
    reg = replace(_summary("reg", mse=0.5, placement_ari=1.0), holdout=held)
    cls = replace(_summary("cls", accuracy=0.5, holdout_accuracy=0.75),
                  holdout={"clients": [3], "accuracy": [0.75]})
    headers, rows = summary_rows([reg, cls])
    col = headers.index("held-out MSE")
    assert headers[col - 1] == "held-out acc (%)"
    assert [r[col] for r in rows] == ["0.025", "—"]  # (0.0125 + 0.0375) / 2
    assert [r[col - 1] for r in rows] == ["—", "75.00"]
    assert "held-out MSE" not in summary_rows([cls])[0]  # no regression held out: no column


def test_the_held_out_section_says_what_privacy_did_for_the_placement(tmp_path: Path) -> None:
    """Before: a private run's placement privacy (`holdout.privacy`: the newcomers' clip and
    ε) was in summary.json and on `clusterfl place`'s console, not in the report."""
    run = make_run(tmp_path / "hold", "ifca", "IFCA")
    summary = json.loads((run / "summary.json").read_text())
    note = ("the newcomers' updates were clipped to S = 1 (2 above it); ε = 3.1 at δ = 1e-05 "
            "over 2 release(s), each newcomer's update noised alone (σ = 1)")
    summary["holdout"] = {"fraction": 0.15, "n_trained": N_CLIENTS, "n_held_out": 1,
                          "clients": [3], "true_clusters": [0], "placed_clusters": [1],
                          "accuracy": [0.5], "placement_ari": None, "placement_match": 1.0,
                          "holdout_accuracy": 0.5, "privacy": {"epsilon": 3.1, "note": note}}
    (run / "summary.json").write_text(json.dumps(summary))
    section = write_run_report(run).read_text().split("## Held-out clients", 1)[1]
    assert f"Privacy of the placement: {note}." in section.split("\n## ", 1)[0]


def test_the_run_report_says_what_faults_attacks_and_privacy_did(tmp_path: Path) -> None:
    """Before: summary.json's `robust` (the dropouts, stragglers, adversaries, clipped
    updates and the run's (ε, δ)) was in no section of report.md: a private run's report
    never gave its ε, a run with dropouts only its participation."""
    run = make_run(tmp_path / "dp", "ifca", "IFCA")
    summary = json.loads((run / "summary.json").read_text())
    privacy = {"clip": 0.5, "noise_multiplier": 1.0, "noise": "aggregate", "delta": 1e-05,
               "releases": 3, "unsampled_releases": 0, "sampling_rate": 1.0,
               "epsilon": 9.087861628831664, "accountant": "dp_accounting RDP"}
    summary["robust"] = {"adversaries": [2, 7], "adversary_kind": "sign_flip", "rejected": 1,
                         "dropped": 8, "straggled": 3, "clipped": 5, "privacy": privacy}
    (run / "summary.json").write_text(json.dumps(summary))
    text = write_run_report(run).read_text()
    section = text.split("## Faults, attacks and privacy\n", 1)[1].split("\n## ", 1)[0]
    assert "- adversarial clients (sign_flip): 2, ids 2, 7" in section
    assert "8 dropped out, 3 straggled, 1 replies rejected by the guard" in section
    assert ("clipped to S = 0.5 (5 above it), noise multiplier σ = 1 (aggregate); "
            "(ε, δ) = (9.088, 1e-05) over 3 noised release(s) at sampling rate 1") in section
    privacy.update(epsilon=None, noise_multiplier=0.0)  # clipping alone: no ε
    summary["robust"]["adversaries"] = []
    (run / "summary.json").write_text(json.dumps(summary))
    section = write_run_report(run).read_text().split("## Faults, attacks", 1)[1]
    assert "no noise (noise_multiplier 0), so no ε" in section and "adversarial" not in section
    assert "## Faults" not in write_run_report(make_run(tmp_path / "plain", "ifca", "IFCA")
                                              ).read_text()  # no `robust`: no section


def test_the_cfl_and_cfl_gp_figures_tick_whole_rounds(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """A CFL run of 2 rounds had round ticks 1.0, 1.2, ..., 2.0 in cfl_norms.png,
    cfl_accuracy_gap.png and cfl_split_test.png; CFL-GP's k estimate (rounds) and
    spectrum (index i) the same, and the k estimate's counts 1.2, 1.4, ... on its y axis."""
    from clusterfl.report.methods import cfl, cfl_gp

    drawn: list[Any] = []
    for module in (cfl, cfl_gp):
        monkeypatch.setattr(module, "_save", lambda fig, path: drawn.append(fig) or path)
    records = [RoundRecord(
        round=t, wall_time=0.1, n_clusters=1, assignment=[0] * 4, ari=0.0,
        floats_down=1.0, floats_up=1.0, client_accuracy=[0.5] * 4,
        extras={"clusters": [0], "mean_norm": [0.1 * t], "max_norm": [0.2], "gap": [0.1],
                "split": False, "stationarity": [0.5], "within_mean": [[0.2, 0.3]],
                "cross_mean": [0.1], "refused": ["patience 1/3"],
                "singular_values": [3.0, 1.0, 0.5], "projected_features": [[0.1, 0.2]] * 4,
                "k_estimate": 2, "spectral_gap_s": 1}) for t in (1, 2)]
    cfl.plot_norms(records, tmp_path / "n.png", {})
    cfl.plot_accuracy_gap(records, tmp_path / "g.png", [0, 0, 1, 1])
    cfl.plot_split_test(records, tmp_path / "s.png", {})
    cfl_gp.plot_k_estimate(records, tmp_path / "k.png")
    cfl_gp.plot_spectrum(records, tmp_path / "sp.png")
    assert len(drawn) == 5
    for fig in drawn:
        for ax in fig.axes:
            low, high = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if low <= t <= high]
            assert ticks and all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)
    k_axis = drawn[3].axes[0]  # K and s are counts too
    low, high = k_axis.get_ylim()
    assert all(float(t).is_integer() for t in k_axis.get_yticks() if low <= t <= high)


def test_a_report_of_a_comparisons_folder_skips_its_own_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`clusterfl report runs/cmp/*` refused the comparison's own report.md (and figures):
    `accuracy_compare.png: not a directory (expected a run directory)`."""
    from clusterfl.cli import main

    cmp = tmp_path / "cmp"
    dirs = [make_run(cmp / "fedavg", "fedavg", "FedAvg"),
            make_run(cmp / "ifca", "ifca", "IFCA", seed=1)]
    write_comparison_report(dirs, cmp)
    given = sorted(p for p in cmp.glob("*") if not p.name.startswith("."))
    assert len(given) == 6  # 2 runs, report.md, 3 figures
    assert main(["report", *map(str, given), "--out", str(tmp_path / "rep")]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "clusterfl: note: skipped accuracy_compare.png, ari_compare.png, "
        f"communication_compare.png, report.md in {cmp}: the comparison's own files, not runs"]
    assert "# Comparison of 2 runs" in (tmp_path / "rep" / "report.md").read_text()
    (cmp / "notes.txt").write_text("mine")  # not the comparison's: still refused
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "report.md").write_text("not beside a run given")
    for wrong in (cmp / "notes.txt", tmp_path / "other" / "report.md"):
        assert main(["report", *map(str, dirs), str(wrong), "--out",
                     str(tmp_path / "rep2")]) == 2
        assert f"{wrong}: not a directory" in capsys.readouterr().err
    assert not (tmp_path / "rep2").exists()


def test_a_report_of_several_runs_leaves_out_the_unfinished_ones(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One run of three had not finished: the report refused all three. Now it reports the
    finished ones and says in one line which it left out; only when none finished it fails."""
    from clusterfl.cli import main

    dirs = [make_run(tmp_path / name, kind, label, seed=i) for i, (name, kind, label) in
            enumerate([("a", "fedavg", "FedAvg"), ("b", "ifca", "IFCA"),
                       ("c", "cfl", "CFL")])]
    (dirs[1] / "summary.json").unlink()  # stopped: its history is there
    assert main(["report", *map(str, dirs), "--out", str(tmp_path / "rep")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"clusterfl: warning: report: left out 1 run(s) that have not finished "
                   f"(no summary.json): {dirs[1]}; a stopped run continues with --resume "
                   "(`clusterfl run CONFIG --out RUN --resume`, or its comparison's or "
                   "sweep's own command), then report again"]
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "# Comparison of 2 runs" in text and "| FedAvg |" in text and "| CFL |" in text
    assert "| IFCA |" not in text
    for d in (dirs[0], dirs[2]):
        (d / "summary.json").unlink()
    assert main(["report", *map(str, dirs), "--out", str(tmp_path / "rep2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"clusterfl: error: report: no run has finished (no summary.json: {dirs[0]}, "
        f"{dirs[1]}, {dirs[2]}); a stopped run continues with --resume")
    assert not (tmp_path / "rep2").exists()
