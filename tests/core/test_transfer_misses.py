"""`benchmarks/transfer/misses.py`: a method's misses on the transfer grid grouped by
construction, counted by hand on a few rows (no run)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

TRANSFER = Path(__file__).resolve().parents[2] / "benchmarks" / "transfer"


@pytest.fixture
def misses(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(TRANSFER))
    return importlib.import_module("misses")


def _row(fed: str, method: str, k: int, found: int, ari: float, half: str = "validation9",
         sets: list[str] | None = None, accuracy: float | None = None) -> dict:
    return {"version": "v7", "half": half, "federation": fed, "method": method, "k_true": k,
            "k_found": found, "ari": ari, "sets": sets or [], "error": None,
            "accuracy": accuracy}


def test_families_drop_k_data_set_and_seed(misses) -> None:
    assert misses.family("rot4_nested_digits_15") == "rot_nested"
    assert misses.family("rot5_half_fmnist_18") == "rot_half"
    assert misses.family("pair_group_mnist_15") == "pair_group"
    assert misses.family("linreg3_synth_20") == "linreg"
    assert misses.family("dir4_mnist_200") == "dir"
    assert misses.family("perm2_mnist_lenet") == "perm"
    assert misses.family("rot2_digits") == "rot"


def test_counts_by_family_and_the_list_of_misses(misses) -> None:
    rows = [
        # rotation, 4 groups: CFL 3 of 4; IFCA given K reaches ARI 1, FL+HC finds K
        _row("rot4_mnist_9", "cfl", 4, 3, 0.7), _row("rot4_mnist_9", "ifca_k", 4, 4, 1.0),
        _row("rot4_mnist_9", "flhc", 4, 4, 1.0),
        _row("rot4_mnist_9", "fedavg", 4, 1, 0.0, accuracy=0.1964),
        # rotation, 2 groups: found
        _row("rot2_fmnist_9", "cfl", 2, 2, 1.0), _row("rot2_fmnist_9", "ifca_k", 2, 2, 0.98),
        # n-class: 5 of 3, nobody reaches it given K, no automatic method finds it
        _row("nclass3_mnist_9", "cfl", 3, 5, 0.5), _row("nclass3_mnist_9", "fesem_k", 3, 3, 0.6),
        # iid: not a federation with structure; a run with --set: left out
        _row("iid_mnist_9", "cfl", 1, 1, 1.0), _row("rot4_mnist_9", "cfl", 4, 4, 1.0,
                                                    sets=["cfl:x=1"]),
    ]
    table, listed = misses.tabulate(rows, "cfl")
    by = {line.split(" | ")[0].lstrip("| "): line for line in table[2:]}
    assert set(by) == {"nclass", "rot", "**all**"}
    # federations | found | too few | too many | given K reaches | missed though | automatic
    assert by["rot"] == "| rot | 2 | 1 | 1 | 0 | 1 | 1 | 2 |"  # ARI 0.98 is below 0.99
    assert by["nclass"] == "| nclass | 1 | 0 | 0 | 1 | 0 | 0 | 0 |"
    assert by["**all**"] == "| **all** | 3 | 1 | 1 | 1 | 1 | 1 | 2 |"
    assert listed[2:] == [
        "| nclass3_mnist_9 | validation9 | 3 | 5 | 0.50 | 0.60 | – | – |",
        "| rot4_mnist_9 | validation9 | 4 | 3 | 0.70 | 1.00 | flhc | 19.6 % |",
    ]


def test_refusals_after_the_last_split_counted_by_hand(misses, tmp_path: Path) -> None:
    import json

    rounds = [  # K by round and what the history says was refused
        (1, ["patience 1/3 (root)"]), (1, ["patience 2/3"]), (2, []),
        (2, ["side below min_side", "cut not beyond shuffled cosines (p = 0.2)"]),
        (2, ["side below min_side", "patience 1/3"]), (2, ["side below min_side"])]
    history = tmp_path / "history.jsonl"
    history.write_text("".join(json.dumps({"extras": {"n_clusters": k, "refused": why}}) + "\n"
                               for k, why in rounds))
    # the last split in round 3; after it 3 × min_side, 1 × shuffle, 1 × patience of 5
    assert misses.refusals(history) == ("3 | side below min_side 60 %, cut not beyond "
                                        "shuffled cosines 20 %, patience 20 %")
    history.write_text("".join(json.dumps({"extras": {"n_clusters": 1, "refused": why}}) + "\n"
                               for _, why in rounds))  # never split: every round counts
    assert misses.refusals(history) == ("– | patience 43 %, side below min_side 43 %, cut not "
                                        "beyond shuffled cosines 14 %")  # 3, 3, 1 of 7
