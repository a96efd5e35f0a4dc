"""Model architectures, their configuration, and flat-parameter utilities."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from pydantic import ConfigDict, Field, ValidationInfo, field_validator
from torch import nn

from clusterfl.config_util import Settings, parse, physical_memory_bytes, pick
from clusterfl.errors import ConfigError
from clusterfl.models.lstm import LSTMLanguageModel
from clusterfl.models.paper_nets import ValidCNN
from clusterfl.models.params import ParamLayout, get_flat, get_flat_grad, set_flat
from clusterfl.models.zoo import MLP, ConvAE, LeafCNN, LeNet, LinearRegression, ResNet18
from clusterfl.plugins import describe, resolve

__all__ = [
    "MLP", "ConvAE", "CustomModelConfig", "LSTMLanguageModel", "LeNet", "LeafCNN",
    "LinearRegression",
    "ModelConfig", "ModelFactory",
    "ParamLayout", "ResNet18", "ResNet18Config",
    "get_flat", "get_flat_grad", "model_config", "set_flat",
]


Width = Annotated[int, Field(ge=1)]
"""A layer's width or channel count: a zero or negative one would build an empty or no layer."""


class ModelConfig(Settings):
    """Settings of one architecture (`[model]`); each architecture adds its fields."""

    model_config = ConfigDict(extra="forbid")
    name: str


class CustomModelConfig(ModelConfig):
    """A model from outside the package: `name` is an import path (`"mypkg.nets:MyNet"`) or
    a `clusterfl.models` entry point naming an `nn.Module` class or a function returning one;
    every other key of the table is passed to it as a keyword argument (see `build_custom`)."""

    model_config = ConfigDict(extra="allow")


class MLPConfig(ModelConfig):
    name: Literal["mlp"] = "mlp"
    hidden: list[Width] = Field(default_factory=lambda: [200])
    dropout: float = Field(0.0, ge=0.0, lt=1.0)


class LeNetConfig(ModelConfig):
    name: Literal["lenet"] = "lenet"
    channels: tuple[Width, Width] = (6, 16)
    hidden: tuple[Width, ...] = Field(
        (120, 84), description="hidden widths of the fully-connected head; [] for one layer")
    groups: int = Field(0, ge=0, description="GroupNorm groups; 0 = no normalization")
    downsample: Literal["maxpool", "stride"] = Field(
        "maxpool", description='"maxpool": 2x2 pooling after each convolution (LeNet); '
        '"stride": stride-2 convolutions, no pooling')


class LeafCNNConfig(ModelConfig):
    name: Literal["leaf_cnn"] = "leaf_cnn"
    hidden: int = Field(2048, ge=1)
    groups: int = Field(0, ge=0)


class LinearConfig(ModelConfig):
    name: Literal["linear"] = "linear"
    bias: bool = True


class ConvAEConfig(ModelConfig):
    name: Literal["conv_ae"] = "conv_ae"
    latent: int = Field(128, ge=1)


class ResNet18Config(ModelConfig):
    """ResNet-18, CIFAR variant, with GroupNorm (`zoo.ResNet18`; CFL-GP App. F.7)."""

    name: Literal["resnet18"] = "resnet18"
    width: int = Field(64, ge=1, description="channels of the stem and the first stage (the "
                       "stages have width x 1, 2, 4, 8); 64 = ResNet-18")
    groups: int = Field(2, ge=1, description="GroupNorm groups, min(groups, channels) in each "
                        "layer (GroupNorm for federated ResNets: Hsieh et al. 2020)")

    @field_validator("groups")
    @classmethod
    def _groups_divide(cls, groups: int, info: ValidationInfo) -> int:
        width = info.data.get("width")  # absent when width itself is invalid
        if width is None:
            return groups
        channels = [width, 2 * width, 4 * width, 8 * width]
        if any(c % min(groups, c) for c in channels):
            raise ValueError(f"GroupNorm needs min(groups, channels) to divide the channels of "
                             f"every layer ({', '.join(map(str, channels))}); use a divisor "
                             f"of width = {width}")
        return groups


class CFLCNNConfig(ModelConfig):
    """CFL's CIFAR-10 / CFL-GP's EMNIST CNN (`paper_nets.ValidCNN`, the authors' code)."""

    name: Literal["cfl_cnn"] = "cfl_cnn"
    channels: tuple[Width, Width] = (6, 16)
    hidden: tuple[Width, ...] = Field((), description="hidden widths before the output layer")


class CAMCNNConfig(CFLCNNConfig):
    """CAM's CIFAR-10 CNN: LeNet-5 (`paper_nets.ValidCNN`; our choice, see there)."""

    name: Literal["cam_cnn"] = "cam_cnn"  # type: ignore[assignment]
    hidden: tuple[Width, ...] = Field((120, 84), description="hidden widths (LeNet-5)")


def _valid_cnn(c: CFLCNNConfig, shape: tuple[int, ...], out: int) -> nn.Module:
    return ValidCNN(shape, out, c.channels, c.hidden)


class LSTMConfig(ModelConfig):
    """The two-layer LSTM language model (`lstm.LSTMLanguageModel`; CFL Fig. 10, AG News)."""

    name: Literal["lstm"] = "lstm"
    embed: int = Field(128, ge=1, description="word embedding width")
    hidden: int = Field(256, ge=1, description="units of each LSTM layer")
    layers: int = Field(2, ge=1, description="stacked LSTM layers (the paper: 2)")
    cell: Literal["fused", "written"] = Field(
        "fused", description="fused: nn.LSTM, clients looped (fastest on a CPU); written: "
        "the cell equations written out, clients batched by vmap")


def _lstm(c: LSTMConfig, shape: tuple[int, ...], out: int) -> nn.Module:
    return LSTMLanguageModel(shape, out, c.embed, c.hidden, c.layers, c.cell)


def _mlp(c: MLPConfig, shape: tuple[int, ...], out: int) -> nn.Module:
    return MLP(shape, out, list(c.hidden), c.dropout)


def _lenet(c: LeNetConfig, shape: tuple[int, ...], out: int) -> nn.Module:
    return LeNet(shape, out, c.channels, c.hidden, c.groups, c.downsample)


def _leaf(c: LeafCNNConfig, shape: tuple[int, ...], out: int) -> nn.Module:
    return LeafCNN(shape, out, c.hidden, c.groups)


def _linear(c: LinearConfig, shape: tuple[int, ...], out: int) -> nn.Module:
    return LinearRegression(shape, out, c.bias)


def _conv_ae(c: ConvAEConfig, shape: tuple[int, ...], out: int) -> nn.Module:
    return ConvAE(shape, c.latent)


def _resnet18(c: ResNet18Config, shape: tuple[int, ...], out: int) -> nn.Module:
    return ResNet18(shape, out, c.groups, c.width)


MODELS: dict[str, tuple[type[ModelConfig], Callable[[Any, tuple[int, ...], int], nn.Module]]] = {
    "mlp": (MLPConfig, _mlp),
    "lenet": (LeNetConfig, _lenet),
    "leaf_cnn": (LeafCNNConfig, _leaf),
    "linear": (LinearConfig, _linear),
    "conv_ae": (ConvAEConfig, _conv_ae),
    "resnet18": (ResNet18Config, _resnet18),
    "cfl_cnn": (CFLCNNConfig, _valid_cnn),
    "cam_cnn": (CAMCNNConfig, _valid_cnn),
    "lstm": (LSTMConfig, _lstm),
}


def model_config(raw: dict[str, Any] | None, prefix: str = "model") -> ModelConfig:
    """Validate a `[model]` table (its `name` picks the architecture: a built-in, an import
    path or a `clusterfl.models` entry point, `clusterfl.plugins`)."""
    raw = dict(raw or {})
    name = raw.get("name", "mlp")
    if resolve("model", name, MODELS, f"{prefix}.name") is not None:
        config = parse(CustomModelConfig, raw, prefix)
        custom_maker(config, prefix)  # a clear error now, not when the run starts
        return config
    cls, _ = pick(MODELS, name, f"{prefix}.name")
    return parse(cls, raw, prefix)


def custom_maker(config: ModelConfig, prefix: str = "model") -> Callable[..., Any]:
    """The callable a custom `[model]` names (ConfigError when it is not callable)."""
    make = resolve("model", config.name, MODELS, f"{prefix}.name")
    if not callable(make):
        raise ConfigError(f"{prefix}.name", f"{config.name!r} is a {type(make).__name__}, not "
                                            "an nn.Module class or a function returning one")
    return make


def build_custom(config: ModelConfig, shape: tuple[int, ...], out: int) -> nn.Module:
    """Call the custom model's factory with the table's other keys as keyword arguments, plus
    `input_shape` (one sample's shape) and `n_outputs` (classes, or 1 for regression) when
    its signature has parameters of those names (or `**kwargs`)."""
    make = custom_maker(config)
    kwargs = {k: v for k, v in (config.model_extra or {}).items()}
    try:
        params = inspect.signature(make).parameters
    except (TypeError, ValueError):  # a builtin without a signature: pass the options only
        params = {}  # type: ignore[assignment]
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for key, value in (("input_shape", tuple(shape)), ("n_outputs", int(out))):
        if (key in params or var_kw) and key not in kwargs:
            kwargs[key] = value
    try:
        module = make(**kwargs)
    except Exception as exc:
        raise ConfigError("model", f"{describe(make)}({', '.join(kwargs)}) failed: "
                                   f"{type(exc).__name__}: {exc}") from None
    if not isinstance(module, nn.Module):
        raise ConfigError("model.name", f"{config.name!r} returned a {type(module).__name__}, "
                                        "not a torch nn.Module")
    return module


def check_custom(module: nn.Module, name: str, shape: tuple[int, ...], out: int) -> None:
    """A model of one's own must have trainable parameters and map a batch `[B, *shape]` to
    `[B, out]` (`[B]` also for one output): ConfigError (`model.name`) otherwise, before a
    run starts. The check runs the model once, in eval mode, on two zero samples."""
    if not any(p.requires_grad for p in module.parameters()):
        raise ConfigError("model.name", f"{name!r} has no trainable parameters; a federated "
                                        "model needs some (nn.Linear, nn.Conv2d, ...)")
    was_training = module.training
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            y = module.eval()(torch.zeros(2, *shape))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError("model.name", f"{name!r} failed on a batch of shape "
                          f"{[2, *shape]}: {type(exc).__name__}: {first}") from None
    finally:
        module.train(was_training)
    got = list(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
    ok = [[2, out]] + ([[2]] if out == 1 else [])
    if got not in ok:
        what = "classes" if out > 1 else "output (regression)"
        raise ConfigError("model.name", f"{name!r} maps a batch {[2, *shape]} to {got}; the "
                          f"federation needs [batch, {out}] ({out} {what}): use its "
                          "n_outputs argument for the last layer's width")
    if y.is_floating_point() and not bool(torch.isfinite(y).all()):
        try:  # zeros may be a poor input (x / |x|): ones as well before refusing
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                y = module.eval()(torch.ones(2, *shape))
        finally:
            module.train(was_training)
        if not bool(torch.isfinite(y).all()):
            raise ConfigError("model.name", f"{name!r} gives NaN or infinite outputs for a "
                              f"batch of zeros and one of ones {[2, *shape]} (with its "
                              "initial parameters): no update of it could be used; check its "
                              "forward")


def check_fits_in_memory(name: str, d: int) -> None:
    """Refuse a model whose one float32 copy is more than the machine's memory (a run holds
    several), before anything is allocated: `hidden = [100000, 100000]` asked torch for 40
    GB and ended in its allocator's traceback."""
    have, need = physical_memory_bytes(), 4 * d
    if have is not None and need > have:
        raise ConfigError("model", f"{name!r} with these settings has {d:,} parameters, "
                          f"{need / 2**30:,.1f} GiB as float32, more than this machine's "
                          f"{have / 2**30:,.1f} GiB of memory (a run holds several copies): "
                          "choose a smaller model (model.hidden, model.channels, ...)")


@dataclass
class ModelFactory:
    """Builds one architecture for one federation and creates seeded initial parameters."""

    config: ModelConfig
    input_shape: tuple[int, ...]
    n_outputs: int

    def __post_init__(self) -> None:
        if self.config.name in MODELS:  # counted first without memory (the meta device)
            with torch.device("meta"):
                probe = self.build()
            check_fits_in_memory(self.config.name, sum(p.numel() for p in probe.parameters()))
        module = self.build()
        if self.config.name not in MODELS:  # from outside the package: checked once, now
            check_custom(module, self.config.name, tuple(self.input_shape), self.n_outputs)
        self.layout = ParamLayout(module)
        self.module_class: type[nn.Module] = type(module)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def size(self) -> int:
        """d, the number of parameters."""
        return self.layout.size

    def build(self) -> nn.Module:
        if self.config.name not in MODELS:  # from outside the package (`CustomModelConfig`)
            return build_custom(self.config, tuple(self.input_shape), self.n_outputs)
        _, make = MODELS[self.config.name]
        try:
            return make(self.config, tuple(self.input_shape), self.n_outputs)
        except ValueError as exc:  # a built-in that cannot take this federation's inputs
            raise ConfigError("model.name", f"{self.config.name!r}: {exc}") from None

    def init(self, seed: int) -> torch.Tensor:
        """Flat initial parameters from PyTorch's default initialisation under `seed`."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return get_flat(self.build())

    def init_many(self, k: int, seed: int) -> torch.Tensor:
        """`[k, d]` independently initialised models (seeds seed, seed+1, ...)."""
        return torch.stack([self.init(seed + j) for j in range(k)])
