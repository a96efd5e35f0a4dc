"""Config → federation → algorithm on a backend → per-round history, checkpoints, summary.

`Experiment.run` is the run loop; each other job has its own collaborator:

- `rundir.RunDir`: the run folder, claimed and locked while the run writes into it (a new
  run into a used folder needs `resume` or `overwrite`, which removes only our files), its
  `config.toml`, `history.jsonl` (one line per round) and `summary.json`;
- `checkpoint.Checkpoints`: `checkpoint/state.pt`, written after every `checkpoint_every`
  rounds and the last, and put back on resume;
- `recorder.Recorder`: each round's record, the divergence watch and the summary;
- `holdout.Holdout`: the held-out clients (`[scenario] holdout`), kept out of training and
  placed after the last round (`summary.json`'s `holdout`);
- `progress.Progress`: the progress bar.

Every random choice of a run comes from generators seeded by the config or stored in the
checkpoint, so a resumed run ends with exactly the results of an uninterrupted one.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clusterfl import tracking
from clusterfl.algorithms import Algorithm, Context, algorithm_class
from clusterfl.algorithms.common import SampledConfig
from clusterfl.backends import BACKENDS, Backend
from clusterfl.backends.subset import SubsetBackend
from clusterfl.checkpoint import CHECKPOINT, Checkpoints
from clusterfl.config import Config, apply_overrides, data_table, dump_toml, load_config, read_toml
from clusterfl.config_util import check_flag
from clusterfl.data import own
from clusterfl.data.federation import Federation
from clusterfl.data.scenarios import make_federation
from clusterfl.data.sources import SOURCE_NAMES, Source, load_source, standardize
from clusterfl.data.text import VOCAB_FILE, TopicsParams, Vocab, token_warnings
from clusterfl.errors import ClusterFLError, ConfigError, write_error
from clusterfl.holdout import Holdout, private
from clusterfl.models import MODELS, ModelFactory
from clusterfl.plugins import own_code_error
from clusterfl.progress import Progress, want_progress
from clusterfl.recorder import Recorder, evaluate_all
from clusterfl.records import FinalMetrics, RoundMetrics, RoundRecord, RunSummary
from clusterfl.robust.adversary import choose_adversaries, flip_labels, training_ids
from clusterfl.robust.config import delta_warnings, median_rule_warnings
from clusterfl.robust.guard import Guard
from clusterfl.rundir import RunDir, RunDirInUseError, claim_run_dir


def build_method(config: Config) -> Algorithm:
    """The run's method, given the run's data folder (a dataset of its own, FLT's encoder's,
    is read from the same folder) and the same checks of the files (`data.verify`)."""
    method: Algorithm = algorithm_class(config.algorithm.name)(config.algorithm)
    method.data_dir = config.data.data_dir
    method.data_verify = config.data.verify is not False
    return method


def build_federation(config: Config) -> Federation:
    if config.data.source not in SOURCE_NAMES:  # data of one's own (`clusterfl.data.own`)
        data = config.to_dict()["data"]
        return own.build(data, config.scenario_name, config.scenario.model_dump(),
                         config.run.seed, config.data.standardize)
    try:
        verify = config.data.verify is not False
        source: str | Source = config.data.source
        options = config.data.reader_options()
        if config.data.standardize or options:  # a source's options: cifar100, emnist
            source = load_source(config.data.source, config.data.data_dir, verify, **options)
            if config.data.standardize:
                source = standardize(source)
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
        RoundMetrics.check_key(key, "key")
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
        """`overwrite`: a run (without resume) into a non-empty `out_dir` removes the files of
        the run there first; without it, such a run raises `RunDirInUseError`
        (`rundir.claim_run_dir`). `callbacks`: trackers told of every round
        (`clusterfl.tracking`), besides those of `[output] callbacks` and `tensorboard`."""
        _check_arguments(config, out_dir, federation, overwrite, callbacks)
        self._given, self._given_dict = config, _settings(config)
        config = load_config(self._given_dict)  # fields set in Python are checked as loaded
        self.config = config if federation is None else _with_data_of(config, federation)
        config = self.config
        self._built = _settings(config)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.overwrite = overwrite
        full = federation if federation is not None else build_federation(config)
        self.algorithm: Algorithm = build_method(config)
        if config.model.name == "conv_ae":
            raise ConfigError("model.name", "'conv_ae' is FLT's autoencoder (it outputs an "
                              "image, not a prediction): no run trains it; FLT's encoder is "
                              "algorithm.encoder (`clusterfl encoder train`)")
        if full.task == "language_model" and config.model.name in MODELS \
                and config.model.name != "lstm":
            raise ConfigError("model.name", f"{config.model.name!r} reads real-valued inputs; "
                              "task 'language_model' has token ids: use 'lstm' (or a model "
                              "of one's own that embeds them)")
        if full.task != "language_model" and config.model.name == "lstm":
            raise ConfigError("model.name", f"'lstm' is a language model (next-token logits "
                              f"of token ids [N, T]); this federation's task is {full.task!r}: "
                              "use 'mlp', 'linear' or an image model (or task "
                              "'language_model')")
        if full.task == "language_model" and self.algorithm.needs_real_inputs:
            raise ConfigError("algorithm.name", f"{config.algorithm.name!r} clusters by "
                              f"{self.algorithm.needs_real_inputs}; task 'language_model' has "
                              "token ids: use fedavg, cfl, ifca, fesem, flhc, cfl_gp, ...")
        self.split = Holdout.split(config, self.algorithm, full)
        #: ids (in the whole federation) of the clients that train and of the held-out ones
        self.train_ids, self.holdout_ids = self.split.train_ids, self.split.ids
        self.adversaries = choose_adversaries(config.adversary, len(self.train_ids),
                                              config.run.seed, len(self.holdout_ids))
        if config.adversary.kind == "label_flip" and len(self.adversaries):
            full = flip_labels(full, self.train_ids[self.adversaries])
        self.full_federation = self.split.full = full
        """The whole federation: the backend's, which `train_ids` and `holdout_ids` index."""
        self.federation = full.subset(self.train_ids) if len(self.holdout_ids) else full
        """The clients that train, numbered 0..n−1 (all clients without `holdout`)."""
        _check_fault_clients(config, self.federation.n_clients, len(self.holdout_ids))
        fed = self.federation
        self.factory = ModelFactory(config.model, fed.input_shape, fed.n_outputs)
        #: what the method, its sampling and the backend will not do as their settings ask
        #: (said when the run starts)
        self.algorithm.fits(fed.n_clients, config.run.rounds)  # before any method runs
        self.method_warnings = [
            *self.algorithm.check(tuple(fed.input_shape), fed.n_clients, config.run.rounds),
            *config.backend.ignored_settings(),
            *(config.algorithm.sampling_warnings(fed.n_clients)
              if isinstance(config.algorithm, SampledConfig) else []),
            *([] if self._private() or config.privacy.clip is None else [
                f"[privacy] does not apply to {self.algorithm.label()}: it sends nothing to the "
                "server, so its training is neither clipped nor noised and no ε is reported"]),
            *([f"[privacy] noise = 'aggregate' does not give {self.algorithm.label()} the "
               "reported ε: it regroups the trained models by k-means, so its averages are "
               "not the groups the noise was shared over; use noise = 'local'"]
              if self._private() and config.privacy.noise_multiplier > 0
              and config.privacy.noise == "aggregate"
              and not config.algorithm.averages_noise_groups else []),
            *([f"[privacy] the reported ε covers the training replies only: "
               f"{self.algorithm.label()}'s clustering receives "
               f"{config.algorithm.unnoised_signatures}, neither clipped nor noised"]
              if self._private() and config.privacy.noise_multiplier > 0
              and config.algorithm.unnoised_signatures else []),
            *([f"[adversary] kind = {config.adversary.kind!r} reaches nobody under "
               f"{self.algorithm.label()}: it sends no update to the server, so the attackers "
               "only spoil their own models and no other client can be exposed"]
              if not config.algorithm.shares_updates
              and config.adversary.kind in ("sign_flip", "scale", "random") else []),
            *(delta_warnings(config.privacy, fed.n_clients) if self._private() else []),
            *median_rule_warnings(
                config.validation, fed.n_clients,
                *((config.algorithm.per_round_count(fed.n_clients),
                   config.algorithm.sampling_setting())
                  if isinstance(config.algorithm, SampledConfig) else ())),
            *self._never_partial(fed.n_clients)]
        self.holdout: dict[str, Any] | None = None
        """The held-out clients' placement after the run (`summary.json`'s `holdout`)."""
        self.recorder = Recorder(config, fed, self.algorithm, self.adversaries)
        self.checkpoints = Checkpoints(self.out_dir, self.full_federation)
        self.callbacks = self._callbacks(list(callbacks))
        self.name_in_warnings = False
        """Name the method in console warnings (`console_warning`; set by a comparison)."""

    @classmethod
    def from_config(
        cls, source: str | Path | dict[str, Any],
        overrides: str | list[str] | tuple[str, ...] | Mapping[str, Any] | None = (),
        out_dir: str | Path | None = None, federation: Federation | None = None,
        overwrite: bool = False, callbacks: list[Any] | tuple[Any, ...] = (),
    ) -> Experiment:
        if not isinstance(source, dict | str | Path):
            raise ConfigError("source", f"got {type(source).__name__}: give a TOML file's "
                              "path or a dict of tables")
        raw = source if isinstance(source, dict) else read_toml(source)
        if overrides is None or isinstance(overrides, Mapping):  # {"train.lr": 0.05}
            listed: list[str] | Mapping[str, Any] = overrides or {}
        elif isinstance(overrides, str):  # one "k=v"
            listed = [overrides]
        elif isinstance(overrides, list | tuple):
            listed = list(overrides)
        else:
            raise ConfigError("overrides", f"got {type(overrides).__name__}: give \"key=value\" "
                              "strings (['rounds=5', 'train.lr=0.05']) or a dict "
                              "({'rounds': 5, 'train.lr': 0.05})")
        return cls(load_config(apply_overrides(raw, listed)), out_dir, federation,
                   overwrite, callbacks)

    def _callbacks(self, given: list[Any]) -> list[Any]:
        """The given callbacks, then `[output] callbacks`, then TensorBoard when asked."""
        out = self.config.output
        for cb in given:
            tracking.check_callback(cb)
        _check_no_repeats(given, out.callbacks)
        made = [tracking.make_callback(ref, f"output.callbacks[{i}]")
                for i, ref in enumerate(out.callbacks)]
        board = []
        if out.tensorboard:
            if self.out_dir is None:
                raise ConfigError("output.tensorboard", "TensorBoard events go to the run "
                                                        "directory: give the run an out_dir")
            board = [tracking.TensorBoardCallback(self.out_dir / tracking.TENSORBOARD_DIR,
                                                  figures=self.config.output.figures)]
        if board and any(isinstance(cb, tracking.TensorBoardCallback) for cb in given):
            raise ConfigError("output.tensorboard", "a TensorBoardCallback is given as well: "
                                                    "two writers would log every round twice "
                                                    "into one folder; set one of them")
        return [*given, *made, *board]

    def saved_round(self) -> int | None:
        """The round the checkpoint file in `out_dir` holds (None: none there, or
        unreadable; `Checkpoints.saved_round`)."""
        return self.checkpoints.saved_round()

    # ------------------------------------------------------------------ the loop
    def _context(self, backend: Backend) -> Context:
        fed, run, c = self.federation, self.config.run, self.config
        rate = (c.algorithm.expected_fraction(fed.n_clients)  # for ε: fraction or per_round
                if isinstance(c.algorithm, SampledConfig) else 1.0)
        training, rng = c.train.local_training(), np.random.default_rng([run.seed, 7919])
        return Context(
            backend=backend, factory=self.factory, training=training, n_clients=fed.n_clients,
            train_sizes=fed.train_sizes, rng=rng, seed=run.seed, true_clusters=fed.clusters,
            rounds=run.rounds,
            guard=Guard(fed.n_clients, run.seed, fed.train_sizes, c.validation, c.faults,
                        c.adversary, c.privacy if self._private() else None,
                        self.adversaries, sampling_rate=rate),
        )

    def run(self, resume: bool = False, progress: bool | None = None) -> History:
        """Run all rounds (continuing from the checkpoint if `resume`), holding the run
        folder's lock."""
        check_flag("resume", resume)
        check_flag("progress", progress, none=PROGRESS_NONE)
        for now, then in ((self._given, self._given_dict), (self.config, self._built)):
            changed = _changed(then, _settings(now))
            if changed:
                raise ConfigError("config", f"{', '.join(changed)} changed after the Experiment "
                                  "was built, which has already used the old settings (its "
                                  "method, model and checks): build a new Experiment from the "
                                  "changed config")
        self.stage = "before round 1"
        try:
            return self._run(resume, progress)
        except ClusterFLError:
            raise
        except Exception as exc:  # a model or method of one's own: one line naming its line
            own = own_code_error(exc, self._own_code(), self.stage)
            if own is None:
                raise
            raise own from exc

    def _own_code(self) -> dict[str, Any]:
        """The run's model and method classes that come from outside clusterfl, by the config
        field that names them."""
        found = {"model.name": self.factory.module_class,
                 "algorithm.name": type(self.algorithm)}
        return {k: v for k, v in found.items()
                if not str(getattr(v, "__module__", "")).startswith("clusterfl.")}

    def _run(self, resume: bool, progress: bool | None) -> History:
        with RunDir(self.out_dir, lambda: self.checkpoints.round).claimed(
                resume, self.overwrite) as files:
            torch.manual_seed(self.config.run.seed)
            # a fresh record of this run: a second run() of this Experiment counted the
            # first one's rounds and kept its warnings (not shown again)
            self.recorder = Recorder(self.config, self.federation, self.algorithm,
                                     self.adversaries)
            inner = build_backend(self.config, self.full_federation, self.factory)
            held_out = len(self.holdout_ids) > 0
            ctx = self._context(SubsetBackend(inner, self.train_ids) if held_out else inner)
            self.algorithm.setup(ctx)
            history, start, elapsed = History(), 1, 0.0
            redone: RoundRecord | None = None  # a continued run's old last round
            if resume:
                start, elapsed, history.records, saved = self.checkpoints.load(
                    ctx, self.algorithm, self.config)
                self.recorder.load_state_dict(saved)
                redone = self.recorder.continued_last_round(
                    history.records, ctx, dict(saved["config"]).get("rounds"))
            resumed = self.checkpoints.resume_warnings if resume else []
            notes = [*self.checkpoints.resume_notes, self.checkpoints.finished_note(
                self.config, self.algorithm, held_out)] if resume else []
            for line in notes:
                if line is not None:
                    print(self.console_warning(line, "note"), file=sys.stderr, flush=True)
            resumed += self._edited_vocab() if resume else []
            for line in [*self.config.algorithm.ignored_settings(), *self.method_warnings,
                         *self._data_warnings(), *resumed]:
                print(self.console_warning(line), file=sys.stderr, flush=True)
                if line not in self.recorder.warnings:
                    self.recorder.warnings.append(line)
            files.start(dump_toml(self.config.to_dict()), history.records)
            words = self.full_federation.meta.get("vocab")
            if words is not None and self.out_dir is not None:  # a language model's
                vocab = self.out_dir / VOCAB_FILE
                try:
                    Vocab(tuple(words)).save(vocab)
                except OSError as exc:
                    raise write_error(exc, vocab, "the language model's vocabulary",
                                      files.kept()) from None
            boards = [c for c in self.callbacks if isinstance(c, tracking.TensorBoardCallback)]
            if redone is None and start > self.config.run.rounds and history.records:
                redone = history.records[-1]  # a finished run resumed: its figures come again
            if redone is not None:
                for board in boards:
                    board.purge_from = redone.round  # its events as the round now reads
            tracking.call(self.callbacks, "on_run_start", self.config.to_dict(), self.out_dir,
                          start=start)
            if redone is not None:
                for board in boards:
                    board.on_round_end(redone)
            try:
                self._loop(ctx, history, start, elapsed, files,
                           want_progress(progress, self.config.output.progress))
                if held_out:
                    self.stage = "placing the held-out clients"
                    self.holdout = self.place_holdout(inner)
                    for line in self.holdout.get("warnings", []):
                        self.recorder.warnings.append(line)
                        print(self.console_warning(line), file=sys.stderr, flush=True)
            finally:
                inner.close()
            stalled = self.recorder.stalled(history.records)
            if stalled is not None:
                self.recorder.warnings.append(stalled)
                print(self.console_warning(stalled), file=sys.stderr, flush=True)
            history.summary = self.recorder.summary(history.records, ctx, self.holdout)
            self._write_outputs(history, files)
            tracking.call(self.callbacks, "on_run_end", history.summary, self.out_dir)
        return history

    def _private(self) -> bool:
        """Whether `[privacy]` applies (`holdout.private`)."""
        return private(self.config)

    def console_warning(self, line: str, kind: str = "warning") -> str:
        """A warning (or another `kind` of line: a note) of this run as the console shows
        it; named after the method when `name_in_warnings` (a comparison's runs, whose
        warnings would otherwise not say which method they are about)."""
        named = f"{self.algorithm.label()}: " if self.name_in_warnings else ""
        return f"clusterfl: {kind}: {named}{line}"

    def _never_partial(self, n_clients: int) -> list[str]:
        """A line per option of the method that acts only in a round in which some of the
        clients asked did not answer (`partial_round_settings`), set in a run that asks every
        client every round with no `[faults]` that keeps one from answering, on a backend
        whose clients always answer: only a reply `[validation]` rejects makes such a round."""
        algo, faults = self.config.algorithm, self.config.faults
        options = algo.partial_round_settings()
        if not options or self.config.backend.name.startswith("flower") or faults.dropout > 0 \
                or faults.drop_clients or (faults.stragglers > 0 and faults.straggler_work == 0):
            return []
        everyone = ""
        if isinstance(algo, SampledConfig):
            if algo.per_round_count(n_clients) < n_clients:
                return []
            everyone = f" ({algo.sampling_setting()})"
        return [f"{o} does nothing here: it applies in a round in which some of the clients "
                f"asked do not answer, and this run asks all {n_clients} clients every round"
                f"{everyone} with no [faults] dropout, drop_clients or stragglers that miss "
                "the deadline (straggler_work = 0); only a reply that [validation] rejects "
                "would make such a round" for o in options]

    def _edited_vocab(self) -> list[str]:
        """A resumed run's `vocab.txt` that is not the vocabulary its data gives (a hand edit):
        it is written again, which is said (its models read the data's ids, not the file's)."""
        words = self.full_federation.meta.get("vocab")
        if words is None or self.out_dir is None:
            return []
        path = self.out_dir / VOCAB_FILE
        try:
            if not path.is_file() or path.read_bytes() == ("\n".join(words) + "\n").encode():
                return []
        except OSError:
            return []  # unreadable: the write that follows names the problem
        return [f"{path} is not the vocabulary the run's data gives (edited by hand?): it is "
                f"written again ({len(words)} words); the run's models use the data's "
                "vocabulary, not the edited file (to use another vocabulary, start a new run "
                "with scenario.vocab_file)"]

    def _data_warnings(self) -> list[str]:
        """What the run's data leaves out, said before round 1 (the run goes on)."""
        out = []
        seed = self.full_federation.meta.get("seed")
        if "data" not in self.full_federation.meta and isinstance(seed, int) and \
                seed != self.config.run.seed:
            out.append(f"the federation given was made with seed {seed} and the run's seed is "
                       f"{self.config.run.seed}: config.toml rebuilds the data with seed "
                       f"{self.config.run.seed}, not this federation (make it with the run's "
                       "seed, or set seed in the config)")
        unused = self.config.run.eval_clients_unused(self.federation.n_clients)
        if unused:
            out.append(unused)
        words, scen = self.full_federation.meta.get("vocab"), self.config.scenario
        if words is not None and isinstance(scen, TopicsParams) and scen.vocab_file and \
                "vocab_size" in scen.model_fields_set and len(words) > scen.vocab_size:
            out.append(f"scenario.vocab_size = {scen.vocab_size} does nothing here: "
                       f"scenario.vocab_file ({scen.vocab_file}) gives the vocabulary, "
                       f"{len(words)} words (<unk> and <eos> included)")
        elif words is not None and isinstance(scen, TopicsParams) and not scen.vocab_file and \
                scen.vocab_size != TopicsParams.model_fields["vocab_size"].default and \
                len(words) < scen.vocab_size:  # the cap binds nowhere: every word is kept
            out.append(f"scenario.vocab_size = {scen.vocab_size} does nothing here: the "
                       f"clients' training articles have only {len(words) - 2} distinct "
                       f"words, all kept ({len(words)} entries with <unk> and <eos>)")
        if words is not None:
            vocabulary = (f"the vocabulary ({len(words)} entries)" if not isinstance(
                scen, TopicsParams) else f"scenario.vocab_file's vocabulary ({len(words)} "
                "entries)" if scen.vocab_file else f"scenario.vocab_size = {scen.vocab_size}")
            out += token_warnings(self.full_federation, vocabulary)
        # the number holds for no client: said, not silently clamped; a strategy's server
        # judges only the sizes it knows before round 1 (given in its train_sizes)
        known = self.federation.known_train_sizes
        if len(known):
            batch, largest = self.config.train.batch_size, int(known.max())
            if batch > largest:
                out.append(f"train.batch_size = {batch} is more than any client's training "
                           f"samples (at most {largest}): every local step takes all of a "
                           f"client's samples (full-batch steps, as batch_size = {largest})")
            out += [f"algorithm.{name} = {value} is more than any client's training samples "
                    f"(at most {largest}): {does}"
                    for name, (value, does) in self.config.algorithm.sample_counts().items()
                    if value > largest]
        empty = np.flatnonzero(self.full_federation.test_sizes == 0).tolist()
        if empty:
            more = f" and {len(empty) - 5} more" if len(empty) > 5 else ""
            out.append(f"{len(empty)} client(s) have no test samples ({empty[:5]}{more}): the "
                       "test metrics leave them out (their accuracy is null in history.jsonl)")
        return out

    def _loop(self, ctx: Context, history: History, start: int, elapsed: float,
              files: RunDir, show: bool) -> None:
        run = self.config.run
        t0 = time.perf_counter() - elapsed
        evaluated = next((r for r in reversed(history.records) if r.metrics is not None), None)
        with Progress(show, run.rounds, start - 1, self.algorithm.label(), evaluated) as bar:
            for t in range(start, run.rounds + 1):
                self.stage = f"in round {t}"
                if ctx.guard is not None:
                    ctx.guard.begin_round(t)
                ctx.participants.clear()
                extras = self.algorithm.run_round(ctx, t).to_dict()
                warning = self.recorder.watch(t, ctx)
                if warning:
                    bar.warn(self.console_warning(warning))
                evaluate = t % run.eval_every == 0 or t == run.rounds
                record = self.recorder.record(ctx, t, extras, evaluate,
                                              time.perf_counter() - t0)
                for line in self.recorder.pending:
                    bar.warn(self.console_warning(line))
                history.records.append(record)
                files.append(record)
                tracking.call(self.callbacks, "on_round_end", record)
                bar.update(record)
                every = run.checkpoint_every
                if every and (t % every == 0 or t == run.rounds):  # the last: to place, continue
                    self.checkpoints.save(t, time.perf_counter() - t0, ctx, self.algorithm,
                                          self.config, history.records,
                                          self.recorder.state_dict())

    def placing_context(self, backend: Backend, ids: np.ndarray | list[int]) -> Context:
        """The context a placement runs in (`holdout.Holdout.context`): clients `ids` of the
        whole federation (held by `backend`) as 0..n−1."""
        return self.split.context(self.factory, backend, ids)

    def place_holdout(self, backend: Backend) -> dict[str, Any]:
        """Place the held-out clients with the trained algorithm and evaluate them on the
        models they were placed on (`holdout.Holdout.place`); `backend` holds the whole
        federation."""
        return self.split.place(self.algorithm, self.factory, backend)

    def _write_outputs(self, history: History, files: RunDir) -> None:
        if self.out_dir is None:
            return
        try:
            self.algorithm.save_artifacts(self.out_dir, self.config.run.rounds)
        except OSError as exc:
            raise write_error(exc, Path(exc.filename or self.out_dir), "the method's own file, "
                              "after the last round", files.kept()) from None
        files.write_summary(history.summary)
        if self.config.output.figures:
            from clusterfl.report import write_run_report

            write_run_report(self.out_dir)
        elif (self.out_dir / "report.md").is_file():  # a resumed run, its figures now off
            print(self.console_warning(
                f"{self.out_dir / 'report.md'} and figures/ are those of this run's earlier "
                "part, not updated (output.figures = false now); `clusterfl report "
                f"{self.out_dir}` writes them for all its rounds"), file=sys.stderr, flush=True)


def _with_data_of(config: Config, federation: Federation) -> Config:
    """The config of a run given `federation`, recording the federation's data, so that the
    run directory says what data it was: its `[data]` (`meta["data"]`, set by
    `Federation.from_clients` and the loaders of `clusterfl.data.own`; for a federation of
    `make_federation`, its source) and its scenario (`given` for per-client data; a
    built-in scenario with its options).

    A config without a `[data]` or `[scenario]` table of its own takes the federation's; one
    that names other data or another scenario is refused (the run would record one thing
    and train on another).
    """
    meta = federation.meta
    given = meta.get("data")
    if not isinstance(given, dict):  # make_federation's: a built-in source and scenario
        if meta.get("source") not in SOURCE_NAMES or not isinstance(meta.get("scenario"), str):
            return config  # a Source of one's own, loaded in Python: nothing to name
        given = {"source": meta["source"]}
    now = config.to_dict()
    if "data" in meta and data_table(given) == now["data"]:
        return config  # the federation of this very config (a comparison's, a loader's)
    if now["data"].get("source") == given.get("source") and "data" not in meta:
        given = now["data"]  # the same source: the config's reader options, data_dir ...
    if data_table(given) != now["data"] and now["data"] != data_table({}):
        raise ConfigError("data", f"the config's [data] {now['data']} is not the data of the "
                                  f"federation given ({data_table(given)}); leave [data] out "
                                  "of the config (the federation's own is recorded) or make "
                                  "them agree")
    if own.is_per_client(str(given.get("source"))) is False and "scenario" in meta:
        params = {k: v for k, v in dict(meta.get("params") or {}).items() if v is not None}
        scenario = {"name": meta["scenario"], **params}
    else:
        scenario = {"name": own.GIVEN}
    made = load_config({**now, "data": given, "scenario": scenario})
    theirs, ours = made.to_dict()["scenario"], now["scenario"]
    if all(theirs.get(k) == v for k, v in ours.items()) and given == now["data"]:
        return config  # the config says how it was made (the federation adds derived keys)
    default = load_config({k: v for k, v in now.items() if k != "scenario"})  # none given
    if theirs != ours and ours != default.to_dict()["scenario"]:
        raise ConfigError("scenario", f"the config's [scenario] {ours} is not how the "
                          f"federation given was made ({theirs}); leave [scenario] out of the "
                          "config (the federation's is recorded) or make them agree"
                          + ("; per-client data keeps its clients as they are (scenario "
                             "'given', without holdout)" if scenario["name"] == own.GIVEN
                             else ""))
    return made


def _settings(config: Config) -> dict[str, Any]:
    """`config.to_dict()`, quietly: a field set in Python to a value of another type makes
    pydantic warn while dumping it; `load_config` then names the field."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config.to_dict()


def _changed(before: Mapping[str, Any], after: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two config dicts."""
    out = []
    for key in sorted({*before, *after}, key=str):
        a, b = before.get(key), after.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += _changed(a, b, f"{prefix}{key}.")
        elif a != b or type(a) is not type(b):
            out.append(f"{prefix}{key}")
    return out


def _check_fault_clients(config: Config, n_clients: int, held_out: int) -> None:
    bad = [c for c in config.faults.drop_clients if c >= n_clients]
    if bad:
        raise ConfigError("faults.drop_clients", f"ids {bad} do not exist; the federation has "
                          f"clients 0..{n_clients - 1}{training_ids(held_out)}")
    if len(set(config.faults.drop_clients)) >= n_clients:
        when = (f"in rounds {config.faults.drop_rounds}" if config.faults.drop_rounds else
                "in every round")
        if not config.faults.drop_rounds or set(range(1, config.run.rounds + 1)) <= set(
                config.faults.drop_rounds):
            raise ConfigError("faults.drop_clients", f"all {n_clients} clients drop out "
                              f"{when}: no round would train; allowed: fewer clients, or "
                              "faults.drop_rounds naming some rounds")



PROGRESS_NONE = "the config's output.progress"
"""What `progress=None` means, in the line that refuses another value."""


def _check_no_repeats(given: list[Any], refs: list[str]) -> None:
    """The same callback object, or import path, listed twice would see every round twice
    (each event logged twice); refused, naming the second one."""
    for i, cb in enumerate(given):
        if any(cb is other for other in given[:i]):
            raise ConfigError(f"callbacks[{i}]", f"the same {type(cb).__name__} object is "
                                                 "listed twice; list each callback once")
    for i, ref in enumerate(refs):
        if ref in refs[:i]:
            raise ConfigError(f"output.callbacks[{i}]", f"{ref!r} is listed twice; list each "
                                                        "callback once")


def _check_arguments(config: Any, out_dir: Any, federation: Any, overwrite: Any,
                     callbacks: Any) -> None:
    """`Experiment`'s arguments are of the kinds it takes, or one line naming the argument."""
    if not isinstance(config, Config):
        raise ConfigError("config", f"got {type(config).__name__}: give a Config "
                          "(clusterfl.config.load_config), or build the run from a TOML file "
                          "or a dict with Experiment.from_config")
    if out_dir is not None and not isinstance(out_dir, str | os.PathLike):
        raise ConfigError("out_dir", f"got {type(out_dir).__name__}: give a folder's path "
                          "(str or Path), or None to write no files")
    if federation is not None and not isinstance(federation, Federation):
        raise ConfigError("federation", f"got {type(federation).__name__}: give a Federation "
                          "(Federation.from_clients turns arrays or torch Datasets into one)")
    check_flag("overwrite", overwrite)
    if not isinstance(callbacks, list | tuple):
        raise ConfigError("callbacks", f"got {type(callbacks).__name__}: give a list of "
                          "callbacks ([MyTracker()])")

__all__ = [
    "CHECKPOINT",
    "Experiment",
    "History",
    "RunDirInUseError",
    "build_backend",
    "build_federation",
    "claim_run_dir",
    "evaluate_all",
]
