"""Losses, output combination and per-client metrics shared by all engines."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clusterfl.protocol import Combine


def per_sample_loss(out: torch.Tensor, y: torch.Tensor, task: str) -> torch.Tensor:
    """Cross-entropy on logits (classification) or squared error (regression), per sample."""
    if task == "regression":
        return (out.reshape(y.shape) - y) ** 2
    return F.cross_entropy(out, y, reduction="none")


def combine(outputs: list[torch.Tensor], how: Combine) -> torch.Tensor:
    """Combine member outputs into one prediction (logits, or log-probs for "mean_probs")."""
    if how == "single" or (len(outputs) == 1 and how != "mean_probs"):
        return outputs[0]
    if how == "sum_logits":
        return torch.stack(outputs).sum(0)
    probs = torch.stack([torch.softmax(o, -1) for o in outputs]).mean(0)
    return torch.log(probs.clamp_min(1e-12))


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
    out: torch.Tensor, y: torch.Tensor, task: str, n_classes: int
) -> dict[str, float]:
    """accuracy, macro_f1, loss (and mse for regression) of one client's predictions."""
    if len(y) == 0:
        nan = float("nan")
        return {"accuracy": nan, "macro_f1": nan, "loss": nan, "mse": nan}
    loss = float(per_sample_loss(out, y, task).mean())
    if task == "regression":
        return {"accuracy": float("nan"), "macro_f1": float("nan"), "loss": loss, "mse": loss}
    pred = out.argmax(-1)
    return {
        "accuracy": float((pred == y).double().mean()),
        "macro_f1": macro_f1(pred, y, n_classes),
        "loss": loss,
        "mse": float("nan"),
    }
