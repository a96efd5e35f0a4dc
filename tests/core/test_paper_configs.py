"""Every config in benchmarks/papers/ starts and finishes a 2-round run on tiny files in the
official formats (tests/paper_files.py). The configs keep the papers' settings; this test
shrinks them from outside (rounds, clients, samples, local epochs or steps, encoder
pretraining and fine-tuning, ResNet width; FLT without UMAP, whose first call alone costs
30-60 s) and reads the fake files without the catalog's checksums, which they cannot match.

A config added to the folder runs here too; a data source or scenario this test does not know
yet fails with a message naming what to add to `FILES` / `SMALL`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import clusterfl.data.sources
from clusterfl.config import read_toml
from clusterfl.experiment import Experiment
from clusterfl.report.markdown import summary_rows
from tests.paper_files import (
    write_ag_news,
    write_cifar10,
    write_cifar100,
    write_emnist,
    write_femnist,
    write_idx_set,
)

pytestmark = pytest.mark.usefixtures("one_thread")

PAPERS = Path(__file__).resolve().parents[2] / "benchmarks" / "papers"
CONFIGS = sorted(PAPERS.glob("*.toml"))

FILES = {
    "emnist": lambda root: (write_emnist(root, "balanced", 20, 4),
                            write_emnist(root, "byclass", 10, 3, seed=1)),
    "cifar10": lambda root: write_cifar10(root, per_batch=20, test=20),
    "cifar100": lambda root: write_cifar100(root, train=200, test=100),
    "femnist": lambda root: write_femnist(root, n_writers=6, train=8, test=2),
    "fashion_mnist": lambda root: write_idx_set(root, "fashion_mnist"),
    "mnist": lambda root: write_idx_set(root, "mnist"),
    "ag_news": lambda root: write_ag_news(root, per_topic=12, test=4),
}
"""Data source → writer of its tiny official-format files (all are written once)."""

SMALL: dict[str, dict[str, Any]] = {
    "label_swap": {"n_clients": 4, "n_train_per_client": 20},
    "label_permutation": {"n_clients": 4},
    "label_shift_half": {"n_clients": 4},
    "dirichlet_rotation": {"n_clients": 4, "n_samples": 300},
    "cluster_n_class": {"n_clients": 10},
    "cluster_dirichlet": {"n_clients": 10},
    "dirichlet": {"n_clients": 6},
    "n_class": {"n_clients": 6},
    "cluster_labels": {"n_clients": 10, "samples_per_client": 10},
    "writers": {"n_clients": 4},
    "structured_femnist": {"n_clients": 20, "alpha": 1},
    "topics": {"n_clients": 4, "seq_len": 5, "vocab_size": 50},
}
"""Scenario → the sizes that fit the tiny files (the rest of the config as the paper has it)."""


PAPER_NUMBERS: dict[str, dict[str, Any]] = {
    # CFL §V-A (M, K, 3 epochs), §V-C (batch 100), Fig. 7 (1,500 per client, 50 rounds of FL)
    "cfl_label_swap_cifar10": {
        "scenario.n_clients": 20, "scenario.n_clusters": 4, "scenario.n_train_per_client": 1500,
        "train.epochs": 3, "train.batch_size": 100, "algorithm.warmup_rounds": 50},
    # CFL §V-C: "three epochs of local training at a batch size of 100" in all its experiments
    "cfl_label_permutation_cifar10": {
        "scenario.n_clients": 20, "scenario.n_clusters": 4, "train.epochs": 3,
        "train.batch_size": 100},
    "cfl_ag_news_lstm": {
        "scenario.n_clients": 20, "model.layers": 2, "rounds": 100, "train.epochs": 3,
        "train.batch_size": 100},
    # CFL-GP F.7: Adam 0.01, one epoch, T = 300, b = 100, P = 2, C = 20, K = 2
    "cflgp_exp2_cifar10_resnet18": {
        "scenario.n_clients": 20, "train.optimizer": "adam", "train.lr": 0.01,
        "train.epochs": 1, "rounds": 300, "train.batch_size": 100, "algorithm.period": 2,
        "algorithm.n_clusters": 2, "algorithm.protocol": "model",
        "algorithm.feature_layers": ["fc"]},
    # CFL-GP F.8 (+ F.5: P = 2): T = 100, b = 200, lr 0.1, C = 10, 200,000 samples, Dir(1.0)
    "cflgp_exp3_emnist": {
        "data.split": "byclass", "scenario.n_clients": 10, "scenario.n_samples": 200_000,
        "scenario.alpha": 1.0, "scenario.angles": [0, 180], "rounds": 100,
        "train.batch_size": 200, "train.lr": 0.1, "train.epochs": 1, "algorithm.period": 2,
        "algorithm.n_clusters": 2, "algorithm.protocol": "model"},
    # CAM §5: 200 clients, SGD 0.001 momentum 0.9, batch 32, 10 local steps, 100 rounds, 30
    # warm-up; Table 1: n-class (3, 2), K = 5; Table 2: Dir(0.1), K = 5
    "cam_table1_cifar10": {
        "scenario.n_clients": 200, "scenario.n_clusters": 5, "scenario.n1": 3, "scenario.n2": 2,
        "train.lr": 0.001, "train.momentum": 0.9, "train.batch_size": 32, "train.steps": 10,
        "rounds": 100, "algorithm.warmup_rounds": 30, "algorithm.n_clusters": 5},
    "cam_table2_cifar10": {
        "scenario.n_clients": 200, "scenario.alpha": 0.1, "train.lr": 0.001,
        "train.momentum": 0.9, "train.batch_size": 32, "train.steps": 10, "rounds": 100,
        "algorithm.warmup_rounds": 30, "algorithm.n_clusters": 5},
    # FLT §4.1-4.2: E = 5, batch 10, SGD 0.01, T = 100, rho = 20%, F = 5; scenario 1: 100
    # clients, C = 5, 500 per client on CIFAR-10; scenario 3: 200 writers; scenario 4: 600
    # clients (CNN), C = 10 of 5 classes
    "flt_cifar10_enc2_cifar100": {
        "scenario.n_clients": 100, "scenario.n_clusters": 5, "scenario.samples_per_client": 500,
        "train.epochs": 5, "train.batch_size": 10, "train.lr": 0.01, "rounds": 100,
        "algorithm.fraction": 0.2, "algorithm.finetune_epochs": 5,
        "algorithm.encoder": "cifar100"},
    "flt_femnist_s3": {
        "scenario.n_clients": 200, "train.epochs": 5, "train.batch_size": 10, "train.lr": 0.01,
        "rounds": 100, "algorithm.fraction": 0.2, "algorithm.finetune_epochs": 5,
        "algorithm.encoder": "fashion_mnist"},
    "flt_structured_femnist_s4": {
        "data.split": "balanced", "scenario.n_clients": 600, "scenario.n_clusters": 10,
        "scenario.classes_per_cluster": 5, "train.epochs": 5, "train.batch_size": 10,
        "train.lr": 0.01, "rounds": 100, "algorithm.fraction": 0.2,
        "algorithm.finetune_epochs": 5, "algorithm.encoder": "fashion_mnist"},
}
"""Config → the paper's values of its settings (dotted keys), as the comments cite them."""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("paper_data")
    for write in FILES.values():
        write(root)
    return root


def small(raw: dict[str, Any], data_dir: Path, out: Path) -> dict[str, Any]:
    """The config at test size: 2 rounds, few clients and samples, a 1-epoch encoder."""
    source, scenario = raw["data"]["source"], raw["scenario"]["name"]
    assert source in FILES, f"add a writer of tiny {source!r} files to FILES"
    assert scenario in SMALL, f"add the test sizes of scenario {scenario!r} to SMALL"
    raw = {**raw, "rounds": 2, "eval_every": 1, "checkpoint_every": 0}
    raw["data"] = {**raw["data"], "data_dir": str(data_dir)}
    raw["scenario"] = {**raw["scenario"], **SMALL[scenario]}
    raw["output"] = {**raw.get("output", {}), "figures": False, "progress": "off"}
    train = dict(raw.get("train", {}))
    if train.get("steps"):
        train["steps"] = min(int(train["steps"]), 2)
    elif train.get("epochs"):
        train["epochs"] = 1
    raw["train"] = train
    algorithm = dict(raw.get("algorithm", {}))
    if "warmup_rounds" in algorithm:
        algorithm["warmup_rounds"] = 1
    if algorithm.get("name") in ("flt", "pca_km_hc"):
        algorithm.update(pretrain_epochs=1, finetune_epochs=min(algorithm.get(
            "finetune_epochs", 1), 1), encoder_dir=str(out / "encoders"),
                         data_dir=str(data_dir), umap=False)  # UMAP's JIT: 30-60 s here;
        # tests/algorithms/test_flt.py runs FLT through UMAP
    raw["algorithm"] = algorithm
    if raw.get("model", {}).get("name") == "resnet18":
        raw["model"] = {**raw["model"], "width": 8}  # 11 M parameters are the GPU's job
    if raw.get("model", {}).get("name") == "lstm":
        raw["model"] = {**raw["model"], "embed": 8, "hidden": 8}
    return raw


def test_the_folder_has_the_papers_experiments() -> None:
    names = {c.stem for c in CONFIGS}
    assert {"cfl_label_swap_cifar10", "cfl_label_permutation_cifar10",
            "cflgp_exp2_cifar10_resnet18", "cflgp_exp3_emnist", "cam_table1_cifar10",
            "cam_table2_cifar10", "flt_cifar10_enc2_cifar100", "flt_femnist_s3",
            "flt_structured_femnist_s4", "cfl_ag_news_lstm"} <= names
    for config in CONFIGS:  # every config says where it comes from and what was scaled
        head = config.read_text().splitlines()[0]
        assert head.startswith("# ") and "(" in head, config.name


@pytest.mark.parametrize("name", sorted(PAPER_NUMBERS))
def test_each_config_keeps_the_papers_numbers(name: str) -> None:
    raw = read_toml(PAPERS / f"{name}.toml")
    for key, paper in PAPER_NUMBERS[name].items():
        value: Any = raw
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        assert value == paper, f"{name}: {key} = {value!r}, the paper has {paper!r}"


def test_every_config_lists_the_papers_numbers() -> None:
    assert {c.stem for c in CONFIGS} == set(PAPER_NUMBERS), "add its paper values to " \
        "PAPER_NUMBERS"


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_each_paper_config_runs_two_rounds(config: Path, data_dir: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clusterfl.data.sources, "check_known_files", lambda *a, **k: None)
    raw = small(read_toml(config), data_dir, tmp_path)
    history = Experiment.from_config(raw, out_dir=tmp_path / "run").run(progress=False)
    assert [r.round for r in history.records] == [1, 2]
    final = history.final.metrics
    assert final is not None and final.accuracy is not None and math.isfinite(final.accuracy)
    headers, rows = summary_rows([history.summary])
    ari = rows[0][headers.index("ARI")]
    if raw["scenario"]["name"] in ("writers", "dirichlet"):  # no true clusters: not 0
        assert history.summary.true_clusters is None and ari == "n/a"
    else:
        assert history.summary.true_clusters is not None and -1.0 <= float(ari) <= 1.0
