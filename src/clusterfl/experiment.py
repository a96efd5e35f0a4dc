"""Config → federation → algorithm on a backend → per-round history, checkpoints, summary.

A run directory holds `config.toml` (resolved), `history.jsonl` (one line per round),
`summary.json`, `checkpoint/state.pt` and, when enabled, `figures/` and `report.md`. It holds
one run: a new run into a folder that is not empty needs `resume` (continue the run there) or
`overwrite` (empty the folder first, `claim_run_dir`); otherwise it fails.
Every random choice of a run comes from generators seeded by the config or stored in the
checkpoint, so a resumed run ends with exactly the results of an uninterrupted one.

Held-out clients (`[scenario] holdout`): the federation is built whole, a stratified, seeded
share of its clients is kept out (`data.federation.holdout_split`), and the method trains on
the others, renumbered 0..n_train−1 (`backends.subset.SubsetBackend` translates ids for the
backend, which holds, or reaches, the whole federation). After the last round the held-out
clients, renumbered 0..n_hold−1 on their own context, are placed (`Algorithm.placement`) and
evaluated with the models they were placed on; `summary.json` gets `final.placement_ari`,
`final.holdout_accuracy` and a `holdout` table (their ids in the whole federation, true and
placed clusters, accuracies). The algorithm never learns that the clients exist before that.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterfl import metrics, tracking
from clusterfl.algorithms import Algorithm, Context, algorithm_class
from clusterfl.algorithms.base import SampledConfig
from clusterfl.backends import BACKENDS, Backend
from clusterfl.backends.subset import SubsetBackend
from clusterfl.config import (
    ROBUST_TABLES,
    Config,
    apply_overrides,
    data_table,
    dump_toml,
    load_config,
    read_toml,
)
from clusterfl.data import own
from clusterfl.data.federation import Federation, holdout_split
from clusterfl.data.scenarios import make_federation
from clusterfl.data.sources import SOURCE_NAMES, Source, load_source, standardize
from clusterfl.errors import ClusterFLError, ConfigError
from clusterfl.models import ModelFactory
from clusterfl.protocol import EvaluateReply, EvaluateRequest, Predictor
from clusterfl.records import (
    HISTORY_FILE,
    SUMMARY_FILE,
    FinalMetrics,
    RoundMetrics,
    RoundRecord,
    RunSummary,
    json_ready,
)
from clusterfl.robust.adversary import benign_vs_adversarial, choose_adversaries, flip_labels
from clusterfl.robust.divergence import Divergence, diagnose, loss_scale
from clusterfl.robust.guard import Guard

CHECKPOINT = "checkpoint/state.pt"
RUN_DIR_MARKERS = ("config.toml", HISTORY_FILE, SUMMARY_FILE, "report.md", "checkpoint")
"""Files one of our runs writes: a folder holding one (or folders holding one) may be emptied."""


class RunDirInUseError(ClusterFLError):
    """The output folder of a new run is not empty (and neither resume nor overwrite was asked)."""


def claim_run_dir(path: str | Path, resume: bool = False, overwrite: bool = False,
                  hint: str = "resume=True to continue the run there or overwrite=True to "
                              "replace it") -> None:
    """Make `path` ready for one new run, or check it for a resumed one.

    An absent or empty folder is fine. A folder with files needs `resume` (they are that run's
    files) or `overwrite`, which empties it first, but only when it holds our results (a
    run, or a comparison of runs): a folder of other files is never emptied. `hint` names the
    two options in the caller's words (`--resume or --overwrite` on the command line).
    """
    path = Path(path)
    if resume and overwrite:
        raise ClusterFLError("resume and overwrite exclude each other: resume continues the "
                             "run in the folder, overwrite deletes it")
    if path.exists() and not path.is_dir():
        raise RunDirInUseError(f"{path} is a file, not a run directory; choose another "
                               "output folder")
    if resume or not path.is_dir():
        return
    entries = sorted(p.name for p in path.iterdir())
    if not entries:
        return
    shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
    if not overwrite:
        raise RunDirInUseError(f"{path} is not empty (it holds {shown}); pass {hint}")
    if not _holds_results(path):
        raise RunDirInUseError(f"{path} holds files that are not clusterfl results ({shown}); "
                          "refusing to empty it: choose another output folder")
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _holds_results(path: Path) -> bool:
    """Whether `path` is a run folder or a folder of run folders (a comparison)."""
    def is_run(p: Path) -> bool:
        return any((p / m).exists() for m in RUN_DIR_MARKERS)

    return is_run(path) or any(is_run(p) for p in path.iterdir() if p.is_dir())


def build_federation(config: Config) -> Federation:
    if config.data.source not in SOURCE_NAMES:  # data of one's own (`clusterfl.data.own`)
        data = config.to_dict()["data"]
        return own.build(data, config.scenario_name, config.scenario.model_dump(),
                         config.run.seed, config.data.standardize)
    try:
        verify = config.data.verify is not False
        source: str | Source = config.data.source
        if config.data.standardize:
            source = standardize(load_source(config.data.source, config.data.data_dir, verify))
        federation = make_federation(
            source, config.scenario_name, config.scenario.model_dump(),
            seed=config.run.seed, data_dir=config.data.data_dir, verify=verify,
        )
    except ConfigError as exc:
        if exc.field == "source":
            raise ConfigError("data.source", exc.message) from None
        raise
    federation.meta["standardized"] = config.data.standardize
    return federation


def build_backend(config: Config, federation: Federation, factory: ModelFactory) -> Backend:
    return BACKENDS[config.backend.name].from_config(config.backend, federation, factory)


@dataclass
class History:
    """The per-round records of a run and its summary (empty until the run ends)."""

    records: list[RoundRecord] = field(default_factory=list)
    summary: RunSummary = field(default_factory=RunSummary)

    def series(self, key: str) -> list[float | None]:
        """A metric (a `RoundMetrics` field) per evaluated round, e.g. `series("accuracy")`."""
        if key not in RoundMetrics.KEYS:
            raise KeyError(f"{key!r} is not a round metric (one of {RoundMetrics.KEYS})")
        return [getattr(r.metrics, key) for r in self.records if r.metrics is not None]

    @property
    def final(self) -> FinalMetrics:
        return self.summary.final


class Experiment:
    """One run of one method on one federation.

    >>> exp = Experiment.from_config("configs/demo.toml", overrides=["rounds=5"])
    >>> history = exp.run()
    >>> history.final.metrics.accuracy
    """

    def __init__(
        self, config: Config, out_dir: str | Path | None = None,
        federation: Federation | None = None, overwrite: bool = False,
        callbacks: list[Any] | tuple[Any, ...] = (),
    ) -> None:
        """`overwrite`: a run (without resume) into a non-empty `out_dir` empties it first;
        without it, such a run raises `RunDirInUseError` (see `claim_run_dir`).
        `callbacks`: trackers told of every round (`clusterfl.tracking`), besides those of
        `[output] callbacks` and `tensorboard`."""
        self.config = config if federation is None else _with_data_of(config, federation)
        config = self.config
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.overwrite = overwrite
        full = federation if federation is not None else build_federation(config)
        self.algorithm: Algorithm = algorithm_class(config.algorithm.name)(config.algorithm)
        #: ids (in the whole federation) of the clients that train and of the held-out ones
        self.train_ids, self.holdout_ids = self._split(config, full)
        self.adversaries = choose_adversaries(config.adversary, len(self.train_ids),
                                              config.run.seed)
        if config.adversary.kind == "label_flip" and len(self.adversaries):
            full = flip_labels(full, self.train_ids[self.adversaries])
        self.full_federation = full
        """The whole federation: the backend's, which `train_ids` and `holdout_ids` index."""
        self.federation = full.subset(self.train_ids) if len(self.holdout_ids) else full
        """The clients that train, numbered 0..n−1 (all clients without `holdout`)."""
        _check_fault_clients(config, self.federation.n_clients)
        fed = self.federation
        self.factory = ModelFactory(config.model, fed.input_shape, fed.n_outputs)
        self.holdout: dict[str, Any] | None = None
        """The held-out clients' placement after the run (`summary.json`'s `holdout`)."""
        self.divergence: Divergence | None = None
        """The run's first diverged round (`clusterfl.robust.divergence`), if any."""
        self.diverged_rounds = 0
        self.checkpoint_round: int | None = None
        """The round the checkpoint in `out_dir` holds (None: none written or loaded yet)."""
        self.callbacks = self._callbacks(list(callbacks))

    @classmethod
    def from_config(
        cls, source: str | Path | dict[str, Any], overrides: list[str] | tuple[str, ...] = (),
        out_dir: str | Path | None = None, federation: Federation | None = None,
        overwrite: bool = False, callbacks: list[Any] | tuple[Any, ...] = (),
    ) -> Experiment:
        raw = source if isinstance(source, dict) else read_toml(source)
        return cls(load_config(apply_overrides(raw, list(overrides))), out_dir, federation,
                   overwrite, callbacks)

    def _callbacks(self, given: list[Any]) -> list[Any]:
        """The given callbacks, then `[output] callbacks`, then TensorBoard when asked."""
        out = self.config.output
        for cb in given:
            tracking.check_callback(cb)
        made = [tracking.make_callback(ref, f"output.callbacks[{i}]")
                for i, ref in enumerate(out.callbacks)]
        board = []
        if out.tensorboard:
            if self.out_dir is None:
                raise ConfigError("output.tensorboard", "TensorBoard events go to the run "
                                                        "directory: give the run an out_dir")
            board = [tracking.TensorBoardCallback(self.out_dir / tracking.TENSORBOARD_DIR)]
        return [*given, *made, *board]

    def _split(self, config: Config, full: Federation) -> tuple[np.ndarray, np.ndarray]:
        """(trained ids, held-out ids) of `[scenario] holdout` (all trained without it)."""
        fraction = float(getattr(config.scenario, "holdout", None) or 0.0)
        if not fraction:
            return np.arange(full.n_clients), np.zeros(0, dtype=np.int64)
        if type(self.algorithm).placement is Algorithm.placement:
            raise ConfigError("scenario.holdout", f"{self.algorithm.label()} cannot place new "
                              "clients yet; allowed for it: 0 (no held-out clients)")
        train, hold = holdout_split(full.clusters, full.n_clients, fraction, config.run.seed)
        k = getattr(config.algorithm, "n_clusters", None)
        if isinstance(k, int) and k > len(train):
            raise ConfigError("scenario.holdout", f"{fraction:g} leaves {len(train)} clients "
                              f"to train, fewer than algorithm.n_clusters = {k}; allowed: at "
                              f"most {(full.n_clients - k) / full.n_clients:.3g}")
        return train, hold

    # ------------------------------------------------------------------ the loop
    def _context(self, backend: Backend) -> Context:
        fed, run = self.federation, self.config.run
        return Context(
            backend=backend, factory=self.factory,
            training=self.config.train.local_training(), n_clients=fed.n_clients,
            train_sizes=fed.train_sizes, rng=np.random.default_rng([run.seed, 7919]),
            seed=run.seed, true_clusters=fed.clusters, rounds=run.rounds,
            guard=self._guard(),
        )

    def _robust_on(self) -> bool:
        """Whether a robustness table (`[faults]`, `[privacy]`, ...) changes the defaults."""
        return not self.config.to_dict().keys().isdisjoint(ROBUST_TABLES)

    def _guard(self) -> Guard:
        c, fed = self.config, self.federation
        rate = (c.algorithm.expected_fraction(fed.n_clients)  # for ε: fraction or per_round
                if isinstance(c.algorithm, SampledConfig) else 1.0)
        return Guard(fed.n_clients, c.run.seed, fed.train_sizes, c.validation, c.faults,
                     c.adversary, c.privacy, self.adversaries, sampling_rate=rate)

    def run(self, resume: bool = False, progress: bool | None = None) -> History:
        """Run all rounds (continuing from the checkpoint if `resume`)."""
        if self.out_dir is not None:
            claim_run_dir(self.out_dir, resume=resume, overwrite=self.overwrite)
        torch.manual_seed(self.config.run.seed)
        inner = build_backend(self.config, self.full_federation, self.factory)
        held_out = len(self.holdout_ids) > 0
        backend = SubsetBackend(inner, self.train_ids) if held_out else inner
        ctx = self._context(backend)
        self.algorithm.setup(ctx)
        history, start, elapsed = History(), 1, 0.0
        if resume:
            start, elapsed, history.records = self._load_checkpoint(ctx)
        self._prepare_dir(history.records)
        tracking.call(self.callbacks, "on_run_start", self.config.to_dict(), self.out_dir,
                      start=start)
        try:
            self._loop(ctx, history, start, elapsed, self._want_progress(progress))
            if held_out:
                self.holdout = self.place_holdout(inner)
        finally:
            inner.close()
        history.summary = self._summary(history, ctx)
        self._write_outputs(history)
        tracking.call(self.callbacks, "on_run_end", history.summary, self.out_dir)
        return history

    def _loop(self, ctx: Context, history: History, start: int, elapsed: float,
              show: bool) -> None:
        run = self.config.run
        t0 = time.perf_counter() - elapsed
        with _Progress(show, run.rounds, start - 1, self.algorithm.label()) as bar:
            for t in range(start, run.rounds + 1):
                if ctx.guard is not None:
                    ctx.guard.begin_round(t)
                ctx.participants.clear()
                done = self.algorithm.run_round(ctx, t)
                # TRANSITION: dicts until every method is converted
                extras = done if isinstance(done, dict) else done.to_dict()
                if ctx.guard is not None:
                    self._watch(t, ctx.guard, bar)
                evaluate = t % run.eval_every == 0 or t == run.rounds
                record = self._record(ctx, t, extras, evaluate, time.perf_counter() - t0)
                history.records.append(record)
                self._append(record)
                tracking.call(self.callbacks, "on_round_end", record)
                bar.update(record)
                every = run.checkpoint_every
                if every and (t % every == 0 or t == run.rounds):  # the last: to place, continue
                    self._save_checkpoint(ctx, t, time.perf_counter() - t0, history.records)

    def placing_context(self, backend: Backend, ids: np.ndarray | list[int]) -> Context:
        """The context a placement runs in: clients `ids` of the whole federation (held by
        `backend`) as 0..n−1, the run's seed and rounds, a generator of its own (the same for
        every placement: `clusterfl place` of the held-out clients repeats this run's), the
        default guard, its own communication count."""
        fed, run = self.full_federation, self.config.run
        ids = np.asarray(ids, dtype=np.int64)
        return Context(
            backend=SubsetBackend(backend, ids), factory=self.factory,
            training=self.config.train.local_training(), n_clients=len(ids),
            train_sizes=fed.train_sizes[ids], rng=np.random.default_rng([run.seed, 6007]),
            seed=run.seed, rounds=run.rounds)

    def place_holdout(self, backend: Backend) -> dict[str, Any]:
        """Place the held-out clients with the trained algorithm and evaluate them on the
        models they were placed on (module doc). `backend` holds the whole federation; the
        placement has its own context (clients 0..n_hold−1, the run's seed, a generator of
        its own, the default guard) and its own communication count."""
        fed, ids = self.full_federation, self.holdout_ids
        ctx = self.placing_context(backend, ids)
        placed = self.algorithm.placement(ctx, np.arange(len(ids)))
        reply = ctx.send(EvaluateRequest(placed.clients, placed.predictor))
        acc = np.full(len(ids), np.nan)
        acc[reply.clients] = reply.accuracy
        truth = None if fed.clusters is None else fed.clusters[ids]
        out: dict[str, Any] = {
            "fraction": float(getattr(self.config.scenario, "holdout", 0.0) or 0.0),
            "n_trained": len(self.train_ids), "n_held_out": len(ids),
            "trained_clients": self.train_ids.tolist(), "clients": ids.tolist(),
            "true_clusters": None if truth is None else truth.tolist(),
            "placed_clusters": np.asarray(placed.clusters).tolist(),
            "accuracy": acc.tolist(),
            "placement_ari": metrics.ari(truth, np.asarray(placed.clusters)),
            "holdout_accuracy": metrics.summarize(reply)["accuracy"],
            "floats_down": ctx.floats_down, "floats_up": ctx.floats_up,
        }
        if fed.task == "regression" and "mse" in reply.extras:
            mse = np.full(len(ids), np.nan)
            mse[reply.clients] = reply.extras["mse"]
            out["mse"] = mse.tolist()
        if placed.details is not None:
            out["details"] = placed.details
        return json_ready(out)

    def _watch(self, t: int, guard: Guard, bar: _Progress) -> None:
        """Diagnose round t's updates; warn at the first diverged round."""
        found = diagnose(t, guard.round_updates(), self._loss_scale())
        if found is None:
            return
        self.diverged_rounds += 1
        if self.divergence is None:
            self.divergence = found
            bar.warn(f"clusterfl: warning: {found.reason}")

    def _loss_scale(self) -> float | None:
        fed = self.federation
        if fed.task == "classification":
            return loss_scale(fed.task, fed.n_classes)
        return loss_scale(fed.task, fed.n_classes, float(fed.y_train.double().square().mean())
                          if fed.y_train.numel() else None)

    def _record(self, ctx: Context, t: int, extras: dict[str, Any], evaluate: bool,
                wall: float) -> RoundRecord:
        assignment = self.algorithm.assignment()
        rec = RoundRecord(
            round=t, wall_time=wall, n_clusters=self.algorithm.n_clusters(),
            assignment=assignment.tolist(), ari=metrics.ari(self.federation.clusters, assignment),
            floats_down=ctx.floats_down, floats_up=ctx.floats_up,
            client_updates=ctx.client_updates, extras=extras,
            participants=len(ctx.participants),
        )
        if ctx.guard is not None:
            events = ctx.guard.end_round()
            ctx.guard.count_round(events)
            rec.rejected = len(events["rejected"])
            if self._robust_on() or any(events.values()):
                rec.robust = events
        if evaluate:
            reply = evaluate_all(ctx.backend, self.algorithm.predictor(),
                                 self.federation.n_clients)
            rec.metrics = RoundMetrics(**metrics.summarize(reply))
            rec.client_accuracy = json_ready(reply.accuracy)
            rec.client_macro_f1 = json_ready(reply.macro_f1)
            if self.federation.task == "regression":
                rec.client_mse = json_ready(reply.extras.get("mse"))
        return rec.cleaned()  # numpy → Python, NaN → None

    def _summary(self, history: History, ctx: Context) -> RunSummary:
        last_eval = next((r for r in reversed(history.records) if r.metrics is not None), None)
        last = history.records[-1] if history.records else None
        final = FinalMetrics() if last is None else FinalMetrics(
            metrics=last_eval.metrics if last_eval else None, ari=last.ari,
            n_clusters=last.n_clusters, floats_down=last.floats_down, floats_up=last.floats_up,
            client_updates=last.client_updates, wall_time=last.wall_time,
            rejected=sum(r.rejected for r in history.records),
            participation=_participation(history.records, self.federation.n_clients),
            placement_ari=None if self.holdout is None else self.holdout["placement_ari"],
            holdout_accuracy=None if self.holdout is None
            else self.holdout["holdout_accuracy"],
        )
        fed = self.federation
        return RunSummary(
            algorithm=self.config.algorithm.name,
            label=self.algorithm.label(),
            federation=fed.name, n_clients=fed.n_clients,
            rounds=self.config.run.rounds,
            true_clusters=None if fed.clusters is None else fed.clusters.tolist(), final=final,
            client_accuracy=last_eval.client_accuracy if last_eval else None,
            client_macro_f1=last_eval.client_macro_f1 if last_eval else None,
            assignment=last.assignment if last else None,
            extras=last.extras if last else {},
            robust=self._robust_summary(ctx, last_eval, last),
            divergence=None if self.divergence is None else {
                **self.divergence.as_dict(), "rounds": self.diverged_rounds},
            holdout=self.holdout,
        ).cleaned()

    def _robust_summary(self, ctx: Context, last_eval: RoundRecord | None,
                        last: RoundRecord | None) -> dict[str, Any] | None:
        """Adversaries, rejections, dropouts and (ε, δ), when any robustness option is on."""
        guard = ctx.guard
        if guard is None or not self._robust_on():
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

    # ------------------------------------------------------------------ files
    def _want_progress(self, progress: bool | None) -> bool:
        if progress is not None:
            return progress
        mode = self.config.output.progress
        if mode != "auto":
            return mode == "on"
        return sys.stderr.isatty() and not os.environ.get("CI")

    def _prepare_dir(self, records: list[RoundRecord]) -> None:
        if self.out_dir is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "config.toml").write_text(dump_toml(self.config.to_dict()))
        with open(self.out_dir / HISTORY_FILE, "w") as fh:
            for r in records:
                fh.write(json.dumps(r.to_json_dict()) + "\n")

    def _append(self, record: RoundRecord) -> None:
        if self.out_dir is not None:
            with open(self.out_dir / HISTORY_FILE, "a") as fh:
                fh.write(json.dumps(record.to_json_dict()) + "\n")

    def _write_outputs(self, history: History) -> None:
        if self.out_dir is None:
            return
        save = getattr(self.algorithm, "save_artifacts", None)
        if callable(save):
            save(self.out_dir, self.config.run.rounds)
        _atomic_write(self.out_dir / SUMMARY_FILE,
                      json.dumps(history.summary.to_json_dict(), indent=2))
        if self.config.output.figures:
            from clusterfl.report import write_run_report

            write_run_report(self.out_dir)

    def _save_checkpoint(self, ctx: Context, t: int, elapsed: float,
                         records: list[RoundRecord]) -> None:
        if self.out_dir is None:
            return
        state = {
            "round": t, "elapsed": elapsed, "algorithm": self.algorithm.state_dict(),
            "rng": ctx.rng.bit_generator.state, "floats": (ctx.floats_down, ctx.floats_up),
            "client_updates": ctx.client_updates,
            "records": [r.to_json_dict() for r in records],
            "torch_rng": torch.get_rng_state(),
            "config": self.config.to_dict(),
            "guard": None if ctx.guard is None else ctx.guard.state_dict(),
            "divergence": None if self.divergence is None else self.divergence.as_dict(),
            "diverged_rounds": self.diverged_rounds,
        }
        path = self.out_dir / CHECKPOINT
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
        self.checkpoint_round = t

    def saved_round(self) -> int | None:
        """The round the checkpoint file in `out_dir` holds (None: none there, or unreadable).
        Read from the file, not `checkpoint_round`: an interrupt may land between the file's
        replacement and the attribute's update."""
        path = None if self.out_dir is None else self.out_dir / CHECKPOINT
        if path is None or not path.is_file():
            return None
        try:
            return int(torch.load(path, weights_only=False)["round"])
        except Exception:  # a torn or foreign file: what this process last saved
            return self.checkpoint_round

    def _load_checkpoint(self, ctx: Context) -> tuple[int, float, list[RoundRecord]]:
        path = None if self.out_dir is None else self.out_dir / CHECKPOINT
        if path is None or not path.is_file():
            raise ClusterFLError(f"--resume: no checkpoint at {path}; run without --resume")
        state = torch.load(path, weights_only=False)
        saved, now = dict(state["config"]), self.config.to_dict()
        if {**saved, "rounds": None} != {**now, "rounds": None}:
            raise ClusterFLError(
                f"--resume: the checkpoint in {path.parent} was made with another config; "
                "use the same config (see its config.toml) or a new --out"
            )
        continued = saved.get("rounds") != now["rounds"]
        if continued:
            self._check_continuation(path.parent, int(state["round"]), saved.get("rounds"))
        try:
            self.algorithm.load_state_dict(state["algorithm"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ClusterFLError(
                f"--resume: the checkpoint in {path.parent} does not fit this clusterfl's "
                f"{self.algorithm.name} state ({exc}); it was probably written by an older "
                "version: rerun without --resume into a new --out") from None
        ctx.rng.bit_generator.state = state["rng"]
        ctx.floats_down, ctx.floats_up = state["floats"]
        ctx.client_updates = int(state.get("client_updates", 0))
        torch.set_rng_state(state["torch_rng"])
        if ctx.guard is not None and state.get("guard") is not None:
            ctx.guard.load_state_dict(state["guard"])
        records = [RoundRecord.from_json_dict(r) for r in state["records"]]
        if continued:
            _forget_last_round_evaluation(records, saved.get("rounds"), self.config.run)
        if state.get("divergence") is not None:
            self.divergence = Divergence(**state["divergence"])
        self.diverged_rounds = int(state.get("diverged_rounds", 0))
        self.checkpoint_round = int(state["round"])
        return int(state["round"]) + 1, float(state["elapsed"]), records


    def _check_continuation(self, where: Path, held: int, planned: Any) -> None:
        """`--resume --set rounds=N` continues a run (finished or not) to N rounds: allowed
        when N reaches the checkpoint's round and the method does not schedule by the
        planned number of rounds T (`Algorithm.uses_planned_rounds`), which it could not
        change in the rounds already run."""
        rounds = self.config.run.rounds
        if rounds < held:
            raise ClusterFLError(
                f"--resume: the checkpoint in {where} already holds round {held}; rounds = "
                f"{rounds} would end before it: set rounds >= {held} (or a new --out)")
        if getattr(type(self.algorithm), "uses_planned_rounds", False):
            raise ClusterFLError(
                f"--resume: {self.algorithm.label()} schedules by the planned number of rounds "
                f"(T = {planned} in this run), so continuing it to {rounds} rounds would not "
                f"equal a {rounds}-round run; start a new run with rounds = {rounds} (or "
                f"resume with rounds = {planned})")


def _forget_last_round_evaluation(records: list[RoundRecord], planned: Any,
                                  run: Any) -> None:
    """A continued run's records as a run planned for `run.rounds` from the start has them:
    the old last round was evaluated because it was the last (`eval_every` aside); a run
    that goes on evaluates it only on the `eval_every` grid."""
    for rec in records:
        if (planned is not None and rec.round == int(planned) and rec.round < run.rounds
                and rec.round % run.eval_every != 0):
            rec.metrics = None
            rec.client_accuracy = rec.client_macro_f1 = rec.client_mse = None


def _with_data_of(config: Config, federation: Federation) -> Config:
    """The config of a run given `federation`: its `[data]` is the federation's own when
    the federation records one (`meta["data"]`, set by `Federation.from_clients` and the
    loaders of `clusterfl.data.own`), so the run directory says what data it was.

    A config without a `[data]` table of its own takes the federation's (and its scenario:
    `given` for per-client data); one that names other data is refused.
    """
    given = federation.meta.get("data")
    if not isinstance(given, dict):
        return config
    now = config.to_dict()
    if data_table(given) == now["data"]:
        return config
    if now["data"] != data_table({}):
        raise ConfigError("data", f"the config's [data] {now['data']} is not the data of the "
                                  f"federation given ({data_table(given)}); leave [data] out "
                                  "of the config (the federation's own is recorded) or make "
                                  "them agree")
    meta = federation.meta
    if own.is_per_client(str(given.get("source"))) is False and "scenario" in meta:
        scenario = {"name": meta["scenario"], **dict(meta.get("params") or {})}
    else:
        scenario = {"name": own.GIVEN}
    return load_config({**now, "data": given, "scenario": scenario})


def evaluate_all(backend: Backend, predictor: Predictor, n_clients: int) -> EvaluateReply:
    """Every client evaluates its predictor; a client that did not answer (a dead Flower
    node) gets NaN metrics in its row, so per-client series stay aligned with client ids
    (the summary metrics skip NaN)."""
    everyone = np.arange(n_clients)
    reply = backend.execute(EvaluateRequest(everyone, predictor))
    if len(reply.clients) == n_clients:
        return reply

    def full(values: np.ndarray) -> np.ndarray:
        out = np.full(n_clients, np.nan)
        out[reply.clients] = values
        return out

    return EvaluateReply(everyone, full(reply.accuracy), full(reply.macro_f1),
                         full(reply.loss), np.nan_to_num(full(reply.n_samples)).astype(np.int64),
                         {k: full(v) for k, v in reply.extras.items()})


def _participation(records: list[RoundRecord], n_clients: int) -> float | None:
    """Mean share of the clients that took part per round (None: no round recorded it)."""
    counts = [r.participants for r in records if r.participants is not None]
    return float(np.mean(counts)) / n_clients if counts and n_clients else None


def _check_fault_clients(config: Config, n_clients: int) -> None:
    bad = [c for c in config.faults.drop_clients if c >= n_clients]
    if bad:
        raise ConfigError("faults.drop_clients", f"ids {bad} do not exist; the federation has "
                          f"clients 0..{n_clients - 1}")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class _Progress:
    """A rich progress bar with round, accuracy and clusters; silent when disabled."""

    def __init__(self, show: bool, total: int, done: int, label: str) -> None:
        self.show, self.total, self.done, self.label = show, total, done, label
        self._bar: Any = None

    def __enter__(self) -> _Progress:
        if self.show:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(),
                TextColumn("round {task.completed}/{task.total}"),
                TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total, completed=self.done,
                                            info="")
        return self

    def update(self, record: RoundRecord) -> None:
        if self._bar is None:
            return
        m = record.metrics or RoundMetrics()
        info = f"acc {100 * m.accuracy:.1f}%" if m.accuracy is not None else ""
        if m.mse is not None:
            info = f"mse {m.mse:.4f}"
        info += f"  clusters {record.n_clusters}"
        self._bar.update(self._task, advance=1, info=info)

    def warn(self, text: str) -> None:
        """A line for the user: above the bar when one is shown, else on stderr."""
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False, style="yellow")
        else:
            print(text, file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
