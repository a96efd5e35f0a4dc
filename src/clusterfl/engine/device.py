"""Where the in-process backends compute: the `[backend] device` and `precision` settings.

The server keeps its state on the CPU; a backend on another device moves the federation's
data there once (`Federation.to`), each request's models when it arrives, and its replies back
(`on`, `to_cpu`). On the CPU every one of these moves is the identity, so CPU results do not
change. CUDA runs use a CUDA generator for dropout noise seeded as the CPU one (the same seed
draws other numbers there: CPU and CUDA runs agree up to rounding only without dropout).

Precision (CUDA only; on the CPU every choice computes in float32):
- "fp32": float32 matrix products (TF32 off);
- "tf32": TF32 tensor-core products and convolutions (about 10 bits of mantissa in the
  inputs of each product, float32 accumulation).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal, TypeVar

import torch

from clusterfl.errors import ConfigError

DEVICE_FIELD = "backend.device"
DEVICES = 'auto, cpu, cuda or cuda:N (N a GPU index)'
Precision = Literal["fp32", "tf32"]
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


def set_precision(device: torch.device, precision: str) -> None:
    """Apply `precision` to CUDA matrix products and convolutions (process-wide flags)."""
    if device.type != "cuda":
        return
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = False  # autotuning picks kernels run by run
    torch.backends.cudnn.deterministic = True


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
