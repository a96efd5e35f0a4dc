"""Checkpoints of server state: one generic mechanism for every method.

A method keeps everything it needs to continue a run exactly in one dataclass (its `State`).
`snapshot` turns such a dataclass into plain containers — dicts, lists, tensors (cloned),
numpy arrays (copied), numbers, strings, None — and `restore` rebuilds the dataclass from
them, reading the field types (nested dataclasses, `list[...]`, `dict[..., ...]`, `X | None`)
from its annotations. Nothing method-specific is written by hand, and a checkpoint holds no
pickled class of ours, so code can move without breaking old checkpoints of the same layout.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

import numpy as np
import torch

T = TypeVar("T")


def snapshot(value: Any) -> Any:
    """A deep, plain copy of `value` (see the module docstring)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: snapshot(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(snapshot(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot checkpoint a value of type {type(value).__name__}")


def restore(cls: type[T], data: dict[str, Any]) -> T:
    """The `cls` dataclass rebuilt from `snapshot(...)` output (values copied)."""
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _restore(hints[f.name], data[f.name])
              for f in dataclasses.fields(cls)  # type: ignore[arg-type]  # cls: a dataclass
              if f.init and f.name in data}
    missing = [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]  # as above
               if f.init and f.name not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"checkpoint of {cls.__name__} lacks {missing}")
    return cls(**kwargs)


def _restore(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        for option in options:
            if _fits(option, value):
                return _restore(option, value)
        return _restore(options[0], value)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return [_restore(item, v) for v in value]
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_restore(args[0], v) for v in value)
        return tuple(_restore(a, v) for a, v in zip(args, value, strict=True)) if args \
            else tuple(value)
    if origin is dict:
        key, item = typing.get_args(hint) or (Any, Any)
        return {_restore(key, k): _restore(item, v) for k, v in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return restore(hint, value)
    if hint is torch.Tensor:
        return value.clone()
    if hint is np.ndarray:
        return np.array(value, copy=True)
    if hint in (int, float, bool, str):
        return hint(value)
    return snapshot(value)  # Any and other plain values


def _fits(hint: Any, value: Any) -> bool:
    origin = typing.get_origin(hint) or hint
    if isinstance(origin, type) and dataclasses.is_dataclass(origin):
        return isinstance(value, dict)
    if origin is float:
        return isinstance(value, int | float)
    return isinstance(origin, type) and isinstance(value, origin)


__all__ = ["restore", "snapshot"]
