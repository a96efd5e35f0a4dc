"""Model architectures, their configuration, and flat-parameter utilities."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from clusterfl.config_util import parse, pick
from clusterfl.models.params import ParamLayout, get_flat, get_flat_grad, set_flat
from clusterfl.models.zoo import MLP, ConvAE, LeafCNN, LeNet, LinearRegression

__all__ = [
    "MLP", "ConvAE", "LeNet", "LeafCNN", "LinearRegression", "ModelConfig", "ModelFactory",
    "ParamLayout",
    "get_flat", "get_flat_grad", "model_config", "set_flat",
]


class ModelConfig(BaseModel):
    """Settings of one architecture (`[model]`); each architecture adds its fields."""

    model_config = ConfigDict(extra="forbid")
    name: str




class MLPConfig(ModelConfig):
    name: Literal["mlp"] = "mlp"
    hidden: list[int] = Field(default_factory=lambda: [200])
    dropout: float = Field(0.0, ge=0.0, lt=1.0)


class LeNetConfig(ModelConfig):
    name: Literal["lenet"] = "lenet"
    channels: tuple[int, int] = (6, 16)
    hidden: tuple[int, ...] = Field(
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


MODELS: dict[str, tuple[type[ModelConfig], Callable[[Any, tuple[int, ...], int], nn.Module]]] = {
    "mlp": (MLPConfig, _mlp),
    "lenet": (LeNetConfig, _lenet),
    "leaf_cnn": (LeafCNNConfig, _leaf),
    "linear": (LinearConfig, _linear),
    "conv_ae": (ConvAEConfig, _conv_ae),
}


def model_config(raw: dict[str, Any] | None, prefix: str = "model") -> ModelConfig:
    """Validate a `[model]` table (its `name` picks the architecture)."""
    raw = dict(raw or {})
    name = raw.get("name", "mlp")
    cls, _ = pick(MODELS, name, f"{prefix}.name")
    return parse(cls, raw, prefix)


@dataclass
class ModelFactory:
    """Builds one architecture for one federation and creates seeded initial parameters."""

    config: ModelConfig
    input_shape: tuple[int, ...]
    n_outputs: int

    def __post_init__(self) -> None:
        self.layout = ParamLayout(self.build())

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def size(self) -> int:
        """d, the number of parameters."""
        return self.layout.size

    def build(self) -> nn.Module:
        _, make = MODELS[self.config.name]
        return make(self.config, tuple(self.input_shape), self.n_outputs)

    def init(self, seed: int) -> torch.Tensor:
        """Flat initial parameters from PyTorch's default initialisation under `seed`."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return get_flat(self.build())

    def init_many(self, k: int, seed: int) -> torch.Tensor:
        """`[k, d]` independently initialised models (seeds seed, seed+1, ...)."""
        return torch.stack([self.init(seed + j) for j in range(k)])
