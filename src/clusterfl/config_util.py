"""Turning pydantic validation errors into one clear `ConfigError` naming the field."""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError, ValidationInfo, field_validator

from clusterfl.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

MAX_SEED = 2**63 - 1
"""The largest seed: what a TOML integer and torch's generator hold."""


def flatten(table: Mapping[str, Any], prefix: str = "", field: str = "") -> dict[str, Any]:
    """A nested table as `dotted.key: value` (the form of `--set` and of a sweep's grid).
    With `field`, a key written twice (quoted `"train.lr"` beside a nested `train` table's
    `lr`) is a ConfigError naming it under `field`: otherwise the later one wins, unsaid."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        pairs = (flatten(value, f"{prefix}{key}.", field).items() if isinstance(value, Mapping)
                 else [(f"{prefix}{key}", value)])
        for dotted, leaf in pairs:
            if field and dotted in out:
                raise ConfigError(f"{field}.{dotted}", "given twice (as a dotted key and in a "
                                  "nested table); keep one")
            out[dotted] = leaf
    return out


def _holds(value: Any, kind: typing.Callable[[Any], bool]) -> bool:
    """Whether `value`, or an item of it (a list's, a list of lists'), is of `kind`."""
    if isinstance(value, list | tuple):
        return any(_holds(v, kind) for v in value)
    return kind(value)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_numeric_text(value: Any) -> bool:
    """Text that pydantic's lax mode would read as a number ("4", " 0.5", "1e3")."""
    if not isinstance(value, str):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


def _takes_bool(annotation: Any) -> bool:
    """Whether a field's type admits true/false anywhere (bool, a Literal of one, Any, a
    nested settings table, which checks its own fields)."""
    if annotation is bool or annotation is Any or annotation is object:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Literal:
        return any(isinstance(a, bool) for a in args)
    return any(_takes_bool(a) for a in args)


def _takes_text(annotation: Any) -> bool:
    """Whether a field's type admits free text (str, Any, a path, a nested settings table);
    a Literal's words are checked by pydantic itself."""
    if annotation is Any or annotation is object:
        return True
    if isinstance(annotation, type) and issubclass(annotation, str | BaseModel | PurePath):
        return True
    if typing.get_origin(annotation) is Literal:
        return False
    return any(_takes_text(a) for a in typing.get_args(annotation))


def _takes(annotation: Any, *kinds: type) -> bool:
    """Whether a field's type admits a value of one of `kinds` (also in a union or list)."""
    return annotation in kinds or any(_takes(a, *kinds) for a in typing.get_args(annotation))


class Settings(BaseModel):
    """Base of every settings table: `true`/`false` where a number (or list of numbers) is
    expected is refused (pydantic reads them as 1 and 0, so `rounds = true` ran one round),
    text where only a number is (pydantic reads "4" as 4: `n_clients = "4"` given in Python
    loaded; TOML and `--set` write numbers as numbers), and text where only `true`/`false` is
    (pydantic reads "yes", "on", "1" as true: `nesting = "yes"` ran with nesting on)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None:
            return value
        if isinstance(value, str) and value.strip().lower() == NONE_WORD and \
                info.field_name in none_words(cls):
            return None  # TOML has no None: "none" turns off what is on by default
        annotation = field.annotation
        list_of = "a list of numbers" if typing.get_origin(annotation) is list else "a number"
        if isinstance(value, str) and _takes(annotation, bool) and not _takes(annotation, str):
            raise ValueError("expected true or false, not text")
        if _holds(value, _is_bool) and not _takes_bool(annotation):
            words = [a for a in typing.get_args(annotation) if isinstance(a, str)]
            if typing.get_origin(annotation) is Literal and words:
                raise ValueError(f"expected one of {', '.join(map(repr, words))}, not "
                                 "true/false")
            text, number = _takes(annotation, str), _takes(annotation, int, float)
            kind = ("a number (or text)" if text and number else "text" if text else list_of)
            raise ValueError(f"expected {kind}, not true/false")
        if _holds(value, _is_numeric_text) and _takes(annotation, int, float) and \
                not _takes_text(annotation):
            raise ValueError(f"expected {list_of}, not text: write the number without quotes")
        return value


NONE_WORD = "none"
"""How a TOML file (and a run's `config.toml`) writes None for a field whose default is not
None: TOML has no None, and leaving the field out would bring its default back."""


def none_words(model: type[BaseModel]) -> frozenset[str]:
    """The fields of `model` that take None but default to something else: written as
    `NONE_WORD` when None (`with_none_words`), and read back from it."""
    return frozenset(name for name, f in model.model_fields.items()
                     if f.default is not None and f.default_factory is None
                     and not f.is_required() and _takes(f.annotation, type(None)))


def with_none_words(model: BaseModel, dumped: dict[str, Any]) -> dict[str, Any]:
    """`dumped` (a `model_dump` of `model`) with `NONE_WORD` for each field of `none_words`
    that is None, so that dropping the other Nones (TOML has none) keeps the setting."""
    words = none_words(type(model))
    return {k: NONE_WORD if v is None and k in words else v for k, v in dumped.items()}


def _describe(err: Mapping[str, Any], prefix: str) -> tuple[str, str]:
    field = prefix
    for part in err.get("loc", ()):  # a list's item as `hidden[1]`, as the TOML reads
        field += f"[{part}]" if isinstance(part, int) else f".{part}" if field else str(part)
    msg = err.get("msg", "invalid value")
    if err.get("type") == "value_error":  # our validators' own words, without pydantic's tag
        msg = str(msg).removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        msg = "unknown field"
    elif "input" in err and err.get("type") != "missing":
        msg = f"{msg} (got {err['input']!r})"
    return field, msg


def changed_fields(table: BaseModel, *names: str) -> list[str]:
    """Those of `names` (all of `table`'s fields when none is given) whose value in `table`
    differs from the field's default: the settings a user wrote that change something."""
    fields = type(table).model_fields
    return [n for n in (names or tuple(fields))
            if getattr(table, n) != fields[n].get_default(call_default_factory=True)]


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel]:
    """The (sub)model whose fields an error at `loc` + one more part is about: `auto.nope`
    of CFL's config is about `[algorithm.auto]`'s fields, not `[algorithm]`'s."""
    for part in loc:
        info = model.model_fields.get(str(part))
        sub = None if info is None else info.annotation
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            break
        model = sub
    return model


def validation_error(exc: ValidationError, prefix: str, model: type[BaseModel]) -> ConfigError:
    errors = exc.errors()
    field, msg = _describe(errors[0], prefix)
    if errors[0].get("type") == "extra_forbidden":
        allowed = ", ".join(sorted(_model_at(model, errors[0].get("loc", ())[:-1]).model_fields))
        msg = (f"unknown field; allowed fields here: {allowed}" if allowed else
               "unknown field; this choice takes no options")
    more = [": ".join(_describe(e, prefix)) for e in errors[1:]]
    if more:
        msg += "; also " + "; ".join(more)
    return ConfigError(field, msg)


def parse(model: type[M], raw: dict[str, Any] | None, prefix: str) -> M:
    """Validate `raw` into `model`, raising ConfigError('prefix.field', ...) on any problem."""
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(prefix, f"must be a table of settings, got {type(raw).__name__}")
    try:
        return model.model_validate(raw or {})
    except ValidationError as exc:
        raise validation_error(exc, prefix, model) from None


def pick(registry: dict[str, Any], name: Any, field: str) -> Any:
    """Look up `name` in a registry or fail naming the field and the allowed values."""
    if not isinstance(name, str) or name not in registry:
        allowed = ", ".join(sorted(registry))
        raise ConfigError(field, f"unknown value {name!r}; allowed: {allowed}")
    return registry[name]


def physical_memory_bytes() -> int | None:
    """The machine's physical memory (None where the system does not say): the bound of
    settings that would not fit (a model's one copy, FL+HC's clustering round)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None


def is_whole(value: Any) -> bool:
    """An integer (Python's or numpy's), not a bool (which Python counts as one)."""
    import numpy as np

    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or float (Python's or numpy's), not a bool."""
    import numpy as np

    return isinstance(value, int | float | np.integer | np.floating) and \
        not isinstance(value, bool)


def check_flag(name: str, value: Any, none: str = "") -> None:
    """`value` is True or False (or None, when `none` says what None means): a truthy text
    such as "no" would otherwise act as True. One line naming the argument otherwise."""
    if not isinstance(value, bool) and not (none and value is None):
        raise ConfigError(name, f"{value!r}: give True or False"
                          + (f" (or None: {none})" if none else ""))


def client_ids(values: Any, n: int, field: str, among: str = "the federation's",
               repeats: bool = False) -> Any:
    """`values` as distinct client ids in 0..n−1 (an int64 array), or one line naming
    `field`: not a list of whole numbers, out of range, or repeated (unless `repeats`)."""
    import numpy as np

    ids = np.asarray(values if values is not None else [])
    if values is None or ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iuf") or (
            ids.dtype.kind == "f" and not bool((np.isfinite(ids) & (ids == np.round(ids)))
                                               .all())):
        raise ConfigError(field, f"{values!r}: give a list of client ids, whole numbers in "
                          f"0..{n - 1} ({among} clients)")
    ids = ids.astype(np.int64)
    out = ids[(ids < 0) | (ids >= n)]
    if out.size:
        raise ConfigError(field, f"client {int(out[0])} does not exist; ids are 0..{n - 1} "
                          f"({among} {n} clients)")
    if not repeats and len(np.unique(ids)) != len(ids):
        seen, twice = set(), None
        for i in ids.tolist():
            if i in seen:
                twice = i
                break
            seen.add(i)
        raise ConfigError(field, f"client {twice} is named twice; give each client once")
    return ids
