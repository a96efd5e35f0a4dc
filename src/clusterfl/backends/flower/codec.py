"""Generic wire format for protocol requests and replies (no Flower import here).

Any dataclass of `clusterfl.protocol` travels without special code: its fields may hold
numpy arrays, torch tensors, ints/floats/strings/bools/None, tuples, lists, dicts and nested
protocol dataclasses (`Predictor`, `LocalTraining`, ...). `encode` splits an object into

- a JSON *skeleton*: the tree of the object with every array replaced by a reference
  `{"__array__": key, "torch": bool}`, dataclasses by `{"__dc__": ClassName, "f": {...}}`,
  tuples by `{"__tuple__": [...]}`, dicts with non-string keys are not supported;
- a flat dict `key -> numpy array` (the payload).

`decode` rebuilds the object, looking classes up by name in the registry of protocol
dataclasses (every dataclass defined in `clusterfl.protocol`, found by inspection, so a
request type added there later works unchanged). `to_recorddict` / `from_recorddict` put the
two parts into a Flower `RecordDict` (one `ArrayRecord` "arrays", one `ConfigRecord`
"meta" holding the skeleton string); they import Flower lazily. On the wire all arrays of a
message travel as one packed byte array (`pack` / `unpack`, the layout beside the skeleton).

Per-client slicing (server → one node) and reply assembly (nodes → one reply) are not done
here: the backend uses `clusterfl.protocol.subset` and `clusterfl.protocol.join`, the one way
the package takes some clients of a message or puts replies together.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
from typing import Any

import numpy as np
import torch

import clusterfl.protocol as protocol
from clusterfl.errors import require

SKELETON_KEY = "skeleton"
LAYOUT_KEY = "layout"
PACKED = "packed"
ARRAYS = "arrays"
META = "meta"


def protocol_classes() -> dict[str, type]:
    """Every dataclass defined in `clusterfl.protocol` (its modules), by class name (read at
    call time)."""
    return {
        name: obj for name, obj in inspect.getmembers(protocol, inspect.isclass)
        if dataclasses.is_dataclass(obj)
        and obj.__module__.startswith(protocol.__name__ + ".")
    }


# ---------------------------------------------------------------------------- encode/decode
def encode(obj: Any) -> tuple[str, dict[str, np.ndarray]]:
    """`(skeleton JSON, arrays)` of a protocol object (see the module docstring)."""
    arrays: dict[str, np.ndarray] = {}
    tree = _encode(obj, arrays)
    return json.dumps(tree, allow_nan=True), arrays


def _encode(v: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(v, torch.Tensor):
        key = f"a{len(arrays)}"
        arrays[key] = v.detach().cpu().contiguous().numpy()
        return {"__array__": key, "torch": True}
    if isinstance(v, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = np.ascontiguousarray(v)
        return {"__array__": key, "torch": False}
    if isinstance(v, np.generic):
        return _encode(v.item(), arrays)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        name = type(v).__name__
        if protocol_classes().get(name) is not type(v):
            raise TypeError(f"{name} is not a dataclass of clusterfl.protocol")
        fields = {f.name: _encode(getattr(v, f.name), arrays) for f in dataclasses.fields(v)}
        return {"__dc__": name, "f": fields}
    if isinstance(v, tuple):
        return {"__tuple__": [_encode(x, arrays) for x in v]}
    if isinstance(v, list):
        return [_encode(x, arrays) for x in v]
    if isinstance(v, dict):
        if not all(isinstance(k, str) for k in v):
            raise TypeError("only dicts with string keys can be sent")
        return {"__dict__": {k: _encode(x, arrays) for k, x in v.items()}}
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return {"__float__": repr(v)} if not math.isfinite(v) else v
    raise TypeError(f"cannot send a value of type {type(v).__name__}")


def decode(skeleton: str, arrays: dict[str, np.ndarray]) -> Any:
    """Inverse of `encode`."""
    return _decode(json.loads(skeleton), arrays, protocol_classes())


def _decode(v: Any, arrays: dict[str, np.ndarray], classes: dict[str, type]) -> Any:
    if isinstance(v, list):
        return [_decode(x, arrays, classes) for x in v]
    if not isinstance(v, dict):
        return v
    if "__array__" in v:
        a = arrays[v["__array__"]]
        return torch.from_numpy(np.array(a, copy=True)) if v["torch"] else np.array(a, copy=True)
    if "__dc__" in v:
        name = v["__dc__"]
        if name not in classes:
            raise TypeError(f"unknown protocol type {name!r} (this clusterfl has: "
                            f"{', '.join(sorted(classes))})")
        return classes[name](**{k: _decode(x, arrays, classes) for k, x in v["f"].items()})
    if "__tuple__" in v:
        return tuple(_decode(x, arrays, classes) for x in v["__tuple__"])
    if "__dict__" in v:
        return {k: _decode(x, arrays, classes) for k, x in v["__dict__"].items()}
    if "__float__" in v:
        return float(v["__float__"])
    raise TypeError(f"malformed skeleton node: {sorted(v)}")


# ---------------------------------------------------------------------------- one blob
def pack(arrays: dict[str, np.ndarray]) -> tuple[str, dict[str, np.ndarray]]:
    """All arrays as ONE byte array `{PACKED: uint8[...]}` and the JSON layout (key, dtype,
    shape, offset) that `unpack` reads. Flower 1.41 stores and moves every `Array` of a
    message as objects of their own (one request per object and hop, retried with backoff
    when not there yet): a request with 15 arrays cost 15+ object transfers on each of the
    four hops of a round trip, one blob costs one (issue 26)."""
    layout, parts, offset = [], [], 0
    for k, a in arrays.items():
        a = np.asarray(a)
        a = a if a.flags.c_contiguous else a.copy()  # (ascontiguousarray makes 0-d 1-d)
        raw = a.reshape(-1).view(np.uint8) if a.size else np.zeros(0, np.uint8)
        layout.append([k, a.dtype.str, list(a.shape), offset, int(raw.size)])
        parts.append(raw)
        offset += int(raw.size)
    blob = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    return json.dumps(layout), {PACKED: blob}


def unpack(layout: str, packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inverse of `pack` (arrays that were not packed pass through)."""
    if PACKED not in packed:
        return packed
    blob = np.ascontiguousarray(packed[PACKED]).view(np.uint8).reshape(-1)
    out: dict[str, np.ndarray] = {}
    for k, dtype, shape, offset, size in json.loads(layout):
        out[k] = blob[offset: offset + size].view(np.dtype(dtype)).reshape(tuple(shape))
    return out


# ---------------------------------------------------------------------------- Flower records
def to_recorddict(obj: Any, extra: dict[str, Any] | None = None) -> Any:
    """A Flower `RecordDict` carrying `obj` (plus plain `extra` config values): the skeleton
    and the layout in a `ConfigRecord`, every array in one packed `Array` (`pack`)."""
    require("flower", "flwr.app")
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    skeleton, arrays = encode(obj)
    layout, packed = pack(arrays)
    rec = ArrayRecord()
    for k, a in packed.items():
        rec[k] = Array(a)
    meta: dict[str, Any] = {SKELETON_KEY: skeleton, LAYOUT_KEY: layout}
    meta.update(extra or {})
    return RecordDict({ARRAYS: rec, META: ConfigRecord(meta)})


def from_recorddict(content: Any) -> tuple[Any, dict[str, Any]]:
    """`(object, meta config values)` from a `RecordDict` made by `to_recorddict` (or by a
    node: `wire_reply`)."""
    meta = dict(content.config_records[META])
    rec = content.array_records.get(ARRAYS)
    arrays = {} if rec is None else {k: a.numpy() for k, a in rec.items()}
    arrays = unpack(str(meta.pop(LAYOUT_KEY, "[]")), arrays)
    return decode(str(meta.pop(SKELETON_KEY)), arrays), meta


def wire_request(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Any:
    """The protocol object of a message's `meta` and (packed) `arrays` (a node's side)."""
    return decode(str(meta[SKELETON_KEY]), unpack(str(meta.get(LAYOUT_KEY, "[]")), arrays))


def wire_reply(obj: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """`(meta, packed arrays)` of a reply, what `from_recorddict` reads (a node's side)."""
    skeleton, arrays = encode(obj)
    layout, packed = pack(arrays)
    return {SKELETON_KEY: skeleton, LAYOUT_KEY: layout}, packed
