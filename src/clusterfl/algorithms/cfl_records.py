"""CFL's round records: `CFLExtras`, what a round of `clusterfl.algorithms.cfl` reports of
each cluster it examined (its norms, cosines, candidate cut, the auto rule's measures and why
it did not split) and of the tree (its leaves, the clients placed and still waiting)."""

from __future__ import annotations

from dataclasses import dataclass, field

from clusterfl.clustering.split_rule import CFLSplitEvent
from clusterfl.records import RoundExtras


@dataclass(kw_only=True)
class CFLExtras(RoundExtras):
    """CFL's per-round extras. The per-cluster lists run over the clusters examined this round
    (the tree's leaves before the round's splits), in the order of `clusters`."""

    n_clusters: int = 0  # clusters (tree leaves) after the round's splits
    #: inner nodes at which clients wait after the round (they missed their cluster's split
    #: and predict with its frozen model): the run's "clusters" (`Algorithm.n_clusters`, the
    #: distinct nodes of the assignment) are n_clusters + n_waiting_nodes
    n_waiting_nodes: int = 0
    clusters: list[int] = field(default_factory=list)  # tree node id of each cluster examined
    cluster_sizes: list[int] = field(default_factory=list)  # clients of each cluster that answered
    #: norm of each cluster's mean update ‖Δθ_c‖ (eq. 30)
    mean_norm: list[float] = field(default_factory=list)
    #: largest client update norm max_i ‖Δθ_i‖ of each cluster (eq. 31)
    max_norm: list[float] = field(default_factory=list)
    #: α_cross^max of each cluster's bipartition (None: fewer than two clients answered)
    alpha_cross_max: list[float | None] = field(default_factory=list)
    #: separation gap g(α) of each cluster against the true clusters (None: unknown or < 2)
    gap: list[float | None] = field(default_factory=list)
    #: stationarity ratio ‖Σ w_i Δθ_i‖ / Σ w_i ‖Δθ_i‖ of each cluster (None: not finite)
    stationarity: list[float | None] = field(default_factory=list)
    #: within-cosine means of the two sides of each cluster's bipartition (None: < 2 clients)
    within_mean: list[list[float | None] | None] = field(default_factory=list)
    #: cross-cosine mean of each cluster's bipartition (None: < 2 clients)
    cross_mean: list[float | None] = field(default_factory=list)
    #: contrast of each cluster's bipartition (`Cohesion.contrast`; None: < 2 clients)
    contrast: list[float | None] = field(default_factory=list)
    #: the first side of each cluster's candidate bipartition (None: < 2 clients)
    candidate: list[list[int] | None] = field(default_factory=list)
    #: cosine of each cluster's mean update with its previous one (auto rule; None: none)
    drift: list[float | None] = field(default_factory=list)
    #: its side's within mean minus the cross mean of the split that made each cluster (None:
    #: the root)
    formed_separation: list[float | None] = field(default_factory=list)
    #: max within-side mean minus cross mean of each candidate bipartition (None: < 2 clients)
    separation: list[float | None] = field(default_factory=list)
    #: mean local training loss of each cluster's answering clients (None: none reported)
    loss: list[float | None] = field(default_factory=list)
    #: shuffle-test p-value of each cluster's candidate contrast (None: not tested)
    p_value: list[float | None] = field(default_factory=list)
    max_mean_norm: float = 0.0  # largest ‖Δθ_c‖ over the clusters
    max_client_norm: float = 0.0  # largest client update norm over all clusters
    split: bool = False  # whether a cluster split this round
    #: the split tests of the clusters that were split candidates (eq. 30-31 held)
    splits: list[CFLSplitEvent] = field(default_factory=list)
    train_loss: float | None = None  # mean local training loss of the answering clients
    #: why each cluster did not split (None: it split); `Refusal.read` gives the reason
    refused: list[str | None] = field(default_factory=list)
    #: clients Algorithm 4 placed into a leaf this round (they missed their cluster's split)
    placed: list[int] = field(default_factory=list)
    #: clients still waiting at an inner node of the tree
    pending: list[int] = field(default_factory=list)
