"""CFL: Clustered Federated Learning (Sattler, Müller, Samek, IEEE TNNLS 32(8), 2020).

Implements Algorithm 5 (CFL with weight updates and optional privacy permutation P), with the
split test of Algorithm 3 and the parameter tree of Section IV-C / Algorithm 4:

- every round all clients train from their cluster's model (Alg. 5 lines 5-8, eq. (1));
  the server averages their updates Δθ_i per cluster (weighted by |D_i|, eq. (2), by
  default; unweighted, Alg. 5 line 13 and the authors' code, with `aggregation = "mean"`);
- a cluster is split when its split rule says so (Alg. 5 lines 14-18,
  `clusterfl.clustering.split_rule`): its clients are bipartitioned on the cosine similarity
  of their updates (eq. (40); Alg. 1, `clusterfl.clustering.cosine`). With
  `split_rule = "epsilon"` this is the paper's test, ‖Δθ_c‖ < ε1 (eq. (30)) and
  max_i ‖Δθ_i‖ > ε2 (eq. (31)), and the split is accepted only if
  sqrt((1 − α_cross^max)/2) > γ_max (eq. (36), Alg. 5 line 18);
- the parameter tree (Section IV-C; `clusterfl.algorithms.cfl_tree`) keeps for every
  cluster ever formed its clients, its model (frozen when it splits: θ*_v) and on the edge
  from its parent its clients' pre-split updates Δ_e (eq. (43)); `CFL.walk` (`placement`,
  `place`) walks new clients down it (Algorithm 4);
- privacy (Section IV-B, eq. (41)-(42), Alg. 5 lines 3, 7, 8): with `privacy = true` the
  clients permute their updates with a permutation P the server never learns (`ClientSide`);
  cosines and norms, hence the clustering, are unchanged. The server keeps every model as
  D_c = P(θ_c − θ_0), its displacement from the public initial model θ_0; clients rebuild
  θ_c = θ_0 + P⁻¹ D_c (with P = identity, plain FL).

A round, as ask → update: the sample (first phase), Algorithm 4 for sampled clients that
missed their cluster's split ("walk", an inner node a message), the training of every sampled
client in a leaf ("train": its update tests and splits), with `keep_best` a loss query per
leaf ("best").

Where the paper leaves a choice open, or the authors' code differs, we do:

- The split rule. The paper gives no ε1, ε2, only ε1 ≈ max_t ‖Δθ_c‖ / 10, ε2 ∈ [ε1, 10 ε1]
  (Section V-B); 0.4 and 1.6 are the authors' code's. The default, `split_rule = "auto"`, is
  ours: the paper's quantities without a scale-dependent threshold (its conditions and their
  evidence: the table of `clusterfl.clustering.split_rule`; its history: docs/cfl.md).
- Client sampling (`fraction` or `per_round`; Alg. 5 trains every client every round):
  clients not sampled are absent from the round (below). `fraction = 1` (default) draws none.
- γ_max = 0 by default (the paper leaves it open; the authors' code has no γ test).
- `warmup_rounds` = 0, `min_split_size` = 2 (Alg. 5 has neither; the authors' code: 20, 3).
- `bipartition = "optimal"` (Alg. 1, the paper) or `"complete"` (complete linkage, the code).
- `lr_decay` (default 1, none): the code's is 0.99 a round. The code also keeps each
  client's momentum buffer across rounds: not offered (no client optimiser state persists).
- When a cluster splits, each new cluster applies its own members' mean update to the
  parent's model (the authors' code; Alg. 5 does not say); these are the updates cached on
  the new edges, from the parent's model, as eq. (43) asks.
- `keep_best` (Section II-B, "CFL never does worse than FL"): each client predicts with the
  model of its tree path (root … leaf) most accurate on its `"train"` or `"test"` data (the
  protocol has no validation split; "test" is optimistic).
- A cluster of one client is never split; a zero update has similarity 0 to all others.
- Clients absent from a round (not sampled, dropped out, rejected by `clusterfl.robust`)
  are left out of its averages and split test. One absent when its cluster splits waits at
  that inner node (predicting with its frozen model) until Algorithm 4 places it, in the
  next round it answers, before it trains.
- All the server keeps is one `CFLState` (checkpoints, `cfl_tree.pt`).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal, cast

import numpy as np
import torch
from pydantic import Field, ValidationInfo, field_validator, model_validator

from clusterfl.algorithms.base import FIRST, Algorithm, Ask, Context, Update
from clusterfl.algorithms.cfl_records import CFLExtras
from clusterfl.algorithms.cfl_tree import (
    ClientSide,
    DeviceStorage,
    ParameterTree,
    TreeNode,
    TreeWalk,
    Walk,
)
from clusterfl.algorithms.common import (
    Placement,
    SampledConfig,
    check_warmup_leaves_rounds,
    too_few_per_round,
)
from clusterfl.clustering.aggregate import weighted_mean
from clusterfl.clustering.cosine import SHUFFLE_FLOOR_EXACT, separation_gap, shuffle_floor
from clusterfl.clustering.split_rule import (
    AutoRule,
    AutoRuleConfig,
    CFLSplitEvent,
    ClusterView,
    Decision,
    EpsilonRule,
    Refusal,
    RuleState,
    SplitRule,
    apart,
    finite,
)
from clusterfl.config_util import changed_fields
from clusterfl.errors import ConfigError
from clusterfl.files import write_whole
from clusterfl.protocol import (
    LocalTraining,
    LossReply,
    Predictor,
    TrainReply,
    TrainRequest,
    mean_finite,
)

TREE_FILE = "cfl_tree.pt"
"""Name of the file `CFL.save_artifacts` writes into a run directory (read by `place`)."""

#: the auto rule's options, once flat in `[algorithm]` (still read there: `CFLConfig`)
AUTO_OPTIONS = tuple(AutoRuleConfig.model_fields)


class CFLConfig(SampledConfig):
    """Settings of CFL (Sattler et al. 2020, Algorithm 5). Defaults: see the module docstring."""

    name: Literal["cfl"] = "cfl"
    display: ClassVar[str] = "CFL"
    split_rule: Literal["auto", "epsilon"] = Field(
        "auto", description="'auto': our scale-free rule (options in [algorithm.auto]); "
        "'epsilon': the paper's eqs. 30-31 with eps1, eps2. Setting eps1 or eps2 without "
        "split_rule selects 'epsilon'")
    eps1: float = Field(
        0.4, gt=0.0, description="epsilon rule: split only if the cluster's mean update norm "
        "is below ε1 (eq. 30; authors' code 0.4, the paper gives no number)")
    eps2: float = Field(
        1.6, gt=0.0, description="epsilon rule: ... and the largest client update norm "
        "exceeds ε2 (eq. 31; authors' code 1.6, the paper gives no number)")
    auto: AutoRuleConfig = Field(
        default_factory=AutoRuleConfig, description="the auto rule's options "
        "(`[algorithm.auto]`; `clusterfl.clustering.split_rule.AutoRuleConfig`)")
    gamma_max: float = Field(
        0.0, ge=0.0, lt=1.0, description="accept a bipartition only if "
        "sqrt((1 - α_cross_max)/2) > γ_max (eq. 36; 0 = accept all, like the authors' code)")
    bipartition: Literal["optimal", "complete"] = Field(
        "optimal", description="'optimal': Algorithm 1 (paper); 'complete': complete-linkage "
        "clustering (authors' code)")
    aggregation: Literal["weighted", "mean"] = Field(
        "weighted", description="'weighted' by client data size (eq. 2, paper); 'mean' "
        "unweighted (Alg. 5 line 13, authors' code)")
    warmup_rounds: int = Field(
        0, ge=0, description="no split in rounds t <= warmup_rounds (authors' code: 20)")
    min_split_size: int = Field(
        2, ge=2, description="only clusters with at least this many clients answering in "
        "the round split (all of them without sampling; authors' code: 3)")
    privacy: bool = Field(
        False, description="clients permute their updates with a secret shared permutation P "
        "(Alg. 5); the server never sees an unpermuted update")
    keep_best: Literal["off", "train", "test"] = Field(
        "off", description="each client predicts with the best model on its tree path, judged "
        "on its 'train' or 'test' data (Section II-B); 'off' = its leaf model")
    lr_decay: float = Field(
        1.0, gt=0.0, le=1.0, description="local learning rate × lr_decay^(t-1) in round t "
        "(authors' code: 0.99)")

    @model_validator(mode="before")
    @classmethod
    def _read_older_layouts(cls, data: Any) -> Any:
        """Auto-rule options flat in `[algorithm]` (old configs) or as `auto.<option>` (specs)
        move into `[algorithm.auto]`; eps1/eps2 alone select "epsilon" (beside "auto": an error,
        `_eps_of_the_epsilon_rule`)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        moved = {k: data.pop(k) for k in AUTO_OPTIONS if k in data}
        moved.update({k[len("auto."):]: data.pop(k) for k in list(data)
                      if isinstance(k, str) and k.startswith("auto.")})
        table = data.get("auto") or {}
        table = table.model_dump() if isinstance(table, AutoRuleConfig) else table
        if moved and isinstance(table, dict):
            data["auto"] = {**table, **moved}
        if {"eps1", "eps2"} & set(data) and "split_rule" not in data:  # select "epsilon"
            return {**data, "split_rule": "epsilon"}
        return data

    @field_validator("eps1", "eps2")
    @classmethod
    def _eps_of_the_epsilon_rule(cls, value: float, info: ValidationInfo) -> float:
        """A non-default eps1/eps2 beside split_rule = "auto": an error naming the field (it
        named the whole [algorithm] table, with every value in it)."""
        if info.data.get("split_rule") == "auto" and \
                value != cls.model_fields[str(info.field_name)].default:
            raise ValueError("applies to split_rule = 'epsilon' only; drop it or set "
                             "split_rule = 'epsilon'")
        return value

    def ignored_settings(self) -> list[str]:
        if self.split_rule == "epsilon":
            return [f"algorithm.auto.{o} = {getattr(self.auto, o)!r} does nothing: split_rule "
                    "= 'epsilon' reads no [algorithm.auto] option"
                    for o in changed_fields(self.auto)]
        return self.auto.switched_off() + self.auto.too_few_draws()

    def partial_round_settings(self) -> list[str]:
        """The auto rule's options of a round in which some of a cluster's clients did not
        answer, where set (the shuffle test on: with it off `ignored_settings` names them)."""
        if self.split_rule != "auto" or self.auto.significance == 0:
            return []
        return [f"algorithm.auto.{o} = {getattr(self.auto, o)!r}"
                for o in changed_fields(self.auto, "significance_sampled", "sampled_evidence")]


@dataclass
class RoundWork:
    """What a round has done so far, between its phases (None in `CFLState` between rounds,
    so never in a checkpoint)."""

    sample: np.ndarray  # the round's clients
    seed: int  # the run's seed (with round and node it seeds the auto rule's shuffles)
    truth: np.ndarray | None  # the true clusters (the separation gap only: a diagnostic)
    walk: Walk | None = None  # Algorithm 4 for the sampled clients that missed a split
    placed: list[int] = field(default_factory=list)  # those the walk put into a leaf
    extras: CFLExtras | None = None  # the round's extras, once trained
    best: list[int] = field(default_factory=list)  # keep_best: leaves still to ask


@dataclass
class CFLState:
    """Everything the CFL server keeps to continue a run (and `place` to place clients)."""

    n_clients: int
    tree: ParameterTree
    devices: DeviceStorage  # held for the simulated devices: only `ClientSide` reads it
    #: client absent at its cluster's split → the inner node it waits at
    pending: dict[int, int] = field(default_factory=dict)
    choice: np.ndarray | None = None  # keep_best: each client's node (None: leaf/pending)
    rule: RuleState = field(default_factory=RuleState)  # the split rule's state
    round: RoundWork | None = None


#: the phases of a round after the first (module docstring)
WALK, TRAIN, BEST = "walk", "train", "best"


class CFL(Algorithm[CFLConfig, CFLState]):
    """Clustered FL: FedAvg per cluster, recursive bipartitioning at stationary points."""

    name = "cfl"
    Config = CFLConfig
    State = CFLState
    #: the updates, their cosine similarities and the cluster means where the backend left
    #: the models; only the [n, n] similarities come to the CPU (for the bipartition)
    device_update = True

    _devices: ClientSide | None = None

    def setup(self, ctx: Context) -> None:
        self._n_outputs = ctx.factory.n_outputs  # the auto rule's progress reference, ln C
        base = ctx.factory.init(ctx.seed)
        self.state = CFLState(
            ctx.n_clients, ParameterTree.new(ctx.n_clients, torch.zeros_like(base)),
            DeviceStorage(base, self.config.privacy, ctx.next_seed()))

    def check(self, input_shape: tuple[int, ...], n_clients: int, rounds: int) -> list[str]:
        cfg = self.config
        check_warmup_leaves_rounds(cfg.warmup_rounds, rounds, "FedAvg")
        if cfg.min_split_size > n_clients:
            raise ConfigError("algorithm.min_split_size", f"no cluster of the {n_clients} "
                              f"clients could split; allowed: 2..{n_clients}")
        sides = 2 * cfg.auto.min_side if cfg.split_rule == "auto" else 2
        first = cfg.warmup_rounds + cfg.auto.patience  # the auto rule's earliest split
        short = [f"rounds = {rounds}: the auto rule splits a cluster after "
                 f"algorithm.auto.patience = {cfg.auto.patience} consecutive rounds (after "
                 f"{cfg.warmup_rounds} warm-up rounds), in round {first} at the earliest: the "
                 f"run will never split (it is FedAvg); allowed: rounds >= {first}"
                 ] if cfg.split_rule == "auto" and rounds < first else []
        few = too_few_per_round(
            cfg, n_clients, max(sides, cfg.min_split_size),
            f"algorithm.auto.min_side = {cfg.auto.min_side}" if sides > 2 else "",
            f"1..{n_clients // 2}")
        return short + (few or self._root_too_small(n_clients))

    def _root_too_small(self, n_clients: int) -> list[str]:
        """The warning when the clients answering a round are too few for the root's shuffle
        test ever to pass (`AutoRuleConfig.hopeless`): the run would be FedAvg, unsaid."""
        cfg, k = self.config, self.config.per_round_count(n_clients)
        sampled = k < n_clients
        hopeless = cfg.auto.hopeless(k, sampled) if cfg.split_rule == "auto" and k > 2 else None
        if hopeless is None:
            return []
        floor, level = hopeless
        need = next((m for m in range(k + 1, SHUFFLE_FLOOR_EXACT)
                     if cfg.auto.hopeless(m, sampled) is None), k + 1)
        name = "significance_sampled" if sampled else "significance"
        together = f", Fisher's combination of {cfg.auto.patience} such rounds at least " \
            f"{floor:.3g}" if sampled and cfg.auto.sampled_evidence == "combined" else ""
        return [f"algorithm.auto.{name} = {level:g}: the shuffle test of the {k} clients that "
                f"answer a round has an exact p-value of at least {shuffle_floor(k):.3g} "
                f"whatever their updates{together}, so the root never passes it: the run will "
                f"not split (it is FedAvg); allowed: {name} above {floor:.3g}, or at least "
                f"{need} clients a round"]

    def migrate_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint written before the split rule had its own state (the auto rule's
        `streak`, `candidate`, `last_mean`, `peak`, `first_loss` in `CFLState`)."""
        if "streak" in state:
            state = dict(state)
            old = {k: state.pop(k) for k in ("streak", "candidate", "last_mean", "peak",
                                             "first_loss")}
            nodes = set(old["streak"]) | set(old["candidate"]) | set(old["last_mean"])
            state["rule"] = {"first_loss": old["first_loss"], "peak": old["peak"], "nodes": {
                v: {"streak": old["streak"].get(v, 0), "candidate": old["candidate"].get(v),
                    "last_mean": old["last_mean"].get(v)} for v in nodes}}
        return state

    @property
    def tree(self) -> ParameterTree:
        return self.state.tree

    @property
    def clients(self) -> ClientSide:
        """The simulated devices, rebuilt from `state.devices` (after `setup` or a load)."""
        devices = self._devices
        if devices is None or devices.storage is not self.state.devices:
            devices = self._devices = ClientSide(self.state.devices)
        return devices

    def split_rule(self, seed: int) -> SplitRule:
        """The configured split rule (`seed`: the run's, for the auto rule's shuffles)."""
        c = self.config
        if c.split_rule == "epsilon":
            return EpsilonRule(eps1=c.eps1, eps2=c.eps2, gamma_max=c.gamma_max,
                               warmup_rounds=c.warmup_rounds, min_split_size=c.min_split_size)
        return AutoRule(options=c.auto, seed=seed, gamma_max=c.gamma_max, n_outputs=self._n_outputs,
                        warmup_rounds=c.warmup_rounds, min_split_size=c.min_split_size)

    def _training(self, ctx: Context, t: int) -> LocalTraining:
        if self.config.lr_decay == 1.0:
            return ctx.training
        return replace(ctx.training, lr=ctx.training.lr * self.config.lr_decay ** (t - 1))

    def _walk_request(self, ctx: Context, tree: ParameterTree, walk: Walk,
                      node: int) -> TrainRequest:
        """Algorithm 4 at inner node `node`: the clients there train from θ*_node, at the
        learning rate of the round it split."""
        rows, v = walk.rows(node), tree.nodes[node]
        return self.clients.train_request(walk.clients[rows], v.model[None],
                                          np.zeros(len(rows), np.int64),
                                          self._training(ctx, v.split_round or 1), ctx.next_seed())

    def _weights(self, n_samples: np.ndarray) -> np.ndarray:
        if self.config.aggregation == "mean":
            return np.ones(len(n_samples))
        return np.asarray(n_samples, dtype=np.float64)

    # ------------------------------------------------------------------ ask
    def ask(self, state: CFLState, t: int, phase: str, ctx: Context
            ) -> Ask[Any] | Update[CFLState]:
        """FIRST: the round's sample (no message). WALK: one inner node of Algorithm 4 for
        the sampled clients waiting in the tree. TRAIN: every sampled client in a leaf trains
        from its cluster's model. BEST: the models of one leaf's path, scored by its sampled
        clients (keep_best)."""
        work = state.round
        if phase == FIRST:
            sample = ctx.sample_round(self.config)  # every client, with no draw, by default
            work = RoundWork(sample, int(ctx.seed), ctx.true_clusters)
            waiting = np.array(sorted(set(state.pending) & set(sample.tolist())), np.int64)
            if len(waiting):
                work.walk = Walk.start(waiting, np.array([state.pending[int(c)]
                                                          for c in waiting]))
            return self._walked(replace(state, round=work))
        assert work is not None
        tree = state.tree
        if phase == WALK:
            assert work.walk is not None
            node, _ = cast(tuple[int, list[int]], work.walk.next(tree))
            return Ask(self._walk_request(ctx, tree, work.walk, node), WALK)
        if phase == TRAIN:
            leaves = tree.leaves()
            row = {v.id: k for k, v in enumerate(leaves)}
            leaf_of = tree.leaf_of_clients(state.n_clients)
            clients = np.intersect1d(np.flatnonzero(leaf_of >= 0), work.sample)
            models = torch.stack([v.model for v in leaves])
            return Ask(self.clients.train_request(
                clients, models, np.array([row[int(v)] for v in leaf_of[clients]]),
                self._training(ctx, t), ctx.next_seed()), TRAIN)
        leaf = tree.nodes[work.best[0]]
        models = torch.stack([tree.nodes[v].model for v in tree.path(leaf.id)])
        judge = cast(Literal["train", "test"], self.config.keep_best)
        return Ask(self.clients.loss_request(np.intersect1d(leaf.clients, work.sample), models,
                                             judge), BEST)

    # ------------------------------------------------------------------ update
    def update(self, state: CFLState, t: int, ask: Ask[Any], reply: Any) -> Update[CFLState]:
        work = state.round
        assert work is not None
        if ask.phase == WALK:
            assert work.walk is not None
            node, rest = cast(tuple[int, list[int]], work.walk.next(state.tree))
            request = cast(TrainRequest, ask.request)
            walk = work.walk.advance(state.tree, node, rest, work.walk.rows(node),
                                     self.clients.uploads(request, reply), reply.clients)
            return self._walked(replace(state, round=replace(work, walk=walk)))
        if ask.phase == TRAIN:
            return self._trained(state, t, cast(TrainRequest, ask.request), reply)
        return self._scored(state, cast(LossReply, reply))

    def _walked(self, state: CFLState) -> Update[CFLState]:
        """Go on walking, or (the walk over, or none) put the clients that reached a leaf into
        it (the others wait where they stopped) and train."""
        work = state.round
        assert work is not None
        if work.walk is None:
            return Update(state, then=TRAIN)
        if work.walk.next(state.tree) is not None:
            return Update(state, then=WALK)
        tree, pending, placed = state.tree.copy(), dict(state.pending), []
        for p in work.walk.result():
            node = tree.nodes[p.leaf]
            if node.is_leaf:
                node.clients = np.sort(np.append(node.clients, p.client))
                del pending[p.client]
                placed.append(p.client)
            else:
                pending[p.client] = p.leaf
        work = replace(work, walk=None, placed=placed)
        return Update(replace(state, tree=tree, pending=pending, round=work), then=TRAIN)

    def _trained(self, state: CFLState, t: int, request: TrainRequest,
                 reply: TrainReply) -> Update[CFLState]:
        """Alg. 5 lines 9-18: average per cluster, test every cluster against the split rule,
        split those it accepts (the tree, a copy, grows two children per split)."""
        work = state.round
        assert work is not None
        got = self.clients.uploads(request, reply)
        n, who = state.n_clients, reply.clients
        # `present` marks who answered (absent: dropped or rejected); `row` the row of `got`
        # of each client id that did (no [n_clients, d] table: a round costs its replies)
        row = np.full(n, -1, dtype=np.int64)
        row[who] = np.arange(len(who))
        n_samples, losses = np.zeros(n), np.full(n, np.nan)
        n_samples[who], losses[who] = reply.n_samples, reply.loss
        present = np.zeros(n, dtype=bool)
        present[who] = True
        tree = state.tree.copy()
        leaves = tree.leaves()
        views = [self._view(v, got, row, n_samples, present, losses) for v in leaves]
        rule = self.split_rule(work.seed)
        rule_state, views = rule.observe(state.rule, mean_finite(reply.loss), views)
        decisions = [rule.decide(v, rule_state, t) for v in views]
        nodes, pending = dict(rule_state.nodes), dict(state.pending)
        events: list[CFLSplitEvent] = []
        for v, d in zip(views, decisions):
            node = tree.nodes[v.node]
            if d.node is not None:
                nodes[v.node] = d.node
            if d.event is not None and d.event["accepted"]:
                events.append(self._split(tree, node, v, d.event, t))
                nodes.pop(v.node, None)
                for c in np.setdiff1d(node.clients, v.members):  # Alg. 4 when they answer
                    pending[int(c)] = node.id
            else:
                node.model = node.model + v.mean
                if d.event is not None:
                    events.append(d.event)
        truth = work.truth
        gaps = [None if v.similarity is None or truth is None else
                separation_gap(v.similarity, np.asarray(truth)[v.members]) for v in views]
        extras = self._extras(views, gaps, decisions, events, tree, reply.loss, work.placed,
                              pending)
        state = replace(state, tree=tree, pending=pending,
                        rule=replace(rule_state, nodes=nodes),
                        round=replace(work, extras=extras))
        return self._choose_best(state)

    def _view(self, node: TreeNode, got: torch.Tensor, row: np.ndarray, n_samples: np.ndarray,
              present: np.ndarray, losses: np.ndarray) -> ClusterView:
        """The split rule's view of `node`: its members that answered, with their updates
        (`got`, client id → row of `got` in `row`)."""
        members = node.clients[present[node.clients]]
        own = got[torch.as_tensor(row[members], dtype=torch.long, device=got.device)]
        weights = self._weights(n_samples[members]) if len(members) else np.zeros(0)
        loss = mean_finite(losses[members])
        return ClusterView.measure(node.id, len(node.clients), members, own, weights,
                                   self.config.bipartition, node.separation,
                                   math.nan if loss is None else loss)

    @staticmethod
    def _split(tree: ParameterTree, node: TreeNode, v: ClusterView, test: CFLSplitEvent,
               t: int) -> CFLSplitEvent:
        """Split `node` (of `tree`, changed) along `v`'s bipartition: each side starts from the
        parent's model plus its own mean update; the event gains the split's record."""
        assert v.split is not None and v.similarity is not None
        a, b = v.split.first, v.split.second
        at = v.updates.device
        upd = (v.updates[torch.as_tensor(a, device=at)], v.updates[torch.as_tensor(b, device=at)])
        models = (node.model + weighted_mean(upd[0], v.weights[a]),
                  node.model + weighted_mean(upd[1], v.weights[b]))
        groups = (v.members[a], v.members[b])
        c = v.cohesion
        sides = None if c is None else (c.within_first - c.cross, c.within_second - c.cross)
        ids = tree.split(node.id, groups, models, upd, t, sides)
        return CFLSplitEvent(**test, children=list(ids), groups=[g.tolist() for g in groups],
                             members=v.members.tolist(),
                             similarity=np.round(v.similarity, 5).tolist())

    @staticmethod
    def _extras(views: list[ClusterView], gaps: list[float | None],
                decisions: list[Decision], events: list[CFLSplitEvent], tree: ParameterTree,
                loss: np.ndarray, placed: list[int], pending: dict[int, int]) -> CFLExtras:
        def coh(get: Any) -> list[Any]:
            return [None if v.cohesion is None else get(v.cohesion) for v in views]

        return CFLExtras(
            n_clusters=len(tree.leaves()),
            n_waiting_nodes=len(set(pending.values())),
            clusters=[v.node for v in views],
            cluster_sizes=[len(v.members) for v in views],
            mean_norm=[v.mean_norm for v in views],
            max_norm=[v.max_norm for v in views],
            alpha_cross_max=[None if v.split is None else v.split.max_cross for v in views],
            gap=gaps,
            stationarity=[finite(v.stationarity) for v in views],
            within_mean=coh(lambda c: [finite(c.within_first), finite(c.within_second)]),
            cross_mean=coh(lambda c: finite(c.cross)),
            contrast=coh(lambda c: finite(c.contrast)),
            candidate=[None if v.split is None else v.members[v.split.first].tolist()
                       for v in views],
            drift=[finite(v.drift) for v in views],
            formed_separation=[None if v.formed is None else finite(v.formed)
                               for v in views],
            separation=coh(lambda c: finite(apart(c))),
            loss=[finite(v.loss) for v in views],
            p_value=[finite(d.p_value) for d in decisions],
            max_mean_norm=max(v.mean_norm for v in views),
            max_client_norm=max(v.max_norm for v in views),
            split=any(e["accepted"] for e in events),
            splits=events,
            train_loss=mean_finite(loss),
            refused=[d.reason for d in decisions],
            placed=placed,
            pending=sorted(pending),
        )

    # ------------------------------------------------------------------ best model on path
    def _choose_best(self, state: CFLState) -> Update[CFLState]:
        """keep_best: each client of the round's sample picks the best model on its path
        (root … leaf; one loss query per leaf, phase BEST); the others keep their choice if
        it is still on their path. Ends the round when there is nothing to ask."""
        work, tree = state.round, state.tree
        assert work is not None
        if self.config.keep_best == "off" or len(tree.nodes) == 1:
            return self._end(replace(state, choice=None))
        choice = tree.node_of(state.n_clients, state.pending)  # absent clients: their node ...
        if state.choice is not None:  # ... or their last choice, if still on their path
            on_path = np.array([int(c) in tree.path(int(v))
                                for c, v in zip(state.choice, choice)], dtype=bool)
            choice = np.where(on_path, state.choice, choice)
        best = [leaf.id for leaf in tree.leaves()
                if len(np.intersect1d(leaf.clients, work.sample))]
        state = replace(state, choice=choice, round=replace(work, best=best))
        return Update(state, then=BEST) if best else self._end(state)

    def _scored(self, state: CFLState, reply: LossReply) -> Update[CFLState]:
        """One leaf's clients chose the most accurate model of its path (ties: the deepest)."""
        work = state.round
        assert work is not None and state.choice is not None
        path = state.tree.path(work.best[0])
        acc = reply.accuracy
        score = -reply.loss if np.all(np.isnan(acc)) else np.nan_to_num(acc, nan=-np.inf)
        best = score.shape[1] - 1 - np.argmax(score[:, ::-1], axis=1)
        choice = state.choice.copy()
        choice[reply.clients] = np.asarray(path, dtype=np.int64)[best]
        state = replace(state, choice=choice, round=replace(work, best=work.best[1:]))
        return Update(state, then=BEST) if work.best[1:] else self._end(state)

    @staticmethod
    def _end(state: CFLState) -> Update[CFLState]:
        assert state.round is not None
        return Update(replace(state, round=None), extras=state.round.extras)

    # ------------------------------------------------------------------ interface
    def assignment(self) -> np.ndarray:
        """The leaf (cluster) node id of every client (a client that missed its cluster's
        split: the inner node it waits at until Algorithm 4 places it)."""
        return self.tree.node_of(self.state.n_clients, self.state.pending)

    def predictor(self) -> Predictor:
        if self.state.choice is not None:
            models = torch.stack([v.model for v in self.tree.nodes])
            return Predictor.single(self.clients.decode(models), self.state.choice)
        node_of = self.assignment()
        used = np.unique(node_of)
        row = {int(v): k for k, v in enumerate(used)}
        models = self.clients.decode(torch.stack([self.tree.nodes[int(v)].model for v in used]))
        return Predictor.single(models, np.array([row[int(v)] for v in node_of]))

    def model_of(self, node_id: int) -> torch.Tensor:
        """The plain model of tree node `node_id` (client side: decoded from the server view)."""
        return self.clients.decode(self.tree.nodes[node_id].model)

    # ------------------------------------------------------------------ Algorithm 4
    def walk(self, ctx: Context, clients: np.ndarray | list[int]) -> list[TreeWalk]:
        """Algorithm 4 for clients that did not train (ids in `ctx.backend`'s federation): at
        each inner node v they train from θ*_v (at the learning rate of the round v split) and
        move to the child whose cached updates Δ_e hold the one most similar to theirs; one
        that does not answer stops where it is (its `leaf` is then an inner node)."""
        ids = np.asarray(clients, dtype=np.int64)
        tree, walk = self.tree, Walk.start(ids, np.zeros(len(ids), dtype=np.int64))
        while (step := walk.next(tree)) is not None:
            node, rest = step
            request = self._walk_request(ctx, tree, walk, node)
            reply = ctx.send(request)
            walk = walk.advance(tree, node, rest, walk.rows(node),
                                self.clients.uploads(request, reply), reply.clients)
        return walk.result()

    def placement(self, ctx: Context, clients: np.ndarray) -> Placement:
        """Place clients that took no part in training by Algorithm 4 (`walk`): a client's
        cluster is the leaf it reaches, whose model it predicts with; one that stops answering
        on the way gets -1 and the frozen model of the inner node it reached. `details[i]`:
        client i's `path` (node ids from the root) and `similarities` ([α_0, α_1] at each
        inner node: its update's largest similarity to each child's cached updates). The
        state is not changed (the context's generator draws the requests' seeds)."""
        ids = np.asarray(clients, dtype=np.int64)
        walks = self.walk(ctx, ids)
        reached = [w.leaf for w in walks]
        used = sorted(set(reached))
        row = {v: k for k, v in enumerate(used)}
        plain = [self.model_of(v) for v in used]
        models = torch.stack(plain) if plain else self.clients.base[None][:0]
        return Placement(
            clients=ids,
            clusters=np.array([v if self.tree.nodes[v].is_leaf else -1 for v in reached],
                              dtype=np.int64),
            predictor=Predictor.single(models, np.array([row[v] for v in reached],
                                                        dtype=np.int64)),
            details=[{"path": list(w.path), "node": w.leaf,
                      "similarities": [[a0, a1] for a0, a1 in w.similarities]}
                     for w in walks])

    # ------------------------------------------------------------------ files
    def save_artifacts(self, run_dir: str | Path, round_: int | None = None) -> list[Path]:
        """Write `run_dir/cfl_tree.pt` (the full state, read by `clusterfl place`)."""
        path = Path(run_dir) / TREE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        data = io.BytesIO()  # torch writing to a full disk raises RuntimeError, not OSError
        torch.save({"round": round_, "algorithm": self.state_dict(),
                    "config": self.config.model_dump()}, data)
        write_whole(path, data.getvalue())
        return [path]


__all__ = ["CFL", "CFLConfig", "CFLExtras", "CFLSplitEvent", "CFLState", "ClientSide",
           "DeviceStorage", "ParameterTree", "Refusal", "TreeNode", "TreeWalk"]
