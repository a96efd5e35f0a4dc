"""A two-layer LSTM language model: embedding → stacked LSTM → linear to the vocabulary.

What the source gives: CFL (Sattler et al., "Clustered Federated Learning", IEEE TNNLS 2021),
the AG News experiment of Fig. 10: 20 clients, each holding the articles of one of the four
topics, train "a two-layer LSTM" to predict the next word, and the paper reports perplexity.
The text we follow names no embedding or hidden width, sequence length or vocabulary size.

What we chose: a word embedding of `embed` dimensions, `layers` LSTM layers of `hidden`
units (the standard cell: input, forget, cell and output gates, Hochreiter & Schmidhuber
1997 with the forget gate of Gers et al. 2000), and one linear layer from the last layer's
hidden state to logits over the vocabulary at every position; the state starts at zero for
every sequence (each sequence is a window of a client's token stream, `clusterfl.data.text`).
Defaults 128/256 for AG News; the tests use a few dozen units.

Two implementations of the same layers (`cell`):

- "fused" (default): `nn.LSTM`, PyTorch's fused kernel. `torch.func.vmap` runs it only
  through its slow per-sample fallback (no batching rule), so the module sets
  `stack_with_vmap = False` and the simulation backend's generic kernel loops over the
  clients, each client's batch through the fused kernel.
- "written": the cell equations written out (the input projection of the whole sequence in
  one product, then one product per time step), which vmap traces: the generic kernel then
  trains all clients of a chunk with one batched product per step.

On this machine's CPU "fused" with the loop over clients was the fastest at the AG News
sizes (docs/language_model.md has the measurements); "written" is there for vmap, where
batching many clients pays off (a GPU: not measured here).

Input: `[B, T]` token ids (any dtype holding whole numbers); output: `[B, T, V]` logits.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn


class LSTMCellLayer(nn.Module):
    """One LSTM layer's parameters: `weight_ih` `[4H, in]`, `weight_hh` `[4H, H]`, `bias`
    `[4H]` (gates in the order input, forget, cell, output, as `nn.LSTM`)."""

    def __init__(self, n_in: int, hidden: int) -> None:
        super().__init__()
        bound = hidden ** -0.5  # nn.LSTM's initialisation: U(-1/sqrt(H), 1/sqrt(H))
        self.weight_ih = nn.Parameter(torch.empty(4 * hidden, n_in).uniform_(-bound, bound))
        self.weight_hh = nn.Parameter(torch.empty(4 * hidden, hidden).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(4 * hidden).uniform_(-bound, bound))
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`[B, T, in]` → the hidden states `[B, T, H]`, from a zero state."""
        b, t = x.shape[0], x.shape[1]
        pre = x @ self.weight_ih.t() + self.bias  # the input projection of every step at once
        h = x.new_zeros(b, self.hidden)
        c = x.new_zeros(b, self.hidden)
        outs = []
        for s in range(t):
            gates = pre[:, s] + h @ self.weight_hh.t()
            i, f, g, o = gates.chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        return torch.stack(outs, 1)


class LSTMLanguageModel(nn.Module):
    """Next-token logits `[B, T, V]` of token ids `[B, T]` (module docstring: sources)."""

    def __init__(self, input_shape: tuple[int, ...], n_outputs: int, embed: int = 128,
                 hidden: int = 256, layers: int = 2, cell: str = "fused") -> None:
        super().__init__()
        if len(input_shape) != 1:
            raise ValueError(f"an LSTM language model reads token sequences [T]; the data has "
                             f"inputs {tuple(input_shape)}")
        if cell not in ("fused", "written"):
            raise ValueError(f"cell must be 'fused' or 'written', got {cell!r}")
        self.embedding = nn.Embedding(n_outputs, embed)
        self.lstm: nn.Module
        if cell == "fused":
            self.lstm = nn.LSTM(embed, hidden, layers, batch_first=True)
        else:
            sizes = [embed] + [hidden] * layers
            self.lstm = nn.Sequential(
                *(LSTMCellLayer(a, b) for a, b in itertools.pairwise(sizes)))
        #: read by the generic kernel: False makes it loop over clients instead of vmap
        self.stack_with_vmap = cell == "written"
        self.out = nn.Linear(hidden, n_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lstm(self.embedding(x.long()))
        return self.out(h[0] if isinstance(h, tuple) else h)
