"""Where the in-process backends compute: the `[backend] device` and `precision` settings.

The server keeps its state on the CPU; a backend on another device moves the federation's
data there once (`Federation.to`), each request's models when it arrives, and its replies back
(`on`, `to_cpu`). On the CPU every one of these moves is the identity, so CPU results do not
change. CUDA runs use a CUDA generator for dropout noise seeded as the CPU one (the same seed
draws other numbers there: CPU and CUDA runs agree up to rounding only without dropout).

Precision (`set_precision` for the process-wide CUDA flags, `compute_scope` around each
request's computation):
- "fp32" (the default): float32 matrix products (TF32 off), on every device;
- "tf32" (CUDA only; float32 on the CPU): TF32 tensor-core products and convolutions (about
  10 bits of mantissa in the inputs of each product, float32 accumulation);
- "bf16-mixed": the matrix products and convolutions of local training (forward and
  backward), of gradients, losses and evaluation run in bfloat16 (8 bits of mantissa:
  relative errors around 1e-2) under `torch.autocast`; parameters, optimizer state, the
  returned models and gradients, and the losses stay float32. Meant for CUDA (bf16 tensor
  cores). On the CPU torch runs bf16 autocast too: that is for checking the mixed code paths,
  not for speed, which depends on the CPU's bfloat16 support (one local epoch of 64 clients
  on the 2-core test machine: an MLP 784-200-10 1.5× slower than float32, LeNet 1.6×
  faster). A float64 computation ignores it (autocast leaves float64 tensors alone).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeVar, get_args

import torch

from clusterfl.errors import ConfigError

DEVICE_FIELD = "backend.device"
DEVICES = 'auto, cpu, cuda or cuda:N (N a GPU index)'
Precision = Literal["fp32", "tf32", "bf16-mixed"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
T = TypeVar("T")


def check_device_name(name: object) -> str:
    """`name` itself when it is one of the allowed spellings; ValueError otherwise."""
    if not isinstance(name, str) or re.fullmatch(r"auto|cpu|cuda(:\d+)?", name) is None:
        raise ValueError(f"allowed: {DEVICES}")
    return name


def resolve_device(name: str = "auto") -> torch.device:
    """The torch device for a `[backend] device` value ("auto": CUDA when torch sees a GPU).

    Raises ConfigError(`backend.device`) for an unknown name, for CUDA when torch has no
    usable GPU, and for a GPU index it does not have.
    """
    try:
        name = check_device_name(name)
    except ValueError as exc:
        raise ConfigError(DEVICE_FIELD, f"unknown value {name!r}; {exc}") from None
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = (f"built for CUDA {torch.version.cuda}" if torch.version.cuda
                     else "a CPU-only build")
            raise ConfigError(DEVICE_FIELD, f"{name!r} asked but torch finds no CUDA GPU "
                              f"(torch {torch.__version__}, {build}); use 'cpu' or 'auto'")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(DEVICE_FIELD, f"{name!r} asked but torch sees {count} GPU(s): "
                              f"cuda:0 to cuda:{count - 1}")
        if device.index is None:  # the tensors put there report their index
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def check_devices(configs: Iterable[Any]) -> None:
    """Before the runs of a sweep, comparison or bench computed on this machine start: the
    one-line ConfigError of `resolve_device` when a run config's `backend.device` asks for
    CUDA and torch finds no GPU here (each run failed with it in turn before, after the
    others' folders were made). Configs without a device (flower) pass; with a GPU present
    nothing is checked here (no CUDA context in the process that only dispatches the runs).
    """
    if torch.cuda.is_available():
        return
    names = {getattr(getattr(c, "backend", None), "device", None) for c in configs}
    for name in sorted(n for n in names if isinstance(n, str)):
        resolve_device(name)


def set_precision(device: torch.device, precision: str) -> None:
    """Apply `precision` to CUDA matrix products and convolutions (process-wide flags)."""
    if device.type != "cuda":
        return
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = False  # autotuning picks kernels run by run
    torch.backends.cudnn.deterministic = True


@contextmanager
def compute_scope(device: torch.device, precision: str) -> Iterator[None]:
    """The scope of one request's computation on `device` under `precision`.

    "bf16-mixed": `torch.autocast(device.type, torch.bfloat16)`, whose products and
    convolutions run in bfloat16 (the engine's kernels cast their results back to float32
    where they are stored or accumulated); "fp32" and "tf32": nothing (`set_precision` sets
    TF32). The autocast weight cache is off: a request updates parameters in place between
    forward passes (the reference's optimizer, `set_flat`), and a cached bfloat16 copy of a
    parameter would not see the update. Raises ValueError for an unknown `precision`.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; allowed: {', '.join(PRECISIONS)}")
    if precision != "bf16-mixed":
        yield
        return
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=False):
        yield


def low_precision(like: torch.Tensor) -> torch.dtype | None:
    """The dtype the products of a computation on float32 tensors like `like` run in under
    the current autocast ("bf16-mixed": bfloat16), or None when autocast is off on `like`'s
    device or `like` is not float32 (autocast leaves float64 alone). The stacked kernels take
    their mixed-precision path exactly when this is not None; otherwise they run unchanged.
    """
    kind = like.device.type
    if like.dtype != torch.float32 or not torch.is_autocast_enabled(kind):
        return None
    return torch.get_autocast_dtype(kind)


def on(value: T, device: torch.device) -> T:
    """`value` with every tensor field moved to `device` (a tensor, or a dataclass such as a
    `Predictor`, whose tensor fields move); the same object when nothing moves."""
    if isinstance(value, torch.Tensor):
        return value.to(device)  # type: ignore[return-value]  # T is a Tensor here
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        moved: dict[str, Any] = {
            f.name: getattr(value, f.name).to(device) for f in dataclasses.fields(value)
            if isinstance(getattr(value, f.name), torch.Tensor)
            and getattr(value, f.name).device != device
        }
        return dataclasses.replace(value, **moved) if moved else value
    return value


def generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on `device` seeded with `seed` (dropout noise of the stacked kernels)."""
    return torch.Generator(device=device).manual_seed(seed)


def fork_rng(device: torch.device) -> Any:
    """`torch.random.fork_rng` for the CPU and, on a GPU, that GPU's global generator."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.random.fork_rng(devices=[index], device_type="cuda")
    return torch.random.fork_rng(devices=[])
