"""CFL-GP's records: the run totals of Tables 5–6 (`CFLGPCounts`), the Appendix-G estimate
kept in the state (`KEstimate`) and the round extras (`CFLGPExtras` and the clustering
rounds' subclasses). The method: `clusterfl.algorithms.cfl_gp`."""

from __future__ import annotations

from dataclasses import dataclass, field

from clusterfl.records import RoundExtras


@dataclass
class CFLGPCounts:
    """Tables 5–6, run totals over all clients (the extras report them per client and
    period of P rounds)."""

    models_down: float = 0.0  # models received
    vectors_up: float = 0.0  # vectors sent
    gradients: float = 0.0  # gradients (trainings) computed
    uplink_floats_compressed: float = 0.0  # uplink floats of the replies received
    rounds: float = 0.0  # rounds counted


@dataclass
class KEstimate:
    """The Appendix-G estimate of the last clustering update (None: not yet, or off)."""

    k_estimate: int | None = None
    spectral_gap_s: int | None = None
    structure_p: float | None = None  # the shuffle test's p (None: off, or < 5 clients)


@dataclass(kw_only=True)
class CFLGPExtras(RoundExtras):
    """CFL-GP's per-round extras in a round without a clustering update."""

    train_loss: float | None = None  # mean loss of the answering clients at their model
    clustering: bool = False  # whether this round updated the gradient profile and the clustering
    broadcast_model: int = -1  # k̄ broadcast for the profile (-1: no clustering)
    assignment_changes: int = 0  # clients whose cluster changed this round
    clustering_stopped_at: int | None = None  # round the clustering stopped (None: still on)
    k_estimate: int | None = None  # Appendix-G estimate of K (None: not yet, or off)
    spectral_gap_s: int | None = None  # s of that estimate: the largest singular gap
    k_structure_p: float | None = None  # that estimate's structure test (k_significance)
    models_down_per_client_period: float = 0.0  # models received per client and period
    vectors_up_per_client_period: float = 0.0  # vectors sent per client and period
    gradients_per_client_period: float = 0.0  # gradients/trainings per client and period
    feature_dim: int = 0  # d̂, the coordinates a feature keeps (App. E.1/E.2)
    uplink_floats_compressed: float = 0.0  # uplink floats of the replies received


@dataclass(kw_only=True)
class CFLGPClusteringExtras(CFLGPExtras):
    """CFL-GP's extras in a clustering round (with `estimate_k` off; see
    `CFLGPEstimateExtras`)."""

    beta: float = 0.0  # β of this round's running mean of block k̄ (Alg. 1 line 9)
    #: leading singular values of the gradient profile (at most 64)
    singular_values: list[float] = field(default_factory=list)
    #: positions s (1-based) of the three largest gaps σ_s − σ_{s+1}, largest first
    largest_gaps_after: list[int] = field(default_factory=list)
    #: every client's projected feature Ûᵀg_c, its first K coordinates
    projected_features: list[list[float]] = field(default_factory=list)


@dataclass(kw_only=True)
class CFLGPEstimateExtras(CFLGPClusteringExtras):
    """CFL-GP's extras in a clustering round with the Appendix-G estimate on (`estimate_k`)."""

    #: the estimate's criterion (silhouette or gap statistic) per candidate k
    k_scores: dict[str, float] = field(default_factory=dict)


__all__ = ["CFLGPClusteringExtras", "CFLGPCounts", "CFLGPEstimateExtras", "CFLGPExtras",
           "KEstimate"]
