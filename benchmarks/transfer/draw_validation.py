"""Draw a fresh validation half for the transfer grid (issue 36): one federation of each of the
grid's 14 kinds of structure, its settings drawn at random from the ranges below, appended to
`grid.toml` under a new half name. Written and committed before any run on it.

    python benchmarks/transfer/draw_validation.py --half validation2 [--seed S]

Without `--seed`, the seed of the draw comes from `secrets` (and is written into grid.toml with
the draw, so anyone can redraw the same federations). The ranges are the issue's: data sets
(digits, MNIST, Fashion-MNIST, synthetic regressions), rotation with 2-8 groups, label swap,
label permutation, cluster n-class, Dirichlet within clusters, no structure (all and a quarter
of the clients per round), groups 1:3, a group of two clients; 8-200 clients, 50-1,000
samples a client, MLP and LeNet, 30-60 rounds, all or half of the clients per round. The
kinds follow the pairs of the first draw (`pair` = the kind's number), so each half covers
every kind once. Federation seeds are drawn from 1000-9999 avoiding every seed grid.toml holds
already.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import secrets
import tomllib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GRID = HERE / "grid.toml"
IMAGES = ("mnist", "fashion_mnist")
SHORT = {"mnist": "mnist", "fashion_mnist": "fmnist", "digits": "digits"}


def images(r: random.Random, allow_digits: bool = True) -> tuple[str, str, dict[str, int]]:
    """A data set, its training settings (`[train.*]` of grid.toml) and the per-client sizes."""
    source = r.choice((*IMAGES, "digits") if allow_digits else IMAGES)
    if source == "digits":  # the built-in 8x8 digits: the demo's sizes and training
        return source, "digits", {}
    train = "lenet28" if r.random() < 0.25 else "mlp28"
    sizes = {"n_train_per_client": r.choice((100, 150, 200, 300)),
             "n_test_per_client": r.choice((50, 100))}
    return source, train, sizes


def rounds_for(r: random.Random, train: str) -> int:
    return 30 if train == "lenet28" else r.choice((40, 50, 60))


def kind(r: random.Random, number: int) -> tuple[str, dict[str, Any]]:
    """Federation `number` (1-14, the kinds of the first draw's pairs): its name and table."""
    part = 1.0
    if number in (1, 2, 3, 4, 5, 12, 13):  # rotations
        source, train, sizes = images(r)
        if number == 1:
            k, angles, per = 2, [0, 180], r.randint(5, 10)
        elif number == 2:
            k, angles, per = 4, [0, 90, 180, 270], r.randint(4, 8)
        elif number == 3:  # two pairs of close groups: a hierarchy
            a = r.choice((30, 45, 60))
            k, angles, per = 4, [0, a, 180, 180 + a], r.randint(5, 7)
        elif number == 4:
            k, per = 8, r.randint(4, 6)
            angles = "cflgp" if r.random() < 0.5 else [45 * i for i in range(8)]
        elif number == 5:  # half of the clients a round
            k, part, per = r.choice((5, 6)), 0.5, r.randint(5, 6)
            angles = [round(360 * i / k) for i in range(k)]
        elif number == 12:  # 1:3
            k, angles, per = 2, [0, 180], 0
            small = r.randint(4, 6)
            groups = [small, 3 * small]
        else:  # a group of two clients
            k = r.choice((2, 3))
            angles = [0, 180] if k == 2 else [0, 90, 180]
            big = r.randint(6, 12)
            groups = [big] * (k - 1) + [2]
            per = 0
        scenario: dict[str, Any] = {"name": "rotation", "angles": angles}
        if per:
            scenario["n_clients"] = k * per
        else:
            scenario["n_clients"] = sum(groups)
            scenario["clients_per_group"] = groups
        scenario.update(sizes)
        name = {1: "rot2", 2: "rot4", 3: "rot4_nested", 4: "rot8", 5: f"rot{k}_half",
                12: "unequal", 13: "pair_group"}[number]
    elif number in (6, 7):
        source, train, sizes = images(r)
        k = r.choice((2, 3, 4))
        scenario = {"name": "label_swap" if number == 6 else "label_permutation",
                    "n_clients": k * r.randint(5, 6), "n_clusters": k, **sizes}
        name = f"{'swap' if number == 6 else 'perm'}{k}"
    elif number == 8:
        source, train, _ = images(r, allow_digits=False)
        k = r.choice((3, 4, 5))
        scenario = {"name": "cluster_n_class", "n_clients": 10 * k, "n_clusters": k,
                    "n1": r.choice((3, 4)), "n2": r.choice((2, 3)),
                    "samples_per_client": r.choice((100, 200))}
        name = f"nclass{k}"
    elif number == 9:
        source, train, _ = images(r, allow_digits=False)
        k = r.choice((3, 4))
        scenario = {"name": "cluster_dirichlet", "n_clients": r.choice((60, 100, 200)),
                    "n_clusters": k, "alpha1": 0.1, "alpha2": r.choice((1.0, 10.0))}
        name = f"dir{k}"
    elif number in (10, 11):
        source, train, sizes = images(r, allow_digits=(number == 10))
        k = 1
        if number == 10:
            n = r.randint(8, 50)
        else:
            n, part = r.choice((100, 200)), 0.25
            sizes = {"n_train_per_client": r.choice((50, 100)), "n_test_per_client": 50}
        scenario = {"name": "iid", "n_clients": n, **sizes}
        name = "iid" if number == 10 else "iid_quarter"
    else:  # 14: CFL-GP's noisy linear regressions
        source, train = "synthetic_regression", "linear"
        k = r.choice((3, 4))
        scenario = {"name": "linear_regression", "n_clients": k * r.randint(4, 6),
                    "n_clusters": k, "delta_phi": r.choice((20.0, 30.0)),
                    "samples_per_client": r.choice((50, 100)), "test_samples_per_client": 100}
        name = f"linreg{k}"
    table = {"pair": number, "k": k, "source": source, "train": train,
             "rounds": rounds_for(r, train), "participation": part, "scenario": scenario}
    return f"{name}_{SHORT.get(source, 'synth')}", table


def toml_value(v: Any) -> str:
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    return repr(v)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--half", required=True, help="the new half's name, e.g. validation2")
    p.add_argument("--seed", type=int, help="the draw's seed (default: from secrets)")
    p.add_argument("--check", action="store_true",
                   help="print the draw without writing it (to check the ranges build)")
    args = p.parse_args()
    grid = tomllib.loads(GRID.read_text())
    if any(f["half"] == args.half for f in grid["federation"].values()):
        raise SystemExit(f"draw_validation.py: error: grid.toml has a half {args.half!r} "
                         "already; a new draw needs a new name")
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    r = random.Random(seed)
    used = {f["seed"] for f in grid["federation"].values()}
    lines = [f"\n# ------------------------------------------------------------------ "
             f"{args.half}: drawn {dt.date.today().isoformat()} by draw_validation.py "
             f"--half {args.half} --seed {seed}\n# (one federation of each kind; frozen "
             "before any run on it)\n"]
    for number in range(1, 15):
        name, table = kind(r, number)
        tail = args.half[len("validation"):]  # "" for the first half, "2" ... "10" ...
        name = f"{name}_{tail}" if tail else name
        while True:
            fseed = r.randint(1000, 9999)
            if fseed not in used:
                used.add(fseed)
                break
        lines.append(f"\n[federation.{name}]\nhalf = \"{args.half}\"\n"
                     f"pair = {table['pair']}\nk = {table['k']}\nseed = {fseed}\n"
                     f"source = \"{table['source']}\"\ntrain = \"{table['train']}\"\n"
                     f"rounds = {table['rounds']}\nparticipation = {table['participation']}\n"
                     f"scenario = {toml_value(table['scenario'])}\n")
        if name in grid["federation"]:
            raise SystemExit(f"draw_validation.py: error: {name} is in grid.toml already")
    text = "".join(lines)
    tomllib.loads(GRID.read_text() + text)  # the whole file still parses
    if args.check:
        print(text)
        return
    with GRID.open("a") as fh:
        fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
