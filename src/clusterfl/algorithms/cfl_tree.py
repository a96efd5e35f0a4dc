"""CFL's parameter tree (Sattler et al. 2020, Section IV-C), the walk of Algorithm 4 down it,
and the simulated client devices of Algorithm 5 (`clusterfl.algorithms.cfl` is the method).

- `ParameterTree` / `TreeNode`: every cluster ever formed, its clients, its model (frozen
  once it splits: the stationary solution θ*_v) and, on the edge from its parent, the
  pre-split updates Δ_e of its clients (eq. (43)).
- `Walk`: Algorithm 4 for a set of clients, one inner node at a time: the clients at node v
  train from θ*_v and move to the child whose cached updates hold the update most similar to
  their own. `Walk.next` says which node comes next (or None: done) and `Walk.advance`
  applies a reply; neither sends anything, so the method drives the walk within its rounds
  (clients that missed their cluster's split) and `CFL.placement` outside them.
- `ClientSide` / `DeviceStorage`: what runs on the devices (Alg. 5 lines 3, 7, 8): the
  privacy permutation P, models rebuilt from the server's displacements, updates encoded
  before they leave the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import torch

from clusterfl.clustering.cosine import cross_cosine
from clusterfl.protocol import LocalTraining, LossRequest, TrainReply, TrainRequest, start_models

# ====================================================================== the parameter tree


@dataclass
class TreeNode:
    """One (intermediate) cluster of the parameter tree (Section IV-C).

    `model` is the server's view of the cluster model (displacement from θ_0, permuted under
    privacy). For a leaf it is the live model; once the node splits it stays frozen at the
    stationary solution θ*_v the split was decided at. `updates` are the pre-split updates of
    this node's clients, computed from the parent's frozen model (Δ_e of eq. (43)); None at
    the root.
    """

    id: int
    clients: np.ndarray
    parent: int
    model: torch.Tensor
    created: int
    children: list[int] = field(default_factory=list)
    split_round: int | None = None
    updates: torch.Tensor | None = None
    #: how far the split that created this node set its clients apart: the mean similarity
    #: of their updates (ᾱ of their side) minus that split's cross mean ᾱ_× (None at the root,
    #: NaN for a side of one client); the auto rule's nesting condition compares later cuts
    #: of this node with it
    separation: float | None = None

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass
class ParameterTree:
    """The tree of clusters CFL builds by recursive bipartitioning (Fig. 5); node ids are
    positions in `nodes`."""

    nodes: list[TreeNode]

    @staticmethod
    def new(n_clients: int, model: torch.Tensor) -> ParameterTree:
        root = TreeNode(0, np.arange(n_clients, dtype=np.int64), -1, model.clone(), 0)
        return ParameterTree([root])

    def copy(self) -> ParameterTree:
        """A tree whose nodes can be changed without touching this one's (tensors and arrays
        are shared: they are replaced, never written in place)."""
        return ParameterTree([replace(v, children=list(v.children)) for v in self.nodes])

    @property
    def root(self) -> TreeNode:
        return self.nodes[0]

    def leaves(self) -> list[TreeNode]:
        """The current clusters, by node id."""
        return [v for v in self.nodes if v.is_leaf]

    def path(self, node_id: int) -> list[int]:
        """Node ids from the root down to `node_id`."""
        out = [node_id]
        while self.nodes[out[-1]].parent >= 0:
            out.append(self.nodes[out[-1]].parent)
        return out[::-1]

    def leaf_of_clients(self, n_clients: int) -> np.ndarray:
        """Leaf node id of every training client."""
        out = np.full(n_clients, -1, dtype=np.int64)
        for v in self.leaves():
            out[v.clients] = v.id
        return out

    def node_of(self, n_clients: int, pending: dict[int, int]) -> np.ndarray:
        """Each client's leaf, or for a `pending` client the inner node it waits at."""
        out = self.leaf_of_clients(n_clients)
        for c, v in pending.items():
            out[c] = v
        return out

    def split(self, node_id: int, groups: tuple[np.ndarray, np.ndarray],
              models: tuple[torch.Tensor, torch.Tensor],
              updates: tuple[torch.Tensor, torch.Tensor], t: int,
              separation: tuple[float, float] | None = None) -> tuple[int, int]:
        """Freeze node `node_id` and hang two children under it; returns their ids.
        `separation` is, for each group, its within-side mean similarity minus the split's
        cross mean (`TreeNode.separation`)."""
        parent = self.nodes[node_id]
        ids = []
        sides = separation if separation is not None else (None, None)
        for members, model, upd, sep in zip(groups, models, updates, sides):
            child = TreeNode(len(self.nodes), np.sort(members), node_id, model, t,
                             updates=upd.clone(), separation=sep)
            self.nodes.append(child)
            ids.append(child.id)
        parent.children = ids
        parent.split_round = t
        return ids[0], ids[1]


# ====================================================================== Algorithm 4


@dataclass
class TreeWalk:
    """Where Algorithm 4 put a new client: its leaf, the path, and α_0/α_1 at each level."""

    client: int
    leaf: int
    path: list[int]
    similarities: list[tuple[float, float]]


@dataclass
class Walk:
    """Algorithm 4 under way for `clients`, level by level: every client at an inner node of
    the level moves down one node; `level` holds the inner nodes of the current level not yet
    visited (in id order). A client that does not answer stops where it is (`stuck`)."""

    clients: np.ndarray
    at: np.ndarray
    paths: list[list[int]]
    similarities: list[list[tuple[float, float]]]
    stuck: np.ndarray
    level: list[int] = field(default_factory=list)

    @staticmethod
    def start(clients: np.ndarray, at: np.ndarray) -> Walk:
        at = np.asarray(at, dtype=np.int64).copy()
        return Walk(np.asarray(clients, dtype=np.int64), at, [[int(v)] for v in at],
                    [[] for _ in at], np.zeros(len(at), dtype=bool))

    def next(self, tree: ParameterTree) -> tuple[int, list[int]] | None:
        """The inner node to visit next and the level's nodes after it; None: the walk is
        over (every client at a leaf or stuck)."""
        level = self.level or sorted({int(v) for v, s in zip(self.at, self.stuck)
                                      if not s and not tree.nodes[int(v)].is_leaf})
        return (level[0], level[1:]) if level else None

    def rows(self, node: int) -> np.ndarray:
        """Positions (in `clients`) of the clients at `node` still walking."""
        return np.flatnonzero((self.at == node) & ~self.stuck)

    def advance(self, tree: ParameterTree, node: int, rest: list[int], rows: np.ndarray,
                updates: torch.Tensor, answered: np.ndarray) -> Walk:
        """The walk after the clients `rows` at `node` trained: `updates` are the updates of
        those that `answered` (ids, in request order); they move to the child whose cached
        updates hold the most similar one, the others stop."""
        at, stuck = self.at.copy(), self.stuck.copy()
        paths, sims = [list(p) for p in self.paths], [list(s) for s in self.similarities]
        moved = np.isin(self.clients[rows], answered)  # the reply's rows: these, in this order
        stuck[rows[~moved]] = True
        if moved.any():
            a, b = (tree.nodes[c] for c in tree.nodes[node].children)
            assert a.updates is not None and b.updates is not None
            alpha0 = cross_cosine(updates, a.updates).max(axis=1)
            alpha1 = cross_cosine(updates, b.updates).max(axis=1)
            for k, r in enumerate(rows[moved]):
                nxt = a.id if alpha0[k] > alpha1[k] else b.id
                at[r] = nxt
                sims[r].append((float(alpha0[k]), float(alpha1[k])))
                paths[r].append(nxt)
        return Walk(self.clients, at, paths, sims, stuck, rest)

    def result(self) -> list[TreeWalk]:
        return [TreeWalk(int(c), int(self.at[k]), self.paths[k], self.similarities[k])
                for k, c in enumerate(self.clients)]


# ====================================================================== the client side


@dataclass
class DeviceStorage:
    """What the client devices keep for the whole run: the public initial model θ_0 and, with
    privacy, the seed of the permutation P they agreed on (Alg. 5 line 3)."""

    base: torch.Tensor
    privacy: bool
    secret: int


class ClientSide:
    """What runs on the client devices in Algorithm 5 (lines 3, 7 and 8), simulated.

    The server-side `CFL` object only builds requests with `train_request` / `loss_request`
    and reads replies through `uploads`, and never reads the secret. In a deployment these
    lines run on every device: the clients agree on a random seed among themselves (Alg. 5
    line 3, e.g. through a key exchange the server relays but cannot read), build P from it,
    apply P⁻¹ to what the server broadcasts and P to what they upload. Here the backend plays
    the devices' training step; this class wraps it so that whatever the server reads has
    already been permuted. In simulation the seed is drawn from the run's generator so that
    runs stay reproducible; it lives only in the devices' own storage, simulated by the
    `DeviceStorage` that `CFLState.devices` (and so the checkpoint) holds for them, and in
    this object, which is rebuilt from it.

    Models travel as displacements D from the public initial model θ_0: the clients rebuild
    θ = θ_0 + P⁻¹ D, train, and return P(θ_new − θ).
    """

    def __init__(self, storage: DeviceStorage) -> None:
        self.storage = storage
        self._perm, self._inv = self._permutation()

    @property
    def base(self) -> torch.Tensor:
        """θ_0, the public initial model."""
        return self.storage.base

    def _permutation(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if not self.storage.privacy:
            return None, None
        g = torch.Generator()
        g.manual_seed(self.storage.secret)
        perm = torch.randperm(self.base.numel(), generator=g)
        return perm, torch.argsort(perm)

    def encode(self, plain: torch.Tensor) -> torch.Tensor:
        """P v (identity without privacy), on the last dimension."""
        return plain if self._perm is None else plain[..., self._perm.to(plain.device)]

    def decode(self, displacement: torch.Tensor) -> torch.Tensor:
        """θ_0 + P⁻¹ D: the plain model(s) of server displacements `[..., d]`."""
        plain = (displacement if self._inv is None
                 else displacement[..., self._inv.to(displacement.device)])
        return self.base.to(plain.device) + plain

    def train_request(self, clients: np.ndarray, displacements: torch.Tensor,
                      model_of_client: np.ndarray, training: LocalTraining,
                      seed: int) -> TrainRequest:
        """The clients train from their cluster models (server displacements, decoded on the
        devices)."""
        return TrainRequest(clients, self.decode(displacements), model_of_client, training,
                            seed)

    def uploads(self, request: TrainRequest, reply: TrainReply) -> torch.Tensor:
        """P Δθ `[m, d]` of the m clients that answered `request` (in reply order)."""
        return self.encode(reply.params - start_models(request, reply.clients))

    def loss_request(self, clients: np.ndarray, displacements: torch.Tensor,
                     split: Literal["train", "test"]) -> LossRequest:
        """The loss and accuracy of K decoded models on each client's own data."""
        return LossRequest(clients, self.decode(displacements), split)


__all__ = ["ClientSide", "DeviceStorage", "ParameterTree", "TreeNode", "TreeWalk", "Walk"]
