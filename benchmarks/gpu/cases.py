"""Issue 37's GPU cases (a)–(e): seconds per round of our engine and of the per-client loop on
the same device, GPU memory, and the 2-thread CPU engine for (a) and (b), in one process.

A round is FedAvg's whole round through the method's own driver (`Algorithm.run_round`: the
sampled clients' training request, the robustness layer's checks, the server's weighted mean
on the device, the new model back to the CPU) on a synthetic federation with the real shapes
(pixels k/255 and random labels: the timing does not depend on what the pixels show):

  (a) mlp       MLP 784-200-10, 100 clients x 600 samples of 1x28x28
  (b) cnn       the CIFAR-10-shaped LeNet CNN (`model.name = "lenet"` on 3x32x32: conv5-6,
                pool, conv5-16, pool, 120, 84, 10), 100 clients x 500 samples
  (c) resnet18  ResNet-18 with GroupNorm (`model.name = "resnet18"`), 20 clients x 500
                samples of 3x32x32 (the generic torch.func kernel)
  (d) ifca-losses  IFCA's K=4 losses: one LossRequest of 4 MLP models over 1,000 clients x
                600 samples (what each IFCA round asks before training)
  (e) fedavg-1k / fedavg-10k  FedAvg rounds of the MLP at 1,000 and 10,000 clients x 60
                samples

Server steps on the device (not among the issue's cases; run by name, `--only`): whole rounds
of methods whose update runs where the replies are, timed like the others:

  (f) fesem-1k  FeSEM, K = 4, MLP, 1,000 clients x 60 samples: training from the centers, then
                Lloyd's k-means on the 1,000 models (on the GPU: distances and centers there)
  (g) cflgp-200 CFL-GP, K = 4, a clustering update every round (period 1), MLP, 200 clients
                x 60 samples: gradients at the K models, the model step and the blocks' Gram
                matrices on the GPU, the [200, 4, 159,010] profile in host memory

Local training: SGD, lr 0.05, batch 50, one epoch. Our engine: the `simulation` backend with
`chunk_size = "auto"` (as many clients at once as the free memory holds; the LeNet's
convolutions as unfolded products on CUDA in fp32 and tf32, grouped under bf16-mixed;
`--kernel cnn-grouped` or `cnn-im2col` forces one); the loop: the
`sequential` backend on the same device. Seconds per round: the median of `--rounds` rounds
after one warm-up round (CUDA kernel loading, caches); the loop (much slower) is timed on
`--loop-rounds` rounds after its warm-up.

    PYTHONPATH=src python benchmarks/gpu/cases.py --device cuda --out results.json
    PYTHONPATH=src python benchmarks/gpu/cases.py --device cpu --quick   # a check, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

MLP = {"name": "mlp", "hidden": [200]}
CNN = {"name": "lenet"}
RESNET = {"name": "resnet18"}
# name: (model, clients, samples per client, input shape, kind, loop baseline, CPU baseline)
CASES: dict[str, tuple[dict, int, int, tuple[int, ...], str, bool, bool]] = {
    "a-mlp": (MLP, 100, 600, (1, 28, 28), "fedavg", True, True),
    "b-cnn": (CNN, 100, 500, (3, 32, 32), "fedavg", True, True),
    "c-resnet18": (RESNET, 20, 500, (3, 32, 32), "fedavg", True, False),
    "d-ifca-losses": (MLP, 1000, 600, (1, 28, 28), "losses", True, False),
    "e-fedavg-1k": (MLP, 1000, 60, (1, 28, 28), "fedavg", True, False),
    "e-fedavg-10k": (MLP, 10000, 60, (1, 28, 28), "fedavg", False, False),
}
SERVER: dict[str, tuple[dict, int, int, tuple[int, ...], str, bool, bool]] = {
    # FeSEM's 2-thread CPU round takes 10.4 s here (k-means over 1,000 × 159,010): no CPU
    # baseline inside the GPU call's time
    "f-fesem-1k": (MLP, 1000, 60, (1, 28, 28), "fesem", True, False),
    "g-cflgp-200": (MLP, 200, 60, (1, 28, 28), "cfl_gp", True, True),
}
QUICK: dict[str, tuple[dict, int, int, tuple[int, ...], str, bool, bool]] = {
    "a-mlp": (MLP, 8, 60, (1, 28, 28), "fedavg", True, True),
    "b-cnn": (CNN, 6, 50, (3, 32, 32), "fedavg", True, True),
    "c-resnet18": ({"name": "resnet18", "width": 8}, 3, 20, (3, 32, 32), "fedavg", True, False),
    "d-ifca-losses": (MLP, 20, 60, (1, 28, 28), "losses", True, False),
    "e-fedavg-1k": (MLP, 50, 20, (1, 28, 28), "fedavg", True, False),
    "f-fesem-1k": (MLP, 40, 20, (1, 28, 28), "fesem", True, True),
    "g-cflgp-200": (MLP, 12, 20, (1, 28, 28), "cfl_gp", True, True),
}


def federation(clients: int, per: int, shape: tuple[int, ...], seed: int = 0) -> Any:
    """Synthetic data in the real shapes: pixels k/255 (as read from bytes), labels 0..9."""
    from clusterfl.data.federation import Federation

    g = torch.Generator().manual_seed(seed)
    n = clients * per
    x = torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8).float() / 255.0
    y = torch.randint(0, 10, (n,), generator=g)
    test = max(1, per // 10)
    tx = torch.randint(0, 256, (clients * test, *shape), generator=g,
                       dtype=torch.uint8).float() / 255.0
    ty = torch.randint(0, 10, (clients * test,), generator=g)
    return Federation(x, y, np.arange(clients + 1) * per, tx, ty, np.arange(clients + 1) * test,
                      clusters=None, n_classes=10)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_rounds(backend: Any, fed: Any, factory: Any, kind: str, rounds: int,
                profile: bool = False) -> dict[str, Any]:
    """One warm-up round, then `rounds` timed ones: median seconds, peak GPU MiB."""
    from clusterfl.algorithms.base import Context
    from clusterfl.algorithms.cfl_gp import CFLGP, CFLGPConfig
    from clusterfl.algorithms.fedavg import FedAvg, FedAvgConfig
    from clusterfl.algorithms.fesem import FeSEM, FeSEMConfig
    from clusterfl.protocol import LocalTraining, LossRequest

    device = backend.device
    training = LocalTraining(lr=0.05, batch_size=50, epochs=1)
    ctx = Context(backend, factory, training, fed.n_clients, fed.train_sizes,
                  np.random.default_rng(0), 0, rounds=rounds + 3)
    method: Any = FedAvg(FedAvgConfig())
    if kind == "fesem":
        method = FeSEM(FeSEMConfig(n_clusters=4, warmup_rounds=0))
    elif kind == "cfl_gp":
        method = CFLGP(CFLGPConfig(n_clusters=4, period=1))
    first = 0 if kind in ("fedavg", "losses") else 1  # (a)-(e) as they were measured
    method.setup(ctx)
    models = factory.init_many(4, seed=1)
    everyone = np.arange(fed.n_clients)

    def one(t: int) -> None:
        if kind == "losses":
            ctx.send(LossRequest(everyone, models, "train", None))
        else:
            method.run_round(ctx, first + t)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    one(0)
    times = []
    for t in range(1, rounds + 1):
        sync(device)
        start = time.perf_counter()
        one(t)
        sync(device)
        times.append(time.perf_counter() - start)
    out: dict[str, Any] = {"round_s": statistics.median(times), "rounds_s": times}
    if profile:  # one more round under torch's profiler: where the time goes
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as profiler

        kinds = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                          else [])
        with profiler(activities=kinds) as prof:
            one(rounds + 1)
            sync(device)
        for key in ("self_cpu_time_total",) + (
                ("cuda_time_total",) if device.type == "cuda" else ()):
            print(prof.key_averages().table(sort_by=key, row_limit=12), flush=True)
        import cProfile
        import pstats

        python = cProfile.Profile()  # the Python side (waits for the GPU show at syncs)
        python.enable()
        one(rounds + 2)
        sync(device)
        python.disable()
        pstats.Stats(python).sort_stats("cumulative").print_stats(25)
    if device.type == "cuda":
        out["peak_gpu_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    if kind == "fedavg":
        out["model_checksum"] = float(method.state.model.double().abs().sum())
        out["state_on"] = str(method.state.model.device)
    elif kind in ("fesem", "cfl_gp"):
        out["clusters"] = len(np.unique(method.assignment()))
        models = method.state.centers if kind == "fesem" else method.state.models
        out["state_on"] = str(models.device)
    return out


def measure(name: str, case: tuple, args: argparse.Namespace) -> dict[str, Any]:
    from clusterfl.backends.sequential import SequentialBackend
    from clusterfl.backends.simulation import SimulationBackend
    from clusterfl.models import ModelFactory, model_config

    model, clients, per, shape, kind, loop, cpu = case
    fed = federation(clients, per, shape)
    factory = ModelFactory(model_config(dict(model)), shape, 10)
    row: dict[str, Any] = {"case": name, "model": model["name"], "clients": clients,
                           "samples_per_client": per, "input": list(shape), "kind": kind,
                           "parameters": factory.size}
    kernel = args.kernel if args.kernel != "auto" and model["name"] == "lenet" else "auto"
    engine = SimulationBackend(fed, factory, device=args.device, precision=args.precision,
                               kernel=kernel)
    row["kernel"] = kernel
    row["engine"] = time_rounds(engine, fed, factory, kind, args.rounds,
                                name in args.profile.split(","))
    row["engine_clients_per_chunk"] = engine.engine._chunk_len(
        2, 50, torch.float32, engine.device)
    del engine
    if loop and not args.no_baselines and time.perf_counter() < args.deadline:
        seq = SequentialBackend(fed, factory, device=args.device, precision=args.precision)
        row["loop"] = time_rounds(seq, fed, factory, kind, args.loop_rounds)
        row["speedup_vs_loop"] = row["loop"]["round_s"] / row["engine"]["round_s"]
        del seq
    if (cpu and args.device != "cpu" and not args.no_baselines
            and time.perf_counter() < args.deadline):
        threads = torch.get_num_threads()
        torch.set_num_threads(args.cpu_threads)
        try:
            base = SimulationBackend(fed, factory, device="cpu")
            row["cpu"] = time_rounds(base, fed, factory, kind, args.cpu_rounds)
            row["cpu_threads"] = args.cpu_threads
            row["speedup_vs_cpu"] = row["cpu"]["round_s"] / row["engine"]["round_s"]
        finally:
            torch.set_num_threads(threads)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def show(row: dict[str, Any]) -> None:
    e = row["engine"]
    parts = [f"{row['case']:14} engine {e['round_s']:.3f} s/round"]
    if "peak_gpu_mib" in e:
        parts.append(f"peak {e['peak_gpu_mib']:.0f} MiB")
    parts.append(f"{row['engine_clients_per_chunk']} clients/chunk")
    if "loop" in row:
        parts.append(f"loop {row['loop']['round_s']:.3f} s ({row['speedup_vs_loop']:.1f}x)")
    if "cpu" in row:
        parts.append(f"cpu({row['cpu_threads']} threads) {row['cpu']['round_s']:.3f} s "
                     f"({row['speedup_vs_cpu']:.1f}x)")
    print(", ".join(parts), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="fp32", help="fp32, tf32 or bf16-mixed")
    p.add_argument("--out", default="", help="JSON results (default: print only)")
    p.add_argument("--quick", action="store_true", help="tiny federations (a check)")
    p.add_argument("--only", default="", help="comma-separated case names (the server-step "
                   "cases f-fesem-1k and g-cflgp-200 run only when named here)")
    p.add_argument("--profile", default="", help="comma-separated cases to profile one more "
                   "round of (torch.profiler tables on the screen)")
    p.add_argument("--kernel", default="auto", help="the LeNet case's engine kernel: auto, "
                   "cnn-grouped or cnn-im2col (auto: im2col on CUDA in fp32 and tf32, grouped on "
                   "the CPU and under bf16-mixed)")
    p.add_argument("--no-baselines", action="store_true", help="time our engine only")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--loop-rounds", type=int, default=1)
    p.add_argument("--cpu-rounds", type=int, default=1)
    p.add_argument("--cpu-threads", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=240,
                   help="after this many seconds only our engine is timed (default 240)")
    args = p.parse_args(argv)
    from clusterfl.engine.device import resolve_device

    device = resolve_device(args.device)
    cases = QUICK if args.quick else CASES
    if args.only:  # the cases and the server-step ones, by name
        every = QUICK if args.quick else {**CASES, **SERVER}
        cases = {k: v for k, v in every.items() if k in args.only.split(",")}
    started = time.perf_counter()
    args.deadline = started + args.budget_s
    info = {"device": args.device, "precision": args.precision, "kernel": args.kernel,
            "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                            else platform.machine()),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "command": " ".join(Path(a).name if Path(a).is_absolute() else a
                                for a in [sys.argv[0], *sys.argv[1:]]),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    print(json.dumps(info), flush=True)
    rows = []
    for name, case in cases.items():
        try:
            row = measure(name, case, args)
        except Exception as exc:  # the other cases still get measured
            import traceback

            traceback.print_exc()
            row = {"case": name, "error": f"{type(exc).__name__}: {exc}"}
            print(f"{name}: FAILED {row['error']}", flush=True)
        else:
            show(row)
        rows.append(row)
    info["total_s"] = time.perf_counter() - started
    if args.out:
        Path(args.out).write_text(json.dumps({"info": info, "rows": rows}, indent=1) + "\n")
    print(f"total {info['total_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
