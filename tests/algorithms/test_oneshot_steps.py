"""The cuts of the methods that cluster once, on hand-built inputs (no federation): FL+HC's
(client updates → linkage → clusters) and PACFL's (proximity matrix → clusters at β), the
absent clients' own clusters, and the threshold a TOML file can switch off. Merge heights are
written as the sums they are."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from clusterfl.algorithms.flhc import FLHCConfig, flhc_clusters
from clusterfl.algorithms.oneshot import OneOffAsk, cut_clients, dump_cut, own_clusters
from clusterfl.algorithms.pacfl import (
    PACFL,
    SUBSPACES,
    TRAIN,
    PACFLConfig,
    PACFLState,
    pacfl_clusters,
)
from clusterfl.protocol import SubspaceReply, SubspaceRequest

# ----------------------------------------------------------------------------- FL+HC
#: four clients' updates Δθ_k in R²: 0 and 1 are 5 apart, 2 and 3 are 1 apart
UPDATES = np.array([[0.0, 0.0], [3.0, 4.0], [20.0, 0.0], [20.0, 1.0]])
#: Ward's last merge: √(2·2·2/(2+2)) · ‖(1.5, 2) − (20, 0.5)‖
WARD_TOP = math.sqrt(2 * 2 * 2 / 4) * math.sqrt(18.5**2 + 1.5**2)


def flhc(**options: object) -> FLHCConfig:
    return FLHCConfig(**options)  # type: ignore[arg-type]


def test_flhc_ward_cut_by_hand() -> None:
    cut, z = flhc_clusters(UPDATES, 4, np.arange(4), flhc(threshold=6.0))
    labels = cut.labels
    np.testing.assert_allclose(z[:, 2], [1.0, 5.0, WARD_TOP])  # the heights of the merges
    assert labels.tolist() == [0, 0, 1, 1]  # 1 ≤ 6 and 5 ≤ 6 merged, the top is not
    assert flhc_clusters(UPDATES, 4, np.arange(4), flhc(threshold=4.0))[0].labels.tolist() == \
        [0, 1, 2, 2]  # 5 > 4: clients 0 and 1 stay apart
    # no threshold, no C, auto_cut "gap": the largest gap of 1, 5, WARD_TOP is above 5
    assert flhc_clusters(UPDATES, 4, np.arange(4), flhc(auto_cut="gap"))[0].labels.tolist() \
        == [0, 0, 1, 1]
    assert flhc_clusters(UPDATES, 4, np.arange(4), flhc(n_clusters=3))[0].labels.tolist() == \
        [0, 1, 2, 2]


def test_flhc_manhattan_single_linkage_by_hand() -> None:
    cfg = flhc(metric="manhattan", linkage="single", threshold=10.0)
    cut, z = flhc_clusters(UPDATES, 4, np.arange(4), cfg)
    labels = cut.labels
    # |0−3|+|0−4| = 7 and |20−20|+|0−1| = 1 within; across the least is |3−20|+|4−1| = 20
    np.testing.assert_allclose(z[:, 2], [0 + 1, 3 + 4, 17 + 3])
    assert labels.tolist() == [0, 0, 1, 1]


def test_flhc_client_without_an_update_is_its_own_cluster() -> None:
    """Five clients, client 2 sent no update: the others are cut as above, client 2 gets the
    next cluster id; a C above the updates that arrived is lowered to their number."""
    labels = flhc_clusters(UPDATES, 5, np.array([0, 1, 3, 4]), flhc(threshold=6.0))[0].labels
    assert labels.tolist() == [0, 0, 2, 1, 1]
    two = flhc_clusters(UPDATES[:2], 3, np.array([0, 2]), flhc(n_clusters=3))[0].labels
    assert two.tolist() == [0, 2, 1]  # C = 3 lowered to the 2 updates: each its own


# ----------------------------------------------------------------------------- PACFL
#: proximity A (degrees) of four clients: pairs {0, 1} at 2°, {2, 3} at 3°
A = np.array([[0.0, 2.0, 30.0, 40.0],
              [2.0, 0.0, 35.0, 45.0],
              [30.0, 35.0, 0.0, 3.0],
              [40.0, 45.0, 3.0, 0.0]])


def pacfl(**options: object) -> PACFLConfig:
    return PACFLConfig(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("linkage", "top"), [
    ("average", (30 + 40 + 35 + 45) / 4),  # UPGMA: the mean of the four cross distances
    ("weighted", ((30 + 35) / 2 + (40 + 45) / 2) / 2),  # WPGMA: the mean of the two means
    ("complete", max(30, 40, 35, 45)),
    ("single", min(30, 40, 35, 45)),
])
def test_pacfl_cut_at_beta_by_hand(linkage: str, top: float) -> None:
    cut, z = pacfl_clusters(A, 4, np.arange(4), pacfl(linkage=linkage, threshold=3.5))
    labels = cut.labels
    np.testing.assert_allclose(z[:, 2], [2.0, 3.0, top])
    assert labels.tolist() == [0, 0, 1, 1]  # 2° and 3° ≤ β = 3.5°, the top is not
    assert pacfl_clusters(A, 4, np.arange(4), pacfl(linkage=linkage, threshold=2.5))[0] \
        .labels.tolist() == [0, 0, 1, 2]  # 3° > 2.5°: clients 2 and 3 stay apart
    assert pacfl_clusters(A, 4, np.arange(4), pacfl(linkage=linkage, threshold=top))[0] \
        .labels.tolist() == [0, 0, 0, 0]  # every merge at height ≤ β is made


#: A's silhouettes by hand (a: mean distance within the own cluster, b: to the nearest other
#: cluster, s = 1 − a / b; a singleton scores 0). Cut into {0, 1}, {2, 3}:
SIL_2 = ((1 - 2 / 35) + (1 - 2 / 40) + (1 - 3 / 32.5) + (1 - 3 / 42.5)) / 4
#: cut into {0, 1}, {2}, {3} (clients 0 and 1 are nearest to client 2: 30 and 35)
SIL_3 = ((1 - 2 / 30) + (1 - 2 / 35) + 0 + 0) / 4


def test_pacfl_default_cut_is_the_silhouette_cut_by_hand() -> None:
    cut, _ = pacfl_clusters(A, 4, np.arange(4), pacfl())
    assert cut.labels.tolist() == [0, 0, 1, 1] and cut.silhouette_c == 2
    assert cut.silhouette == pytest.approx(SIL_2) and SIL_2 > SIL_3
    # the same tree with a bound above its best silhouette: no structure, one cluster
    lone, _ = pacfl_clusters(A, 4, np.arange(4), pacfl(min_silhouette=0.95))
    assert lone.labels.tolist() == [0, 0, 0, 0] and lone.silhouette == pytest.approx(SIL_2)
    assert pacfl().threshold is None and pacfl(threshold=3.5).threshold == 3.5


def test_pacfl_without_beta_cuts_at_the_largest_gap_or_into_c() -> None:
    assert pacfl_clusters(A, 4, np.arange(4), pacfl(auto_cut="gap"))[0].labels.tolist() == \
        [0, 0, 1, 1]  # heights 2, 3, 37.5: the gap above 3
    assert pacfl_clusters(A, 4, np.arange(4), pacfl(n_clusters=3))[0].labels.tolist() == \
        [0, 0, 1, 2]  # n_clusters wins over the default β


def test_pacfl_client_without_a_basis_is_its_own_cluster() -> None:
    labels = pacfl_clusters(A, 5, np.array([0, 1, 2, 4]), pacfl(threshold=3.5))[0].labels
    assert labels.tolist() == [0, 0, 1, 2, 1]


# ----------------------------------------------------------------------------- shared
def test_own_clusters_and_cut_with_nobody() -> None:
    assert own_clusters(np.array([0, -1, 1, -1]), np.array([1, 3])).tolist() == [0, 2, 1, 3]
    z = np.zeros((0, 4))
    assert cut_clients(z, 2, np.zeros(0, np.int64), None, None, None).labels.tolist() == [0, 1]
    nobody = cut_clients(z, 2, np.zeros(0, np.int64), None, None, None, "silhouette",
                         np.zeros((0, 0)))
    assert nobody.labels.tolist() == [0, 1] and nobody.silhouette is None


def test_threshold_none_is_a_word_and_dumps_as_one() -> None:
    for word in ("none", "None", " NONE "):
        assert pacfl(threshold=word).threshold is None
    with pytest.raises(ValueError, match='expected a number > 0 or "none"'):
        pacfl(threshold="nothing")
    assert dump_cut({"threshold": None}, None, None) == {"threshold": "none"}
    assert dump_cut({"threshold": 3.5, "n_clusters": 2}, 3.5, 2) == {"n_clusters": 2}
    assert dump_cut({"threshold": 1.0}, 1.0, None) == {"threshold": 1.0}


def test_pacfl_subspace_update_by_hand_leaves_the_given_state() -> None:
    """Three of four clients send a line in R² (e = 2, p = 1): e1, e1 turned by 2°, e2.
    β = 3.5°: {0, 1} and {2}; client 3 sent nothing: its own cluster. The one-off cost is
    e · p = 2 floats per basis received."""
    algo = PACFL(pacfl(p=1, threshold=3.5))
    algo.input_dim, algo.n_labels = 2, 0  # what `setup` derives from the model's input
    start = PACFLState(torch.arange(3.0)[None], np.full(4, -1, dtype=np.int64), 0)
    rad = math.radians(2.0)
    bases = np.array([[[1.0], [0.0]], [[math.cos(rad)], [math.sin(rad)]], [[0.0], [1.0]]])
    reply = SubspaceReply(np.array([0, 1, 2]), bases, np.array([1, 1, 1]), np.array([5, 5, 5]))
    ask = OneOffAsk(SubspaceRequest(np.arange(4), 2, p=1), SUBSPACES)
    out = algo.update(start, 1, ask, reply)
    st = out.state
    assert out.then == TRAIN and out.extras is None
    np.testing.assert_allclose(st.proximity[:3, :3], [[0, 2, 90], [2, 0, 90 - 2], [90, 88, 0]],
                               atol=1e-6)
    assert np.isinf(st.proximity[3, :3]).all() and st.proximity[3, 3] == 0
    assert st.labels.tolist() == [0, 0, 1, 2] and st.clustered and st.clustering_round == 1
    assert (st.n_clusters_found, st.missing_signatures) == (3, 1)
    assert st.signature_floats_up == 3 * (2 * 1) and st.signature_floats_used == 2 * (1 + 1 + 1)
    assert torch.equal(st.models, torch.arange(3.0)[None].repeat(3, 1))  # one start for all
    assert start.labels.tolist() == [-1] * 4 and not start.clustered  # the given state
