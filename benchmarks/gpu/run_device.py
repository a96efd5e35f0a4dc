"""The device benchmark (issue 37): the same federations on the CPU and on a GPU, one script.

First a self-check on tiny random federations (MLP, LeNet, LeNet with GroupNorm, and the
generic `torch.func` kernel on LeNet): train / gradient / losses / evaluate requests answered
by the simulation and the sequential backend on the device against the simulation backend on
the CPU (largest absolute difference, float32), and the same device request twice (identical?).

Then, for each case (rotated MNIST, 4 angles; MLP 784-200-10 with 100 and 1,000 clients, LeNet with
100 clients; FedAvg, IFCA K=4, CFL) it runs the whole method with `clusterfl.experiment`:

- on `--device` (e.g. cuda) twice with the same seed: seconds per round, peak GPU memory
  (`torch.cuda.max_memory_allocated`), and whether the two runs are identical (determinism);
- on the CPU once (`--cpu-threads` torch threads, default 2 as the project's reference
  machine): seconds per round, hence the speed-up measured in this one run, and how close the
  final accuracy, clustering and models are to the device run's;
- for FedAvg on the 100-client cases, the per-client loop (`sequential` backend) on the same
  device: its seconds per round and the engine's speed-up over it.

Seconds per round: the median over rounds 2 … R−1 (round 1 holds one-off setup such as CUDA
kernel loading; every client is evaluated in round R only).

Usage (from the checkout root; MNIST's four .gz files copied into an ignored folder):

    PYTHONPATH=src python benchmarks/gpu/run_device.py --device cuda \\
        --data-dir benchmarks/gpu/data [--out benchmarks/gpu/results_cuda.json]
    PYTHONPATH=src python benchmarks/gpu/run_device.py --device cpu --quick --data-dir DIR

Needs torch, numpy, scipy, scikit-learn, rich, and clusterfl's pydantic (pydantic,
pydantic-core, annotated-types, typing-inspection, typing-extensions) and tomli-w: missing
ones are named in one line. Wheels of them in `--wheels` (default benchmarks/gpu/wheels, if
present) are unpacked into a temporary folder and used without installing anything.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS products

HERE = Path(__file__).resolve().parent
#: import name → distribution name of everything the runs import
NEEDS = {"torch": "torch", "numpy": "numpy", "scipy": "scipy", "sklearn": "scikit-learn",
         "rich": "rich", "pydantic": "pydantic", "pydantic_core": "pydantic-core",
         "annotated_types": "annotated-types", "typing_inspection": "typing-inspection",
         "typing_extensions": "typing-extensions", "tomli_w": "tomli-w"}

ANGLES = "ifca"  # 0, 90, 180, 270 degrees: four true clusters
MLP = {"name": "mlp", "hidden": [200]}
LENET = {"name": "lenet"}
FEDAVG = {"name": "fedavg"}
IFCA = {"name": "ifca", "n_clusters": 4}
CFL = {"name": "cfl"}
# name: (clients, train rows per client, test rows per client, model, methods, loop baseline)
CASES: dict[str, tuple[int, int, int, dict, list[dict], bool]] = {
    "mlp-100": (100, 600, 100, MLP, [FEDAVG, IFCA, CFL], True),
    "cnn-100": (100, 600, 100, LENET, [FEDAVG, IFCA], True),
    "mlp-1000": (1000, 60, 10, MLP, [FEDAVG, IFCA], False),
}
QUICK: dict[str, tuple[int, int, int, dict, list[dict], bool]] = {
    "mlp-20": (20, 40, 10, MLP, [FEDAVG, IFCA, CFL], True),
    "cnn-10": (10, 30, 10, LENET, [FEDAVG, IFCA], True),
}


def use_wheels(folder: Path) -> None:
    """Unpack every wheel in `folder` into a temporary folder (once) and import from there."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        return
    target = Path(tempfile.gettempdir()) / "clusterfl_gpu_wheels"
    for whl in wheels:
        mark = target / f".{whl.name}.done"
        if not mark.exists():
            with zipfile.ZipFile(whl) as z:
                z.extractall(target)
            mark.touch()
    sys.path.insert(0, str(target))


def check_needs() -> None:
    missing = [dist for mod, dist in NEEDS.items() if importlib.util.find_spec(mod) is None]
    if missing:
        sys.exit(f"run_device.py: missing {', '.join(missing)}: put their CPython "
                 f"{sys.version_info.major}.{sys.version_info.minor} manylinux wheels in "
                 f"{HERE / 'wheels'} (or pip install them)")
    if importlib.util.find_spec("clusterfl") is None:
        sys.exit("run_device.py: clusterfl not importable: run with PYTHONPATH=src from the "
                 "checkout root")


def config(case: tuple, method: dict, device: str, rounds: int, data_dir: str,
           backend: str = "simulation", chunk_size: int = 64) -> dict[str, Any]:
    clients, n_train, n_test, model, _, _ = case
    table: dict[str, Any] = {"name": backend, "device": device}
    if backend == "simulation":
        table["chunk_size"] = chunk_size
    return {
        "seed": 0, "rounds": rounds, "eval_every": rounds, "checkpoint_every": 0,
        "data": {"source": "mnist", "data_dir": data_dir},
        "scenario": {"name": "rotation", "n_clients": clients, "angles": ANGLES,
                     "layout": "split", "n_train_per_client": n_train,
                     "n_test_per_client": n_test},
        "model": dict(model),
        "train": {"lr": 0.05, "batch_size": 50, "epochs": 1},
        "algorithm": dict(method),
        "backend": table,
        "output": {"figures": False, "progress": "off"},
    }


def run_once(cfg: dict[str, Any], federation: Any) -> dict[str, Any]:
    """One run: per-round seconds, final metrics, final models, peak GPU memory."""
    import torch

    from clusterfl.config import load_config
    from clusterfl.experiment import Experiment

    cuda = cfg["backend"]["device"].startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as out:
        exp = Experiment(load_config(cfg), out, federation=federation)
        history = exp.run(progress=False)
        rows = [json.loads(line) for line in
                (Path(out) / "history.jsonl").read_text().splitlines() if line.strip()]
    walls = [r.wall_time for r in history.records]
    per_round = [b - a for a, b in zip([0.0, *walls[:-1]], walls)]
    middle = per_round[1:-1] or per_round[-1:]
    final = history.records[-1]
    metrics = final.metrics
    return {
        "federation": exp.full_federation,
        "round_s": statistics.median(middle),
        "per_round_s": per_round,
        "accuracy": None if metrics is None else metrics.accuracy,
        "ari": final.ari,
        "n_clusters": final.n_clusters,
        "assignment": final.assignment,
        "models": exp.algorithm.predictor().models.detach().cpu().double(),
        "history": [{k: v for k, v in r.items() if "wall" not in k and "time" not in k}
                    for r in rows],
        "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
    }


def self_check(device: str) -> list[dict[str, Any]]:
    """Device answers against CPU answers on tiny federations (see the module docstring)."""
    import numpy as np
    import torch

    from clusterfl.backends.sequential import SequentialBackend
    from clusterfl.backends.simulation import SimulationBackend
    from clusterfl.data.federation import Federation
    from clusterfl.models import ModelFactory, model_config
    from clusterfl.protocol import (
        EvaluateRequest,
        GradientRequest,
        LocalTraining,
        LossRequest,
        Predictor,
        TrainRequest,
    )

    sizes, shape = [13, 40, 5, 27, 9], (1, 12, 12)
    g = torch.Generator().manual_seed(0)

    def split(n: int) -> tuple:
        return (torch.rand(n, *shape, generator=g), torch.randint(0, 4, (n,), generator=g),
                np.concatenate([[0], np.cumsum([n // len(sizes)] * len(sizes))]))

    total = sum(sizes)
    xs, ys, _ = split(total)
    tx, ty, toff = split(5 * len(sizes))
    fed = Federation(xs, ys, np.concatenate([[0], np.cumsum(sizes)]), tx, ty, toff,
                     clusters=None, n_classes=4)
    models = {"mlp": ({"name": "mlp", "hidden": [32, 16]}, "auto"),
              "lenet": ({"name": "lenet", "channels": [4, 6], "hidden": [16]}, "auto"),
              "lenet_gn": ({"name": "lenet", "channels": [4, 6], "hidden": [16], "groups": 2},
                           "auto"),
              "generic": ({"name": "lenet", "channels": [4, 6], "hidden": [16]}, "generic")}
    n, rows = len(sizes), []
    which = np.arange(n) % 3
    for name, (cfg, kernel) in models.items():
        row: dict[str, Any] = {"model": name}
        try:
            fac = ModelFactory(model_config(cfg), shape, 4)
            start = fac.init_many(3, seed=1)
            tr = LocalTraining(lr=0.05, momentum=0.9, batch_size=8, epochs=2)
            reqs = {
                "train": (TrainRequest(np.arange(n), start, which, tr, seed=11), "params"),
                "gradient": (GradientRequest(np.arange(n), start, which, 8, seed=5), "grads"),
                "losses": (LossRequest(np.arange(n), start, "test", None), "loss"),
                "evaluate": (EvaluateRequest(np.arange(n), Predictor.single(start, which),
                                             "test"), "loss"),
            }
            cpu = SimulationBackend(fed, fac, 4, kernel=kernel)
            dev = SimulationBackend(fed, fac, 4, kernel=kernel, device=device)
            seq = SequentialBackend(fed, fac, device=device)
            for what, (req, field) in reqs.items():
                want = _values(getattr(cpu.execute(req), field))
                for label, backend in (("simulation", dev), ("sequential", seq)):
                    got = _values(getattr(backend.execute(req), field))
                    row[f"{what}_{label}_max_abs_diff"] = float((got - want).abs().max())
            again = [dev.execute(reqs["train"][0]).params for _ in range(2)]
            row["train_deterministic"] = bool(torch.equal(again[0], again[1]))
        except Exception as exc:
            import traceback

            traceback.print_exc()
            row["error"] = f"{type(exc).__name__}: {exc}"
        print("check", json.dumps(row), flush=True)
        rows.append(row)
    return rows


def _values(value: Any) -> Any:
    """A reply's field as a CPU tensor (a GPU backend leaves models and gradients there)."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    return torch.as_tensor(np.asarray(value))


def measure(name: str, case: tuple, args: argparse.Namespace, log) -> list[dict[str, Any]]:
    """Every method of one case; a method that fails is recorded with its error."""
    import traceback

    out: list[dict[str, Any]] = []
    federation = None
    for method in case[4]:
        label = method["name"] + (f" K={method['n_clusters']}" if "n_clusters" in method else "")
        if time.perf_counter() > args.deadline:
            print(f"{name} {label}: skipped (--budget-s spent)", flush=True)
            out.append({"case": name, "method": label, "skipped": "--budget-s spent"})
            continue
        try:
            row, federation = measure_one(name, case, method, label, federation, args)
        except Exception as exc:  # keep going: the other cases still get measured
            traceback.print_exc()
            row = {"case": name, "method": label, "error": f"{type(exc).__name__}: {exc}"}
            print(f"{name} {label}: FAILED {row['error']}", flush=True)
        else:
            log(row)
        out.append(row)
    return out


def measure_one(name: str, case: tuple, method: dict, label: str, federation: Any,
                args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    import torch

    default_threads = torch.get_num_threads()
    cfg = config(case, method, args.device, args.rounds, args.data_dir)
    first = run_once(cfg, federation)
    federation = first.pop("federation")
    second = run_once(cfg, federation)
    second.pop("federation")
    torch.set_num_threads(args.cpu_threads or default_threads)
    try:
        cpu = run_once(config(case, method, "cpu", args.rounds, args.data_dir), federation)
    finally:
        torch.set_num_threads(default_threads)
    cpu.pop("federation")
    diff = float((first["models"] - cpu["models"]).abs().max())
    row = {
        "case": name, "method": label, "clients": case[0], "device": args.device,
        "rounds": args.rounds,
        "device_round_s": first["round_s"], "device_round_s_again": second["round_s"],
        "cpu_round_s": cpu["round_s"], "cpu_threads": args.cpu_threads or default_threads,
        "speedup_vs_cpu": cpu["round_s"] / first["round_s"],
        "device_per_round_s": first["per_round_s"], "cpu_per_round_s": cpu["per_round_s"],
        "peak_gpu_mib": first["peak_gpu_mib"],
        "accuracy_device": first["accuracy"], "accuracy_cpu": cpu["accuracy"],
        "accuracy_abs_diff": (None if first["accuracy"] is None or cpu["accuracy"] is None
                              else abs(first["accuracy"] - cpu["accuracy"])),
        "ari_device": first["ari"], "ari_cpu": cpu["ari"],
        "same_assignment_as_cpu": first["assignment"] == cpu["assignment"],
        "models_max_abs_diff_vs_cpu": diff,
        "deterministic": (first["history"] == second["history"]
                          and torch.equal(first["models"], second["models"])),
    }
    if args.big_chunk and args.big_chunk != 64:  # the engine with more clients at once
        big = run_once(config(case, method, args.device, args.rounds, args.data_dir,
                              chunk_size=args.big_chunk), federation)
        row[f"device_round_s_chunk{args.big_chunk}"] = big["round_s"]
        row[f"same_as_chunk64_chunk{args.big_chunk}"] = big["history"] == first["history"]
    if case[5] and method is FEDAVG:
        loop = run_once(config(case, method, args.device, 3, args.data_dir, "sequential"),
                        federation)
        row["loop_round_s"] = loop["round_s"]
        row["speedup_vs_loop"] = loop["round_s"] / first["round_s"]
    return row, federation


def show(row: dict[str, Any]) -> None:
    loop = (f", per-client loop {row['loop_round_s']:.3f} s ({row['speedup_vs_loop']:.1f}x)"
            if "loop_round_s" in row else "")
    mem = "" if row["peak_gpu_mib"] is None else f", peak {row['peak_gpu_mib']:.0f} MiB"
    acc = row["accuracy_device"]
    print(f"{row['case']:9} {row['method']:9} {row['device']}: {row['device_round_s']:.3f} "
          f"s/round, cpu({row['cpu_threads']} threads) {row['cpu_round_s']:.3f} s/round = "
          f"{row['speedup_vs_cpu']:.1f}x{loop}{mem}; accuracy "
          f"{'-' if acc is None else f'{acc:.4f}'} (cpu diff "
          f"{row['accuracy_abs_diff']}), same clusters {row['same_assignment_as_cpu']}, "
          f"models max|diff| {row['models_max_abs_diff_vs_cpu']:.2e}, deterministic "
          f"{row['deterministic']}", flush=True)


def _portable(arg: str) -> str:
    """An argument as the results record it: an absolute path (a folder of one machine)
    by its file name only."""
    return Path(arg).name if Path(arg).is_absolute() else arg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--data-dir", default=str(HERE / "data"),
                   help="folder with mnist/*.gz (default benchmarks/gpu/data)")
    p.add_argument("--out", help="JSON results (default benchmarks/gpu/results_<device>.json)")
    p.add_argument("--quick", action="store_true", help="tiny federations (a check, seconds)")
    p.add_argument("--only", default="", help="comma-separated case names")
    p.add_argument("--rounds", type=int, default=4, help="rounds per run (default 4)")
    p.add_argument("--big-chunk", type=int, default=1024,
                   help="also time the device runs with this chunk_size (clients stacked at "
                   "once; default 1024; 0: not)")
    p.add_argument("--cpu-threads", type=int, default=2,
                   help="torch threads of the CPU baseline (default 2; 0: torch's default)")
    p.add_argument("--no-check", action="store_true", help="leave out the self-check")
    p.add_argument("--budget-s", type=float, default=300,
                   help="start no new method after this many seconds (default 300)")
    p.add_argument("--wheels", default=str(HERE / "wheels"),
                   help="folder of wheels to import from (default benchmarks/gpu/wheels)")
    args = p.parse_args(argv)
    use_wheels(Path(args.wheels))
    check_needs()
    import torch

    from clusterfl.engine.device import resolve_device
    from clusterfl.errors import ClusterFLError

    try:
        device = resolve_device(args.device)
    except ClusterFLError as exc:
        sys.exit(f"run_device.py: {exc}")
    mnist = Path(args.data_dir) / "mnist"
    if not mnist.is_dir() or len(list(mnist.glob("*.gz"))) < 4:
        sys.exit(f"run_device.py: MNIST's four .gz files are not in {mnist}: copy them there "
                 "(an ignored folder of the checkout) or give --data-dir")
    cases = QUICK if args.quick else CASES
    if args.only:
        cases = {k: v for k, v in cases.items() if k in args.only.split(",")}
    started = time.perf_counter()
    args.deadline = started + args.budget_s
    info = {
        "device": args.device,
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else platform.processor() or platform.machine()),
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "quick": args.quick, "rounds": args.rounds,
        "command": " ".join([Path(sys.argv[0]).name, *map(_portable, sys.argv[1:])]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    print(json.dumps(info), flush=True)
    checks = [] if args.no_check else self_check(args.device)
    rows: list[dict[str, Any]] = []
    for name, case in cases.items():
        rows += measure(name, case, args, show)
    info["total_s"] = time.perf_counter() - started
    out = Path(args.out or HERE / f"results_{args.device.replace(':', '')}"
               f"{'_quick' if args.quick else ''}.json")
    out.write_text(json.dumps({"info": info, "checks": checks, "rows": rows}, indent=1) + "\n")
    print(f"total {info['total_s']:.0f} s; results in {_portable(str(out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
