"""What a run records: one `RoundRecord` per round, the divergence watch, the `RunSummary`.

The `Recorder` reads the round's outcome from the method, the context and the guard (the
assignment, its ARI, the running communication totals, the guard's events) and evaluates every
client in the rounds on the `eval_every` grid and the last one; at the end it sums the run up.
It keeps the run's first diverged round, which the checkpoint stores (`state_dict`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from clusterfl import metrics
from clusterfl.algorithms import Algorithm, Context, checked_assignment
from clusterfl.backends import Backend
from clusterfl.config import ROBUST_TABLES, Config
from clusterfl.config_util import changed_fields
from clusterfl.data.federation import Federation
from clusterfl.protocol import EvaluateReply, EvaluateRequest, Predictor, subset
from clusterfl.records import (
    FinalMetrics,
    RoundMetrics,
    RoundRecord,
    RunSummary,
    held_out_mse,
    json_ready,
)
from clusterfl.robust.adversary import benign_vs_adversarial
from clusterfl.robust.divergence import Divergence, diagnose, loss_scale, noise_cause


def evaluate_all(backend: Backend, predictor: Predictor, n_clients: int,
                 clients: np.ndarray | None = None) -> EvaluateReply:
    """Every client (or only `clients`, sorted ids: a sample) evaluates its predictor; a
    client that did not answer (a dead Flower node) or was not asked gets NaN metrics in its
    row, so per-client series stay aligned with client ids (the summary metrics skip NaN)."""
    everyone = np.arange(n_clients)
    if clients is None:
        reply = backend.execute(EvaluateRequest(everyone, predictor))
    else:
        asked = np.asarray(clients, dtype=np.int64)
        reply = backend.execute(EvaluateRequest(asked, subset(predictor, asked)))
    if len(reply.clients) == n_clients:
        return reply

    def full(values: np.ndarray) -> np.ndarray:
        out = np.full(n_clients, np.nan)
        out[reply.clients] = values
        return out

    return EvaluateReply(everyone, full(reply.accuracy), full(reply.macro_f1),
                         full(reply.loss), np.nan_to_num(full(reply.n_samples)).astype(np.int64),
                         {k: full(v) for k, v in reply.extras.items()})


ALWAYS_REJECTED = 3
"""Rounds of rejected replies, none accepted, after which a client is reported."""

STALLED = 0.01
"""A classifier (or language model) whose final mean test loss is still within this share of
ln C, the loss of a uniform guess over its C outputs, has not learned: `Recorder.stalled`
warns (a warning, not a rule: the run's results stand)."""


def divergence_suspects(config: Config) -> list[str]:
    """The settings of `config` besides the learning rate that can make local training blow
    up, where they are set away from their defaults: weight decay and momentum, the method's
    numeric options (a proximal μ, a server step, an initial range ...), attacking clients."""
    train = [f"train.{n} = {getattr(config.train, n):g}"
             for n in changed_fields(config.train, "weight_decay", "momentum")]
    algo = config.algorithm
    options = [f"algorithm.{n} = {getattr(algo, n):g}" for n in changed_fields(algo)
               if n not in ("fraction", "per_round") and isinstance(getattr(algo, n), float)]
    attack = config.adversary
    attackers = [f"attacking clients (adversary.kind = {attack.kind!r})"] \
        if attack.kind != "none" else []
    return [*train, *options, *attackers]


class Recorder:
    """The round records and the summary of one run of `algorithm` on `federation` (the
    clients that train); `adversaries`: the attacking clients' ids, for the summary."""

    def __init__(self, config: Config, federation: Federation, algorithm: Algorithm,
                 adversaries: np.ndarray) -> None:
        self.config, self.federation, self.algorithm = config, federation, algorithm
        self.adversaries = adversaries
        self.robust_on = not config.to_dict().keys().isdisjoint(ROBUST_TABLES)
        """Whether a robustness table (`[faults]`, `[privacy]`, ...) changes the defaults."""
        self.divergence: Divergence | None = None
        """The run's first diverged round (`clusterfl.robust.divergence`), if any."""
        self.cause = noise_cause(config.privacy.noise_multiplier, config.privacy.clip,
                                 divergence_suspects(config))
        """What a diverging loss likely comes from in this run (`diagnose`'s `cause`)."""
        self.diverged_rounds = 0
        self.rejected_rounds: dict[int, int] = {}
        """Per client, the rounds in which its reply was rejected while it never had one
        accepted (`ALWAYS_REJECTED`: a warning; dropped from here once one is accepted)."""
        self.accepted: set[int] = set()
        self.warnings: list[str] = []
        """What the run warned of so far (`summary.json`, the report)."""
        self.pending: list[str] = []
        """The console warnings of the round just recorded (the method's, then rejections)."""

    # ------------------------------------------------------------------ divergence
    def watch(self, t: int, ctx: Context) -> str | None:
        """Diagnose round t's updates; the warning to show at the first diverged round."""
        if ctx.guard is None:
            return None
        found = diagnose(t, ctx.guard.round_updates(), self._loss_scale(), self.cause)
        if found is None:
            return None
        self.diverged_rounds += 1
        if self.divergence is not None:
            return None
        self.divergence = found
        return found.reason

    def _loss_scale(self) -> float | None:
        fed = self.federation
        if fed.task != "regression":  # cross-entropy over classes or a vocabulary
            return loss_scale(fed.task, fed.n_classes)
        return loss_scale(fed.task, fed.n_classes, float(fed.y_train.double().square().mean())
                          if fed.y_train.numel() else None)

    def state_dict(self) -> dict[str, Any]:
        return {"divergence": None if self.divergence is None else self.divergence.as_dict(),
                "diverged_rounds": self.diverged_rounds,
                "rejected_rounds": dict(self.rejected_rounds),
                "accepted": sorted(self.accepted), "warnings": list(self.warnings)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("divergence") is not None:
            self.divergence = Divergence(**state["divergence"])
        self.diverged_rounds = int(state.get("diverged_rounds", 0))
        self.rejected_rounds = {int(c): int(n)
                                for c, n in state.get("rejected_rounds", {}).items()}
        self.accepted = {int(c) for c in state.get("accepted", [])}
        self.warnings = list(state.get("warnings", []))

    def rejections(self, ctx: Context, events: dict[str, Any]) -> list[str]:
        """Round warnings for clients whose reply has been rejected in `ALWAYS_REJECTED`
        rounds without ever being accepted (e.g. NaN in their data): they take no part in
        training, which would otherwise go unnoticed."""
        self.accepted.update(ctx.participants)
        reasons: dict[int, str] = {}
        for r in events.get("rejected", []):
            reasons.setdefault(int(r["client"]), str(r["reason"]))
        crossed: dict[str, list[int]] = {}  # the reason → the clients that reached the count
        for c, why in reasons.items():
            if c in self.accepted:
                continue
            n = self.rejected_rounds[c] = self.rejected_rounds.get(c, 0) + 1
            if n == ALWAYS_REJECTED:
                crossed.setdefault(why, []).append(c)
        out = []
        for why, clients in crossed.items():  # one line per reason, however many clients
            if len(clients) == 1:
                who, it, takes, its = f"client {clients[0]}'s reply was", "it was", "it " \
                    "takes", "its"
            else:
                who, it, takes, its = (f"the replies of {len(clients)} clients "
                                       f"({id_ranges(clients)}) were", "they were",
                                       "they take", "their")
            out.append(f"{who} rejected in each of the {ALWAYS_REJECTED} rounds {it} asked so "
                       f"far ({why}); {takes} no part in training: check {its} data")
        self.warnings.extend(out)
        return out

    def method_said(self, ctx: Context) -> list[str]:
        """The method's warnings of the round (`Context.warn`, `Update.warnings`), taken
        from `ctx`: those the run has not said yet, added to `warnings` (each distinct line
        once a run, a resumed one included)."""
        new = [line for line in dict.fromkeys(ctx.log) if line not in self.warnings]
        ctx.log.clear()
        self.warnings.extend(new)
        return new

    def stalled(self, records: list[RoundRecord]) -> str | None:
        """The end-of-run warning for models that did not learn (`STALLED`), else None: a
        run can end at a uniform guess without diverging (too small a learning rate, too
        little local work, or one gradient step a round for a few rounds), and would do so
        silently."""
        fed = self.federation
        last = next((r for r in reversed(records) if r.metrics is not None), None)
        scale = loss_scale(fed.task, fed.n_classes)  # None for a regression: no uniform guess
        if last is None or last.metrics is None or scale is None or \
                self.divergence is not None:  # a diverged run has had its own warning
            return None
        loss = last.metrics.loss
        if loss is None or not math.isfinite(loss) or loss < (1 - STALLED) * scale:
            return None
        what = "classes" if fed.task == "classification" else "tokens of the vocabulary"
        faults = self.config.faults
        others = [*(f"faults.{n} = {getattr(faults, n)}"
                    for n in changed_fields(faults, "dropout", "stragglers", "straggler_work")),
                  *divergence_suspects(self.config)]
        none = " no client update was counted in any round;" if \
            records[-1].client_updates == 0 and self.algorithm.config.shares_updates else ""
        return (f"the models did not learn: the final mean test loss {loss:.4f} (round "
                f"{last.round}) is not {STALLED:.0%} below ln {fed.n_classes} = {scale:.4f}, "
                f"the loss of a uniform guess over the {fed.n_classes} {what};{none} check "
                "train.lr, the local work (train.epochs or train.steps) and rounds"
                + (f", and {', '.join(others)}" if others else ""))

    # ------------------------------------------------------------------ records
    def eval_sample(self, t: int) -> np.ndarray | None:
        """The clients evaluated in round t (sorted ids), None for all: `eval_clients` of
        them (a number, or a fraction of the clients, at least one) in a round before the
        last; all in the last round. Drawn from a generator of the run's seed and the round
        alone, so evaluating a sample changes nothing else in the run."""
        run, n = self.config.run, self.federation.n_clients
        k = run.eval_count(n)
        if k is None or t >= run.rounds:
            return None
        rng = np.random.default_rng([run.seed, 8807, t])
        return np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)

    def record(self, ctx: Context, t: int, extras: dict[str, Any], evaluate: bool,
               wall: float) -> RoundRecord:
        """Round t's record (JSON-ready); evaluates every client when `evaluate`."""
        assignment = checked_assignment(self.algorithm, self.federation.n_clients)
        rec = RoundRecord(
            round=t, wall_time=wall, n_clusters=self.algorithm.n_clusters(),
            assignment=assignment.tolist(), ari=metrics.ari(self.federation.clusters, assignment),
            floats_down=ctx.floats_down, floats_up=ctx.floats_up,
            client_updates=ctx.client_updates, extras=extras,
            participants=len(ctx.participants),
        )
        self.pending = self.method_said(ctx)
        if ctx.guard is not None:
            events = ctx.guard.end_round()
            ctx.guard.count_round(events)
            rec.rejected = len(events["rejected"])
            self.pending += self.rejections(ctx, events)
            if self.robust_on or any(events.values()):
                rec.robust = events
        if evaluate:
            self.evaluate_into(rec, ctx, t)
        return rec.cleaned()  # numpy → Python, NaN → None

    def evaluate_into(self, rec: RoundRecord, ctx: Context, t: int) -> None:
        """Round t's evaluation (`eval_sample(t)`'s clients, or all) into `rec`."""
        reply = evaluate_all(ctx.backend, self.algorithm.predictor(),
                             self.federation.n_clients, self.eval_sample(t))
        rec.metrics = RoundMetrics(**metrics.summarize(reply))
        rec.client_accuracy = json_ready(reply.accuracy)
        rec.client_macro_f1 = json_ready(reply.macro_f1)
        if self.federation.task == "regression":
            rec.client_mse = json_ready(reply.extras.get("mse"))

    def continued_last_round(self, records: list[RoundRecord], ctx: Context,
                             planned: Any) -> RoundRecord | None:
        """A finished run of `planned` rounds continued to more: its old last round was
        evaluated on every client because it was the last; a run planned for the new
        `rounds` evaluates it only on the `eval_every` grid, and there on `eval_clients`'
        sample. Its record is redone so (the models are that round's: the checkpoint's)
        and returned, to be logged again; None when the run is not such a continuation."""
        run = self.config.run
        if not records or planned is None or records[-1].round != int(planned) \
                or records[-1].round >= run.rounds:
            return None
        last, t = records[-1], records[-1].round
        if t % run.eval_every != 0:
            last.metrics = None
            last.client_accuracy = last.client_macro_f1 = last.client_mse = None
        elif self.eval_sample(t) is not None:
            self.evaluate_into(last, ctx, t)
            records[-1] = last.cleaned()
        return records[-1]

    def summary(self, records: list[RoundRecord], ctx: Context,
                holdout: dict[str, Any] | None) -> RunSummary:
        """The run's `summary.json`: the last evaluated round's metrics, the last round's
        clustering and costs, the robustness totals, the divergence and the held-out
        clients' placement (`holdout`)."""
        last_eval = next((r for r in reversed(records) if r.metrics is not None), None)
        last = records[-1] if records else None
        fed = self.federation
        final = FinalMetrics() if last is None else FinalMetrics(
            metrics=last_eval.metrics if last_eval else None, ari=last.ari,
            n_clusters=last.n_clusters, floats_down=last.floats_down, floats_up=last.floats_up,
            client_updates=last.client_updates, wall_time=last.wall_time,
            rejected=sum(r.rejected for r in records),
            participation=_participation(records, fed.n_clients),
            placement_ari=None if holdout is None else holdout["placement_ari"],
            holdout_accuracy=None if holdout is None else holdout["holdout_accuracy"],
            holdout_mse=held_out_mse(holdout)[0],
            placement_match=None if holdout is None else holdout.get("placement_match"),
        )
        return RunSummary(
            algorithm=self.config.algorithm.name, label=self.algorithm.label(),
            federation=fed.name, n_clients=fed.n_clients, rounds=self.config.run.rounds,
            true_clusters=None if fed.clusters is None else fed.clusters.tolist(), final=final,
            client_accuracy=last_eval.client_accuracy if last_eval else None,
            client_macro_f1=last_eval.client_macro_f1 if last_eval else None,
            assignment=last.assignment if last else None,
            extras=last.extras if last else {},
            robust=self._robust_summary(ctx, last_eval, last),
            divergence=None if self.divergence is None else {
                **self.divergence.as_dict(), "rounds": self.diverged_rounds},
            holdout=holdout, warnings=self.warnings or None,
        ).cleaned()

    def _robust_summary(self, ctx: Context, last_eval: RoundRecord | None,
                        last: RoundRecord | None) -> dict[str, Any] | None:
        """Adversaries, rejections, dropouts and (ε, δ), when any robustness option is on."""
        guard = ctx.guard
        if guard is None or not self.robust_on:
            return None
        out = guard.summary()
        bad = self.adversaries
        if len(bad) and last is not None:
            out.update(benign_vs_adversarial(np.asarray(last.assignment), bad))
            acc = last_eval.client_accuracy if last_eval else None
            if acc is not None:
                benign = np.setdiff1d(np.arange(len(acc)), bad)
                out["benign_accuracy"] = float(np.mean(np.asarray(acc, dtype=float)[benign]))
        return out


def _participation(records: list[RoundRecord], n_clients: int) -> float | None:
    """Mean share of the clients that took part per round (None: no round recorded it)."""
    counts = [r.participants for r in records if r.participants is not None]
    return float(np.mean(counts)) / n_clients if counts and n_clients else None


def id_ranges(ids: list[int], most: int = 12) -> str:
    """Client ids as runs: [0, 1, 2, 5, 7, 8] → '0-2, 5, 7-8' (the first `most` runs, then
    '…')."""
    runs: list[list[int]] = []
    for c in sorted(ids):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:most]]
    return ", ".join(text) + (", …" if len(runs) > most else "")

