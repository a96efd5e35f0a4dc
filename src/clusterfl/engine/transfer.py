"""Moving whole server values between devices: states, requests, replies, extras.

On a GPU the in-process backends leave the large tensors of their replies (trained models,
gradients) on the device, and a method whose server step is written for it (`Algorithm.
device_update`) runs its `update` there: the state and the request go to the device, the new
state comes back to the CPU, where the server keeps it between steps (checkpoints stay
device-independent). `move` walks the containers such values are made of; everything that is
not a tensor (numpy arrays, numbers, strings) is kept as it is, and a value with nothing to
move is returned itself, not copied. A dataclass field declared with `metadata=STAYS` is never
moved: a per-client table kept in host memory (FeSEM's file-backed models, CFL-GP's lazily
zero profile: a step moves only the rows it touches), or a round's input that stays where the
reply left it until the round's next phase (FeSEM's k-means input).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch

T = TypeVar("T")
CPU = torch.device("cpu")
#: the metadata of a dataclass field that `move` leaves where it is (module doc)
STAYS: dict[str, bool] = {"stays": True}


def move(value: T, device: torch.device) -> T:
    """`value` with every tensor inside it (dataclass fields, frozen ones too, list, tuple and
    dict items, nested) on `device`; the same object where nothing moves."""
    out: Any = _move(value, device)
    return out  # the same type as `value`


def _move(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value if value.device == device else value.to(device)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {}
        for f in dataclasses.fields(value):
            if not f.init or f.metadata.get("stays"):
                continue
            old = getattr(value, f.name)
            new = _move(old, device)
            if new is not old:
                changed[f.name] = new
        return dataclasses.replace(value, **changed) if changed else value
    if isinstance(value, list | tuple):
        items = [_move(v, device) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        return type(value)(items) if isinstance(value, list) or type(value) is tuple \
            else type(value)(*items)  # a named tuple
    if isinstance(value, dict):
        moved = {k: _move(v, device) for k, v in value.items()}
        return value if all(moved[k] is value[k] for k in value) else moved
    return value


def device_of(value: Any) -> torch.device | None:
    """The device of the first tensor found off the CPU inside `value`; None when every tensor
    is on the CPU (or there is none)."""
    if isinstance(value, torch.Tensor):
        return value.device if value.device.type != "cpu" else None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items: Any = (getattr(value, f.name) for f in dataclasses.fields(value))
    elif isinstance(value, list | tuple):
        items = value
    elif isinstance(value, dict):
        items = value.values()
    else:
        return None
    for item in items:
        found = device_of(item)
        if found is not None:
            return found
    return None


def to_cpu(value: T) -> T:
    """`move(value, cpu)`."""
    return move(value, CPU)


__all__ = ["CPU", "STAYS", "device_of", "move", "to_cpu"]
