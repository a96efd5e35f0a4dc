"""Flat parameter vectors: every model is exchanged as one float tensor of length d.

Algorithms average, compare and cluster these vectors; engines load them into modules (or
into stacked `[n_clients, ...]` views) to compute. `ParamLayout` records where each named
tensor lives inside the flat vector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ParamEntry:
    name: str
    shape: tuple[int, ...]
    start: int
    stop: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


class ParamLayout:
    """Names, shapes and positions of a module's parameters inside a flat vector."""

    def __init__(self, module: nn.Module) -> None:
        entries = []
        pos = 0
        for name, p in module.named_parameters():
            entries.append(ParamEntry(name, tuple(p.shape), pos, pos + p.numel()))
            pos += p.numel()
        self.entries: tuple[ParamEntry, ...] = tuple(entries)
        self.size = pos

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def entry(self, name: str) -> ParamEntry:
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(f"no parameter named {name!r}; parameters: {', '.join(self.names)}")

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named views into `flat` (`[d]` or stacked `[n, d]`): no copy."""
        lead = flat.shape[:-1]
        return {e.name: flat[..., e.start : e.stop].view(*lead, *e.shape) for e in self.entries}

    def flatten(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([tensors[e.name].reshape(-1) for e in self.entries])

    def index(self, prefixes: Sequence[str] | None) -> torch.Tensor:
        """Positions of the parameters whose name starts with any of `prefixes` (all if None).

        Used for "only these layers" options (FeSEM's k-means on chosen layers, CFL-GP's
        layer-selected features, weight sharing).
        """
        if prefixes is None:
            return torch.arange(self.size)
        chosen = [e for e in self.entries if any(e.name.startswith(p) for p in prefixes)]
        if not chosen:
            raise KeyError(
                f"no parameter matches {list(prefixes)}; parameters: {', '.join(self.names)}"
            )
        return torch.cat([torch.arange(e.start, e.stop) for e in chosen])


def get_flat(module: nn.Module) -> torch.Tensor:
    """A copy of the module's parameters as one flat float tensor."""
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).clone()


def set_flat(module: nn.Module, flat: torch.Tensor) -> None:
    """Copy a flat vector into the module's parameters (in place, no reallocation)."""
    pos = 0
    with torch.no_grad():
        for p in module.parameters():
            n = p.numel()
            p.copy_(flat[pos : pos + n].view_as(p))
            pos += n
    if pos != flat.numel():
        raise ValueError(f"flat vector has {flat.numel()} values, the model needs {pos}")


def get_flat_grad(module: nn.Module) -> torch.Tensor:
    return torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
            for p in module.parameters()
        ]
    )


def last_layer_mask(layout: ParamLayout) -> torch.Tensor:
    """Boolean `[d]` mask of the last layer: the parameters of the module owning the last one.

    E.g. `classifier.4.weight` and `classifier.4.bias` for LeNet, `layers.1.*` for an MLP.
    """
    last = layout.entries[-1].name
    owner = last.rsplit(".", 1)[0] + "." if "." in last else last
    mask = torch.zeros(layout.size, dtype=torch.bool)
    for e in layout.entries:
        if e.name == last or e.name.startswith(owner):
            mask[e.start : e.stop] = True
    return mask


def linear_layer_prefixes(module: nn.Module) -> list[str]:
    """Name prefixes (`"layers.1."`) of every `nn.Linear` of `module`: its fully-connected
    layers."""
    return [f"{n}." for n, m in module.named_modules() if isinstance(m, nn.Linear)]
