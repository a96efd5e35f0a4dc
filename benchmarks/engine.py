"""Seconds per round: the per-client loop (sequential backend) against the vectorized engine.

Cases (synthetic random data of MNIST shape, built as a `Federation` directly):
  (a) MLP 784-200-10, 32 clients x 600 samples, 1 epoch, batch 32     — target >= 2.5x
  (b) LeNet, 16 clients x 200 samples, 1 epoch, batch 32              — target >= 1.5x
  (c) one gradient on a batch of 64 for each of 128 clients (CFL-GP)  — target >= 5x
  (d) losses of 5 MLPs on 200 clients' training data (IFCA), 200 each — target >= 3x

For each case: a warm-up call of each backend, then the median of a few repeats (the two
backends alternate, so both see the same machine load). Achieved GFLOP/s count the matrix
products and convolutions of the work (torch's FlopCounterMode on the reference module), shown
beside the machine's large fp32 matmul rate measured at the start, and the ceiling: the
speed-up of an engine that did the loop's FLOPs at that matmul rate. The table is printed and
written to benchmarks/engine_results.md with the date and the command.

Usage: python benchmarks/engine.py [--quick] [--repeats N] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from clusterfl.backends.sequential import SequentialBackend
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.data.federation import Federation
from clusterfl.engine.common import per_sample_loss
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import GradientRequest, LocalTraining, LossRequest, TrainRequest

SHAPE = (1, 28, 28)


@dataclass
class Case:
    """One benchmark case: two thunks doing the same request, and the work's FLOPs."""

    label: str
    target: float
    loop: Callable[[], object]
    engine: Callable[[], object]
    flops: float


@dataclass
class Result:
    label: str
    target: float
    loop_s: float
    engine_s: float
    flops: float

    @property
    def speedup(self) -> float:
        return self.loop_s / self.engine_s


def matmul_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Best rate of a large fp32 matrix product (the machine's practical ceiling)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def federation(n_clients: int, per_client: int, seed: int = 0) -> Federation:
    """Random MNIST-shaped data, `per_client` training samples per client."""
    g = torch.Generator().manual_seed(seed)
    n = n_clients * per_client
    x = torch.rand(n, *SHAPE, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    off = np.arange(n_clients + 1) * per_client
    test = np.arange(n_clients + 1) * 10
    k = n_clients * 10
    return Federation(x, y, off, x[:k].clone(), y[:k].clone(), test, None, 10, name="synthetic")


def factory(cfg: dict) -> ModelFactory:
    return ModelFactory(model_config(cfg), SHAPE, 10)


def step_flops(fac: ModelFactory, batch: int, backward: bool) -> float:
    """FLOPs of one forward (and backward) pass of the reference module on `batch` samples."""
    module = fac.build()
    x, y = torch.rand(batch, *SHAPE), torch.randint(0, 10, (batch,))
    with FlopCounterMode(display=False) as counter:
        loss = per_sample_loss(module(x), y, "classification").mean()
        if backward:
            loss.backward()
    return float(counter.get_total_flops())


def build_cases() -> list[Case]:
    mlp, lenet = factory({"name": "mlp", "hidden": [200]}), factory({"name": "lenet"})
    cases = []

    fed = federation(32, 600)
    req = TrainRequest(np.arange(32), mlp.init_many(1, 0), np.zeros(32, int),
                       LocalTraining(lr=0.05, batch_size=32, epochs=1), seed=0)
    seq, sim = SequentialBackend(fed, mlp), SimulationBackend(fed, mlp)
    cases.append(Case("(a) MLP 784-200-10 train, 32 clients x 600, batch 32", 2.5,
                      lambda: seq.train(req), lambda: sim.train(req),
                      step_flops(mlp, 32, True) / 32 * 32 * 600))

    fed_b = federation(16, 200)
    req_b = TrainRequest(np.arange(16), lenet.init_many(1, 0), np.zeros(16, int),
                         LocalTraining(lr=0.05, batch_size=32, epochs=1), seed=0)
    seq_b, sim_b = SequentialBackend(fed_b, lenet), SimulationBackend(fed_b, lenet)
    cases.append(Case("(b) LeNet train, 16 clients x 200, batch 32", 1.5,
                      lambda: seq_b.train(req_b), lambda: sim_b.train(req_b),
                      step_flops(lenet, 40, True) / 40 * 16 * 200))

    fed_c = federation(128, 100)
    req_c = GradientRequest(np.arange(128), mlp.init_many(1, 1), np.zeros(128, int), 64, seed=0)
    seq_c, sim_c = SequentialBackend(fed_c, mlp), SimulationBackend(fed_c, mlp)
    cases.append(Case("(c) MLP gradient, 128 clients, batch 64 (CFL-GP)", 5.0,
                      lambda: seq_c.gradient(req_c), lambda: sim_c.gradient(req_c),
                      step_flops(mlp, 64, True) * 128))

    fed_d = federation(200, 200)
    req_d = LossRequest(np.arange(200), mlp.init_many(5, 2))
    seq_d, sim_d = SequentialBackend(fed_d, mlp), SimulationBackend(fed_d, mlp)
    cases.append(Case("(d) MLP losses of 5 models, 200 clients x 200 (IFCA)", 3.0,
                      lambda: seq_d.losses(req_d), lambda: sim_d.losses(req_d),
                      step_flops(mlp, 200, False) * 5 * 200))
    return cases


def run(case: Case, repeats: int) -> Result:
    case.loop()
    case.engine()
    loop, engine = [], []
    for _ in range(repeats):
        loop.append(_timed(case.loop))
        engine.append(_timed(case.engine))
    return Result(case.label, case.target, statistics.median(loop), statistics.median(engine),
                  case.flops)


def table(results: list[Result], peak: float) -> str:
    lines = [
        "| case | loop s/round | engine s/round | speed-up | target | loop GFLOP/s "
        "| engine GFLOP/s | matmul GFLOP/s | ceiling |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ok = "ok" if r.speedup >= r.target else "MISSED"
        lines.append(
            f"| {r.label} | {r.loop_s:.3f} | {r.engine_s:.3f} | {r.speedup:.2f}x "
            f"| >= {r.target:g}x ({ok}) | {r.flops / r.loop_s / 1e9:.1f} "
            f"| {r.flops / r.engine_s / 1e9:.1f} | {peak:.0f} "
            f"| {r.loop_s * peak * 1e9 / r.flops:.1f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one repeat per case")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("engine_results.md"))
    args = ap.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    load0 = os.getloadavg()
    started = time.perf_counter()
    peak = matmul_gflops()
    print(f"fp32 matmul 2048^3: {peak:.0f} GFLOP/s, torch threads {torch.get_num_threads()}")
    results = []
    for case in build_cases():
        results.append(run(case, repeats))
        r = results[-1]
        print(f"{r.label}: loop {r.loop_s:.3f}s engine {r.engine_s:.3f}s -> {r.speedup:.2f}x",
              flush=True)
    peak = max(peak, matmul_gflops())
    text = table(results, peak)
    print()
    print(text)
    load1 = os.getloadavg()
    argv_used = sys.argv[1:] if argv is None else argv
    cmd = " ".join(["python", "benchmarks/engine.py", *argv_used])
    header = (
        "# Engine benchmark: per-client loop vs vectorized engine\n\n"
        f"- date: {dt.datetime.now().isoformat(timespec='seconds')}\n"
        f"- command: `{cmd}`\n"
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads\n"
        f"- repeats: median of {repeats} after one warm-up; whole run "
        f"{time.perf_counter() - started:.0f} s\n"
        f"- load average (1 min) at start / end: {load0[0]:.2f} / {load1[0]:.2f} "
        "(other processes on the machine slow both columns)\n"
        "- GFLOP/s: matrix-product and convolution FLOPs of the work (FlopCounterMode on the "
        "reference module) divided by the wall time; matmul = best 2048^3 fp32 product "
        "(start or end of the run)\n"
        "- ceiling: the speed-up of an engine that did the same FLOPs at the matmul rate "
        "(loop time / (FLOPs / matmul rate)); no engine doing the loop's arithmetic "
        "gets past it\n\n"
    )
    args.out.write_text(header + text + "\n")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
