"""One naming scheme for methods: the label in tables, figures and reports, and the run
folder name (`method_label`, `run_folder_name`).

Both read a method's validated config (a pydantic model with a `name`, and optionally the
class attributes `display`, the method's display name, and `locations`, options that only say
where files are): K whenever set, then every option that differs from its default.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from pydantic import BaseModel

#: the number of cluster models (or of ensemble models; FedEM's mixture components, "M"):
#: named "K" and shown whenever set
K_OPTIONS = {"n_clusters": "K", "n_models": "K", "n_components": "M"}
#: longest run folder name; a longer one is cut and ends in a hash of the whole name
MAX_FOLDER = 100


def method_options(config: BaseModel) -> list[tuple[str, Any]]:
    """The options that tell a run of a method from another: K (whenever set), then every
    option that differs from its default, in the order the Config declares them.

    Options that only locate files (`Config.locations`) are left out.
    """
    fields = type(config).model_fields
    out = [(k, getattr(config, k)) for k in K_OPTIONS
           if k in fields and getattr(config, k) is not None]
    for key, info in fields.items():
        if key == "name" or key in K_OPTIONS or key in _locations(config):
            continue
        value = getattr(config, key)
        if isinstance(value, BaseModel):  # a sub-table (CFL's [algorithm.auto]): its options
            out += method_options(value)
            continue
        if info.is_required() or value != info.get_default(call_default_factory=True):
            out.append((key, value))
    return out


def _locations(config: BaseModel) -> frozenset[str]:
    out: frozenset[str] = getattr(config, "locations", frozenset())
    return out


def _text(value: Any) -> str:
    """An option value as a user writes it in a spec (TOML-like, strings unquoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):  # 4.0 → "4", 0.2 → "0.2", 1e-05 → "1e-05"
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    return "none" if value is None else str(value)


def method_label(config: BaseModel) -> str:
    """The one name of a method in tables, figures and reports: its display name and the
    options of `method_options`, e.g. "IFCA (K=5, averaging=gradient)", "FedAvg
    (fraction=0.2)", "Local"."""
    display = str(getattr(type(config), "display", "") or getattr(config, "name", ""))
    options = ", ".join(f"{K_OPTIONS.get(k, k)}={_text(v)}" for k, v in method_options(config))
    return f"{display} ({options})" if options else display


def run_folder_name(config: BaseModel) -> str:
    """The one folder name of a method's run: the config name and the options of
    `method_options` as `key=value`, joined by `_`, e.g. "ifca_n_clusters=5_averaging=gradient".

    Only letters, digits, `-`, `_`, `=` and `.` appear (anything else in a value becomes `-`),
    so the name is safe in every file system, shell and markdown link. A name longer than
    `MAX_FOLDER` is cut and ends in 8 hex digits of a hash of the whole name.
    """
    options = [f"{k}={_safe(_text(v))}" for k, v in method_options(config)]
    # a method from outside the package is named by its import path: "pkg.mod:My" → "pkg.mod-My"
    parts = [_safe(str(getattr(config, "name", ""))), *options]
    return shortened("_".join(parts), MAX_FOLDER)


def shortened(name: str, limit: int) -> str:
    """`name` when it takes at most `limit` bytes (UTF-8, as a file system counts them), else
    its first characters and `-` with 8 hex digits of a hash of the whole name, in `limit`
    bytes: a folder name that stays readable and tells long names apart."""
    raw = name.encode()
    if len(raw) <= limit:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:8]
    return f"{raw[:limit - 9].decode(errors='ignore')}-{digest}"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "-", text).strip("-")


__all__ = ["method_label", "method_options", "run_folder_name", "shortened"]
