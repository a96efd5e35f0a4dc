"""Run configuration: TOML in, validated settings out, every error naming its field.

Layout of a config file (every table optional; defaults shown by `clusterfl config show`):

    seed = 0
    rounds = 50
    [data]       source, data_dir
    [scenario]   name + that scenario's parameters (clusterfl.data.scenarios)
    [model]      name + that architecture's parameters (clusterfl.models)
    [train]      client optimisation: optimizer, lr, momentum, weight_decay, batch_size,
                 epochs | steps
    [algorithm]  name + that method's parameters (each method's own Config class)
    [backend]    name = "simulation" | "sequential" | "flower" + that backend's parameters
                 (each backend's own Config class, e.g. chunk_size; flower: timeout, ...)
    [output]     figures, progress
    [validation] [faults] [adversary] [privacy]   robustness (clusterfl.robust.config)
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from clusterfl.algorithms import AlgorithmConfig, algorithm_config
from clusterfl.backends import BACKENDS
from clusterfl.config_util import (
    MAX_SEED,
    Settings,
    flatten,
    is_number,
    is_whole,
    parse,
    pick,
    with_none_words,
)
from clusterfl.data.own import (
    GIVEN,
    OWN_SOURCES,
    POOLED_SOURCES,
    GivenParams,
    default_scenario,
    is_per_client,
    loader_function,
)
from clusterfl.data.scenarios import SCENARIOS, scenario_params
from clusterfl.data.sources import SOURCE_NAMES
from clusterfl.errors import ConfigError
from clusterfl.models import ModelConfig, model_config
from clusterfl.plugins import resolve
from clusterfl.protocol import LocalTraining
from clusterfl.robust.config import (
    AdversaryConfig,
    FaultsConfig,
    PrivacyConfig,
    ValidationConfig,
    check_robust,
)

if TYPE_CHECKING:  # the backends are imported when a config is loaded (`load_config`)
    from clusterfl.backends.base import BackendConfig

TOP_LEVEL = ("seed", "rounds", "eval_every", "eval_clients", "checkpoint_every", "data",
             "scenario", "model", "train", "algorithm", "backend", "output", "validation",
             "faults", "adversary", "privacy")
ROBUST_TABLES = ("validation", "faults", "adversary", "privacy")


class _Strict(Settings):
    # inf and nan are never meaningful settings (`lr = inf` would train to NaN)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class RunSettings(_Strict):
    seed: int = Field(0, ge=0, le=MAX_SEED)
    rounds: int = Field(50, ge=1, le=1_000_000)
    eval_every: int = Field(1, ge=1, description="evaluate every N rounds (and the last)")
    eval_clients: int | float | None = Field(
        None, description="clients evaluated in the rounds before the last: a number >= 1 or "
        "a fraction in (0, 1], drawn anew each evaluation (`Recorder.eval_sample`); all by "
        "default, and always all in the last round")
    checkpoint_every: int = Field(10, ge=0, description="0 = no checkpoints")

    @field_validator("eval_clients", mode="before")
    @classmethod
    def _eval_clients(cls, value: object) -> object:
        if value is None:
            return value
        if is_whole(value) and int(value) >= 1:  # type: ignore[call-overload]
            return int(value)  # type: ignore[call-overload]  # numpy's as Python's
        number = float(value) if is_number(value) else None  # type: ignore[arg-type]
        if number is not None and not is_whole(value) and 0.0 < number <= 1.0:
            return number
        raise ValueError("allowed: a whole number >= 1 or a fraction in (0, 1]")

    def eval_count(self, n: int) -> int | None:
        """How many of `n` clients a round before the last evaluates: `eval_clients` of them
        (a fraction: rounded, at least one); None for all of them (also when that is all)."""
        want = self.eval_clients
        if want is None:
            return None
        k = int(want) if isinstance(want, int) else max(1, round(float(want) * n))
        return None if k >= n else k

    def eval_clients_unused(self, n: int) -> str | None:
        """Why `eval_clients` changes nothing in a run of `n` training clients (a warning),
        or None: it asks for every client, or only the last round (always all) is
        evaluated."""
        want = self.eval_clients
        if want is None:
            return None
        if self.eval_count(n) is None:
            how = (f"is more than the {n} clients that train" if isinstance(want, int)
                   and want > n else f"is all of the {n} clients that train"
                   if isinstance(want, int) else
                   f"of the {n} clients that train is {n}, all of them")
            return f"eval_clients = {want} {how}: every client is evaluated (as without " \
                   "eval_clients)"
        if self.eval_every >= self.rounds:
            return (f"eval_clients = {want} does nothing here: the only round evaluated is "
                    f"the last (eval_every = {self.eval_every}, rounds = {self.rounds}), and "
                    "the last is always evaluated on every client")
        return None


class DataConfig(_Strict):
    """`[data]`: where the data comes from (`clusterfl.data.own` for sources of one's own).

    A loader function (`source = "pkg.mod:load"` or a `clusterfl.datasets` entry point) gets
    every other key of the table as a keyword argument; other sources refuse unknown keys.
    """

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    source: str = Field("digits", description="digits | mnist | fashion_mnist | cifar10 | "
                        "cifar100 | emnist | femnist | synthetic_regression | ag_news | "
                        "synthetic_topics | npz | shards | huggingface | python | an import "
                        "path 'pkg.mod:load' | a clusterfl.datasets entry point")
    path: str | None = Field(None, description="npz: the folder of per-client .npz files; "
                             "shards: the folder `clusterfl data shard` wrote; "
                             "huggingface: a save_to_disk folder or parquet/arrow files")
    input: str | None = Field(None, description="huggingface: the input column (image)")
    label: str | None = Field(None, description="huggingface: the label column (label)")
    train_split: str | None = Field(None, description="huggingface: the train split (train)")
    test_split: str | None = Field(None, description="huggingface: the test split (test)")
    test_fraction: float | None = Field(
        None, gt=0.0, lt=1.0, description="huggingface without a test split: the share held "
        "out for testing (0.2)")
    name: str | None = Field(None, description="python: the federation's name")
    labels: Literal["fine", "coarse"] | None = Field(
        None, description="cifar100: the 100 fine labels (fine, the default) or the 20 coarse "
        "ones (coarse)")
    split: Literal["byclass", "bymerge", "balanced", "letters", "digits", "mnist"] | None = (
        Field(None, description="emnist: the split (balanced, the default; byclass 62 "
              "classes, bymerge and balanced 47, letters 26, digits and mnist 10)"))
    data_dir: str | None = Field(
        None, description="the data folder; comes before $CLUSTERFL_DATA (default: "
        "$CLUSTERFL_DATA, else ~/.cache/clusterfl). Better left out of shared configs: "
        "`--data-dir` sets it for one command")
    standardize: bool = Field(
        False, description="scale inputs by the training split's mean and std per channel")
    verify: bool | None = Field(
        None, description="check dataset files against the catalog's checksums when first "
        "read (default: on; false: files of your own under the catalog's names)")

    def reader_options(self) -> dict[str, str]:
        """The options this table gives a built-in dataset's reader (`load_source`): cifar100's
        `labels`, emnist's `split`, where set."""
        return {k: v for k, v in (("labels", self.labels), ("split", self.split))
                if v is not None}


_LOCAL = LocalTraining()  # the one set of training defaults: the protocol's


class TrainConfig(_Strict):
    optimizer: Literal["sgd", "adam"] = _LOCAL.optimizer
    lr: float = Field(_LOCAL.lr, gt=0.0)
    momentum: float = Field(_LOCAL.momentum, ge=0.0, lt=1.0)
    weight_decay: float = Field(_LOCAL.weight_decay, ge=0.0)
    batch_size: int = Field(_LOCAL.batch_size, ge=1, description="samples per local step; "
                            "a larger batch than a client has holds all of its samples")
    epochs: int = Field(_LOCAL.epochs, ge=0)
    steps: int = Field(_LOCAL.steps, ge=0, description="> 0: local steps instead of epochs "
                       "(which then stays 1 or 0)")

    @model_validator(mode="after")
    def _some_work(self) -> TrainConfig:
        if self.epochs == 0 and self.steps == 0:
            raise ValueError("set epochs >= 1 or steps >= 1 (both are 0)")
        if self.steps > 0 and self.epochs > 1 and "epochs" in self.model_fields_set:
            raise ConfigError("train.epochs", f"{self.epochs} would be ignored: steps = "
                              f"{self.steps} replaces epochs; set one of the two")
        if self.optimizer == "adam" and self.momentum > 0:
            raise ConfigError("train.momentum", f"{self.momentum:g} would be ignored: adam "
                              "uses its own betas, not momentum; set momentum = 0 or "
                              "optimizer = \"sgd\"")
        return self

    def local_training(self) -> LocalTraining:
        return LocalTraining(
            optimizer=self.optimizer, lr=self.lr, momentum=self.momentum,
            weight_decay=self.weight_decay, batch_size=self.batch_size,
            epochs=self.epochs, steps=self.steps,
        )


class OutputConfig(_Strict):
    figures: bool = True
    progress: Literal["auto", "on", "off"] = Field(
        "auto", description="the progress bar: auto (on a terminal), on or off (true and "
        "false read as on and off)")

    @field_validator("progress", mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        return ("on" if value else "off") if isinstance(value, bool) else value
    tensorboard: bool = Field(False, description="TensorBoard events in RUN_DIR/tensorboard: "
                              "per-round scalars and the final figures")
    callbacks: list[str] = Field(
        default_factory=list, description="trackers: import paths 'pkg.mod:Tracker' of "
        "classes called without arguments (clusterfl.tracking)")


@dataclass
class Config:
    """A fully validated run configuration."""

    run: RunSettings
    data: DataConfig
    scenario: BaseModel
    scenario_name: str
    model: ModelConfig
    train: TrainConfig
    algorithm: AlgorithmConfig
    backend: BackendConfig  # the chosen backend's own Config class
    output: OutputConfig
    validation: ValidationConfig = field(default_factory=lambda: ValidationConfig())
    faults: FaultsConfig = field(default_factory=lambda: FaultsConfig())
    adversary: AdversaryConfig = field(default_factory=lambda: AdversaryConfig())
    privacy: PrivacyConfig = field(default_factory=lambda: PrivacyConfig())

    def to_dict(self) -> dict[str, Any]:
        """The config as TOML writes it: Nones left out, but a field whose default is not
        None written "none" when it is (`config_util.with_none_words`), so it loads again."""
        out: dict[str, Any] = _dump(self.run)
        out["data"] = _dump(self.data)
        out["scenario"] = {"name": self.scenario_name, **_dump(self.scenario)}
        out["model"] = _dump(self.model)
        out["train"] = _dump(self.train)
        out["algorithm"] = _dump(self.algorithm)
        out["backend"] = _dump(self.backend)
        out["output"] = _dump(self.output)
        for name in ROBUST_TABLES:  # robustness tables only when they change something
            table = getattr(self, name)
            if table != type(table)():
                out[name] = _dump(table)
        return _tomlable(out)

    def unwritten(self) -> list[tuple[str, Any]]:
        """The settings `to_dict` leaves out, as (dotted key, value): those at None (TOML has
        no None) and the defaults a written config omits (the backend's device settings, the
        robustness tables that change nothing). `config show` prints them as comments."""
        written = flatten(self.to_dict())
        tables: list[tuple[str, BaseModel]] = [
            ("", self.run), ("data.", self.data), ("scenario.", self.scenario),
            ("model.", self.model), ("train.", self.train), ("algorithm.", self.algorithm),
            ("backend.", self.backend), ("output.", self.output),
            *((f"{n}.", getattr(self, n)) for n in ROBUST_TABLES)]
        return [(prefix + name, getattr(table, name)) for prefix, table in tables
                for name in type(table).model_fields
                if prefix + name not in written and not any(
                    k.startswith(f"{prefix}{name}.") for k in written)]

    def with_algorithm(self, raw: dict[str, Any]) -> Config:
        """A copy with another `[algorithm]` table (used by `compare`)."""
        return load_config({**self.to_dict(), "algorithm": raw})


def _dump(table: BaseModel) -> dict[str, Any]:
    """A table's `model_dump` with "none" for the Nones TOML must still say
    (`with_none_words`); `_tomlable` drops the others."""
    return with_none_words(table, table.model_dump())


def _tomlable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _tomlable(x) for k, x in v.items() if x is not None}
    if isinstance(v, list | tuple):
        return [_tomlable(x) for x in v]
    return v


def load_config(raw: dict[str, Any]) -> Config:
    """Validate a config dict; raises ConfigError naming the first bad field."""
    for table, kind, command in (("sweep", "a sweep file", "clusterfl sweep FILE"),
                                 ("suite", "a benchmark suite file",
                                  "clusterfl bench --suite ITS_FOLDER")):
        if isinstance(raw.get(table), dict):  # its runs' config is its [config] table
            raise ConfigError("", f"this is {kind} (a [{table}] table), not a run config: run "
                                  f"it with `{command}`")
    for key in raw:
        if key not in TOP_LEVEL:
            allowed = ", ".join(TOP_LEVEL)
            raise ConfigError(key, f"unknown field; allowed top-level fields: {allowed}")
    run = parse(RunSettings, {k: raw[k] for k in raw if k in RunSettings.model_fields}, "")
    data = parse(DataConfig, raw.get("data"), "data")
    _check_data(data)
    scen_raw = dict(_table(raw, "scenario"))
    scen_name = scen_raw.pop("name", default_scenario(data.source))
    scenario = _scenario(data, scen_name, scen_raw)
    model = model_config(_table(raw, "model"))
    train = parse(TrainConfig, raw.get("train"), "train")
    algo_raw = dict(_table(raw, "algorithm"))
    algo_raw.setdefault("name", "fedavg")
    algorithm = algorithm_config(algo_raw, "algorithm")
    backend_raw = raw.get("backend")
    if backend_raw is not None and not isinstance(backend_raw, dict):
        raise ConfigError("backend", "must be a table of settings, got "
                                     f"{type(backend_raw).__name__}")
    backend_raw = {"name": "simulation", **(backend_raw or {})}
    backend_cls = pick(BACKENDS, backend_raw["name"], "backend.name")
    backend = parse(backend_cls.Config, backend_raw, "backend")
    output = parse(OutputConfig, raw.get("output"), "output")
    robust = (parse(ValidationConfig, raw.get("validation"), "validation"),
              parse(FaultsConfig, raw.get("faults"), "faults"),
              parse(AdversaryConfig, raw.get("adversary"), "adversary"),
              parse(PrivacyConfig, raw.get("privacy"), "privacy"))
    check_robust(run.rounds, *robust)
    return Config(run, data, scenario, str(scen_name), model, train, algorithm, backend, output,
                  *robust)


_HF_KEYS = ("input", "label", "train_split", "test_split", "test_fraction")


def data_table(raw: dict[str, Any]) -> dict[str, Any]:
    """A `[data]` table as a resolved config writes it (defaults filled in, None left out)."""
    return _tomlable(_dump(parse(DataConfig, raw, "data")))


def _check_data(data: DataConfig) -> None:
    """Each source's own keys (ConfigError naming the first misplaced one)."""
    src = data.source
    if src in SOURCE_NAMES or src in OWN_SOURCES:
        # the built-in; says once when an installed package's entry point has its name
        resolve("dataset", src, [*SOURCE_NAMES, *OWN_SOURCES], "data.source")
        extra = sorted(data.model_extra or {})
        if extra:
            allowed = ", ".join(k for k in DataConfig.model_fields)
            raise ConfigError(f"data.{extra[0]}", f"unknown field; allowed fields here: "
                                                  f"{allowed} (a loader function named by "
                                                  "data.source takes any)")
        own_keys = {"npz": ("path",), "shards": ("path",), "huggingface": ("path", *_HF_KEYS),
                    "python": ("name",),
                    "cifar100": ("labels",), "emnist": ("split",)}
        for key in ("path", "name", *_HF_KEYS, "labels", "split"):
            if getattr(data, key) is not None and key not in own_keys.get(src, ()):
                users = [s for s, keys in own_keys.items() if key in keys]
                raise ConfigError(f"data.{key}", f"only for source {' / '.join(users)}, not "
                                                 f"{src!r}")
        if src in ("npz", "shards", "huggingface") and not data.path:
            raise ConfigError("data.path", f"required for source {src!r}")
        return
    loader_function(src)  # an import path or an entry point; ConfigError when unknown


def _scenario(data: DataConfig, name: Any, raw: dict[str, Any]) -> BaseModel:
    """The validated `[scenario]` of `data`: `given` for data split into clients already."""
    if name == GIVEN:
        if data.source in SOURCE_NAMES or data.source in POOLED_SOURCES:
            raise ConfigError("scenario.name", f"'given' keeps clients as they are given; "
                                               f"data.source {data.source!r} is one pool of "
                                               "samples: choose a scenario to split it ("
                                               f"{', '.join(sorted(SCENARIOS))})")
        return parse(GivenParams, raw, "scenario")
    pick({**SCENARIOS, GIVEN: None}, name, "scenario.name")
    if is_per_client(data.source):
        raise ConfigError("scenario.name", f"data.source {data.source!r} is split into clients "
                                           f"already: use scenario.name = 'given' (the "
                                           f"default for it), not {name!r}")
    return scenario_params(name, raw, "scenario")


def _table(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        raise ConfigError(key, f"must be a table of settings, got {type(value).__name__}")
    return value


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        hint = f" (a run's: {p / 'config.toml'})" if (p / "config.toml").is_file() else ""
        raise ConfigError("", f"{p} is a folder; give the config file, a .toml file{hint}")
    if not p.is_file():
        raise ConfigError("", f"config file not found: {p}")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8-sig"))  # a BOM (Windows editors)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"{p} is not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError("", f"{p} is not a UTF-8 text file") from None


def apply_overrides(raw: dict[str, Any],
                    overrides: list[str] | Mapping[str, Any]) -> dict[str, Any]:
    """Apply `key.sub=value` overrides (values are TOML literals, else plain strings), or a
    mapping of dotted keys to values (`{"train.lr": 0.05}`, the Python API's)."""
    out = copy.deepcopy(raw)
    pairs: list[tuple[str, Any]] = []
    if isinstance(overrides, Mapping):
        pairs = [(str(k), v) for k, v in overrides.items()]
    for item in [] if isinstance(overrides, Mapping) else overrides:
        pairs.append(parse_override(item))
    for key, value in pairs:
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError("--set", f"expected a key such as train.lr (no empty part "
                              f"between dots), got {key!r}")
        set_dotted(out, parts, value, ".".join(parts))
    return out


def parse_override(item: Any) -> tuple[str, Any]:
    """`key.sub=value` as (key, value): the value a TOML literal, else plain text."""
    if not isinstance(item, str) or "=" not in item:
        raise ConfigError("--set", f"expected key=value, got {item!r}")
    key, text = item.split("=", 1)
    try:
        return key, tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return key, _bare_number(text)


def _bare_number(text: str) -> Any:
    """A `--set` value that is no TOML literal: a number TOML does not write (`.5`, `5.`,
    `05`) as that number (the settings refuse numbers given as text), any other as text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def set_dotted(raw: dict[str, Any], parts: list[str], value: Any, where: str) -> None:
    """`raw[a][b][c] = value` for the key parts `[a, b, c]`, making the tables on the way;
    a part that holds a value, not a table, is a ConfigError naming `where`."""
    node = raw
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(where, f"{p!r} is a value, not a table")
        node = nxt
    node[parts[-1]] = value


def dump_toml(data: dict[str, Any]) -> str:
    return tomli_w.dumps(data)
