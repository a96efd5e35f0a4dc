"""Losses, output combination and per-client metrics shared by all engines.

Language models (task "language_model"): outputs are `[N, T, V]` logits over the vocabulary
at each of a sequence's T positions, targets `[N, T]` the next token ids; a sample's loss is
its T tokens' cross-entropies (`[N, T]`, which the engines average per sequence: every
sequence has T tokens, so the mean over sequences is the token-weighted mean), and a client's
perplexity is exp of its mean token loss. With the ids of `<unk>` and `<eos>` known
(`not_words`), a client's accuracy on the other targets is `WORD_ACCURACY`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from clusterfl.protocol import WORD_ACCURACY, WORD_TARGETS, Combine


def word_hits(pred: torch.Tensor, y: torch.Tensor,
              not_words: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence (`[N]`, int64, on y's device): the predictions right on targets that are
    none of the ids `not_words`, and the number of such targets."""
    counted = torch.ones_like(y, dtype=torch.bool)
    for token in not_words:
        counted &= y != token
    return ((pred == y) & counted).sum(-1), counted.sum(-1)


def per_sample_loss(out: torch.Tensor, y: torch.Tensor, task: str) -> torch.Tensor:
    """Cross-entropy on logits (classification) or squared error (regression), per sample;
    a language model's cross-entropy per token, `[N, T]`."""
    if task == "regression":
        return (out.reshape(y.shape) - y) ** 2
    if task == "language_model":
        flat = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction="none")
        return flat.reshape(y.shape)
    return F.cross_entropy(out, y, reduction="none")


def combine(outputs: list[torch.Tensor], how: Combine,
            weights: torch.Tensor | None = None) -> torch.Tensor:
    """Combine member outputs into one prediction (logits, or log-probs for "mean_probs").

    `weights` (`[rows, members]`, or `[members]` for all rows alike) make "mean_probs" the
    weighted mean Σ_j w_j softmax(o_j) instead of the plain mean.
    """
    if how == "single" or (len(outputs) == 1 and how not in ("mean_probs", "mean_outputs")):
        return outputs[0]
    if how == "sum_logits":
        return torch.stack(outputs).sum(0)
    if how == "mean_outputs":
        return _weighted_mean(torch.stack(outputs), weights)
    probs = _weighted_mean(torch.stack([torch.softmax(o, -1) for o in outputs]), weights)
    return torch.log(probs.clamp_min(1e-12))


def _weighted_mean(stacked: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """Mean over the first axis of `[members, rows, O]`, weighted per row when given."""
    if weights is None:
        return stacked.mean(0)
    w = weights.to(stacked.device, stacked.dtype)
    w = w.t() if w.dim() == 2 else w[:, None].expand(-1, stacked.shape[1])
    return (stacked * w.reshape(*w.shape, *[1] * (stacked.dim() - 2))).sum(0)


# ----------------------------------------------------------------------------- mixtures
def responsibilities(losses: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """E-step of a mixture of K models: q_j(k) ∝ prior_jk · exp(−losses_jk), per row j.

    `losses` `[r, K]` per-sample losses, `prior` `[r, K]` (each row the mixture weights of the
    sample's client). Computed in float64 as a softmax of log prior − loss (a zero prior
    weight stays zero; a non-finite loss gets responsibility 0).
    """
    ll = torch.where(torch.isfinite(losses), -losses.double(),
                     torch.full_like(losses, -torch.inf, dtype=torch.float64))
    logits = torch.log(prior.double()) + ll
    bad = ~torch.isfinite(logits).any(-1, keepdim=True)  # nothing finite: fall back to prior
    logits = torch.where(bad, torch.log(prior.double()), logits)
    return torch.softmax(logits, -1)


def segment_sum(values: torch.Tensor, sizes: np.ndarray,
                padded: bool | None = None) -> torch.Tensor:
    """Per-client sums `[n, ...]` in float64 of `[total, ...]` rows (clients' rows consecutive,
    `sizes` each). On the CPU one `index_add_`; on a GPU, where `index_add_` adds in a varying
    order (atomics), the rows are laid out as `[n, max size, ...]` (zero padded) and summed,
    so that the same input gives the same sums run after run (`padded` forces either way)."""
    n, dev, v = len(sizes), values.device, values.double()
    sizes = np.asarray(sizes, dtype=np.int64)
    rows = np.repeat(np.arange(n), sizes)
    if not (dev.type != "cpu" if padded is None else padded):
        return torch.zeros((n, *v.shape[1:]), dtype=torch.float64).index_add_(
            0, torch.from_numpy(rows.astype(np.int64)), v)
    cols = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    pad = torch.zeros((n, int(sizes.max()) if n else 0, *v.shape[1:]), dtype=torch.float64,
                      device=dev)
    pad[torch.from_numpy(rows).to(dev), torch.from_numpy(cols).to(dev)] = v
    return pad.sum(1)


def segment_mean(values: torch.Tensor, sizes: np.ndarray) -> torch.Tensor:
    """Per-client mean of `[total, K]` rows (clients' rows consecutive, `sizes` each); a
    client without rows gets NaN."""
    total = segment_sum(values, sizes)
    count = torch.from_numpy(np.asarray(sizes, dtype=np.float64)).to(values.device)[:, None]
    return torch.where(count > 0, total / count.clamp_min(1), torch.nan)


def fit_mixture(losses: torch.Tensor, sizes: np.ndarray, prior: np.ndarray,
                iterations: int) -> tuple[np.ndarray, np.ndarray]:
    """`iterations` EM steps of the mixture weights of each client with frozen models.

    `losses` `[total, K]` per-sample losses (clients' rows consecutive, `sizes` each),
    `prior` `[n, K]` the starting weights. Each step: q = `responsibilities`, π ← mean q.
    Returns (π `[n, K]`, the negative log-likelihood −mean_j log Σ_k π_k e^{−ℓ_jk} `[n]`).
    A client without rows keeps its prior and gets NaN.
    """
    dev = losses.device
    pi = torch.as_tensor(np.asarray(prior, dtype=np.float64), device=dev)
    sizes = np.asarray(sizes, dtype=np.int64)
    rep = torch.from_numpy(np.repeat(np.arange(len(sizes)), sizes).astype(np.int64)).to(dev)
    has = torch.from_numpy(sizes > 0).to(dev)[:, None]
    for _ in range(int(iterations)):
        q = responsibilities(losses, pi[rep])
        pi = torch.where(has, segment_mean(q, sizes), pi)
    ll = torch.where(torch.isfinite(losses), -losses.double(),
                     torch.full_like(losses, -torch.inf, dtype=torch.float64))
    per = -torch.logsumexp(torch.log(pi[rep]) + ll, -1)
    nll = segment_mean(per[:, None], sizes)[:, 0]
    return pi.cpu().numpy(), nll.cpu().numpy()


def best_counts(losses: torch.Tensor, sizes: np.ndarray) -> np.ndarray:
    """`[n, K]` per client: how many of its rows each model has the least loss on (ties to
    the lower index; non-finite losses count as +inf)."""
    n, k = len(sizes), losses.shape[1]
    finite = torch.where(torch.isfinite(losses), losses.double(),
                         torch.full_like(losses, torch.inf, dtype=torch.float64))
    best = finite.argmin(-1)
    seg = torch.from_numpy(np.repeat(np.arange(n), sizes).astype(np.int64)).to(best.device)
    counts = torch.zeros(n * k, dtype=torch.int64, device=best.device).index_add_(
        0, seg * k + best, torch.ones_like(best))
    return counts.view(n, k).cpu().numpy()


def per_sample_losses(out: torch.Tensor, y: torch.Tensor, task: str) -> torch.Tensor:
    """`[r, K]` per-sample losses of K models' outputs `out` `[r, K, O]` on targets `y` `[r]`
    (regression: the squared error averaged over the outputs; a language model's `[r, K, T,
    V]` on `[r, T]`: the mean token cross-entropy of each sequence)."""
    r, k = out.shape[0], out.shape[1]
    if task == "language_model":
        picked = out.gather(-1, y[:, None, :, None].expand(-1, k, -1, 1)).squeeze(-1)
        return (torch.logsumexp(out, -1) - picked).mean(-1)
    if task == "classification":
        picked = out.gather(-1, y.view(-1, 1, 1).expand(-1, k, 1)).squeeze(-1)
        return torch.logsumexp(out, -1) - picked
    flat = out.reshape(r * k, -1)
    per = per_sample_loss(flat, y.repeat_interleave(k, 0), task)
    return per.reshape(r, k, -1).mean(-1)


def macro_f1(pred: torch.Tensor, y: torch.Tensor, n_classes: int) -> float:
    """Macro-F1 over the labels present in y or pred (scikit-learn's default label set)."""
    if len(y) == 0:
        return float("nan")
    idx = y * n_classes + pred
    conf = torch.bincount(idx, minlength=n_classes * n_classes).view(n_classes, n_classes)
    tp = conf.diag().double()
    support = conf.sum(1).double()
    predicted = conf.sum(0).double()
    present = (support + predicted) > 0
    denom = support + predicted
    f1 = torch.where(denom > 0, 2 * tp / denom.clamp_min(1), torch.zeros_like(tp))
    return float(f1[present].mean())


def client_metrics(
    out: torch.Tensor, y: torch.Tensor, task: str, n_classes: int,
    not_words: tuple[int, ...] = (),
) -> dict[str, float]:
    """accuracy, macro_f1, loss, mse (regression) and perplexity (a language model: exp of
    the mean token loss; accuracy is then the share of tokens predicted right, macro_f1 NaN)
    of one client's predictions; the metrics a task does not have are NaN. A language model
    with `not_words` (the ids of `<unk>` and `<eos>`) also has `WORD_ACCURACY` (NaN without
    such targets) and `WORD_TARGETS`."""
    nan = float("nan")
    words = {WORD_ACCURACY: nan, WORD_TARGETS: 0.0} if task == "language_model" and not_words \
        else {}
    if len(y) == 0:
        return {"accuracy": nan, "macro_f1": nan, "loss": nan, "mse": nan, "perplexity": nan,
                **words}
    loss = float(per_sample_loss(out, y, task).mean())
    if task == "regression":
        return {"accuracy": nan, "macro_f1": nan, "loss": loss, "mse": loss, "perplexity": nan}
    pred = out.argmax(-1)
    accuracy = float((pred == y).double().mean())
    if task == "language_model":
        if words:
            hits, counted = (int(v.sum()) for v in word_hits(pred, y, not_words))
            words = {WORD_ACCURACY: hits / counted if counted else nan,
                     WORD_TARGETS: float(counted)}
        return {"accuracy": accuracy, "macro_f1": nan, "loss": loss, "mse": nan,
                "perplexity": perplexity(loss), **words}
    return {
        "accuracy": accuracy,
        "macro_f1": macro_f1(pred, y, n_classes),
        "loss": loss,
        "mse": nan,
        "perplexity": nan,
    }


def perplexity(mean_token_loss: float) -> float:
    """exp of a mean token cross-entropy (nats); +inf past float range, NaN stays NaN."""
    if math.isnan(mean_token_loss):
        return math.nan
    return math.exp(mean_token_loss) if mean_token_loss < 709.0 else math.inf
