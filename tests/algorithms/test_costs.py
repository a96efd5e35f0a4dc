"""Communication booked by `Context.send` equals a hand count from each method's paper.

Tiny federation (8 clients, 2 rotation groups, an MLP of d parameters), 3 rounds, everybody
answers. Each expected value is written from what the paper says travels per client and
round (in floats), not from the code: the count is booked in one place only, so a method that
asked for the wrong thing, or a request that prices itself wrongly, fails here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from clusterfl.experiment import Experiment
from clusterfl.models.params import last_layer_mask

N, ROUNDS, K = 8, 3, 2
BASE: dict[str, Any] = {
    "seed": 3, "rounds": ROUNDS, "eval_every": ROUNDS, "checkpoint_every": 0,
    "data": {"source": "digits"},
    "scenario": {"name": "rotation", "n_clients": N, "angles": [0, 180]},
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"lr": 0.1, "batch_size": 32, "epochs": 1},
    "output": {"figures": False, "progress": "off"},
}


def _run(algorithm: dict[str, Any]) -> tuple[Experiment, list[Any]]:
    torch.set_num_threads(1)
    exp = Experiment.from_config({**BASE, "algorithm": algorithm})
    history = exp.run(progress=False)
    return exp, history.records


def _floats(records: list[Any]) -> tuple[float, float]:
    last = records[-1]
    return (last["floats_down"], last["floats_up"]) if isinstance(last, dict) else (
        last.floats_down, last.floats_up)


def _d(exp: Experiment) -> int:
    return int(exp.factory.size)


def test_fedavg_and_fedprox_send_the_model_down_and_up():
    for name in ("fedavg", "fedprox"):
        exp, rec = _run({"name": name})
        d = _d(exp)
        assert _floats(rec) == (ROUNDS * N * d, ROUNDS * N * d)
    exp, rec = _run({"name": "fedavg", "fraction": 0.5})  # ρ N clients a round
    d = _d(exp)
    assert _floats(rec) == (ROUNDS * N // 2 * d, ROUNDS * N // 2 * d)


def test_local_sends_nothing():
    _, rec = _run({"name": "local"})
    assert _floats(rec) == (0.0, 0.0)


def test_fedavg_plus_runs_k_fedavgs():
    exp, rec = _run({"name": "fedavg_plus", "n_models": 3})
    d = _d(exp)
    assert _floats(rec) == (ROUNDS * 3 * N * d, ROUNDS * 3 * N * d)


@pytest.mark.parametrize("averaging", ["model", "gradient"])
def test_ifca_sends_k_models_once_and_gets_k_losses_and_one_vector(averaging):
    exp, rec = _run({"name": "ifca", "n_clusters": K, "averaging": averaging})
    d = _d(exp)
    # IFCA Alg. 1: the K models down; K losses and one model (or gradient) up
    assert _floats(rec) == (ROUNDS * N * K * d, ROUNDS * N * (K + d))


def test_ifca_with_weight_sharing_sends_the_shared_layers_once():
    exp, rec = _run({"name": "ifca", "n_clusters": K, "weight_sharing": True})
    d = _d(exp)
    last = int(last_layer_mask(exp.factory.layout).sum())
    assert _floats(rec) == (ROUNDS * N * ((d - last) + K * last), ROUNDS * N * (K + d))


def test_fesem_sends_the_center_down_and_the_model_up():
    exp, rec = _run({"name": "fesem", "n_clusters": K})
    d = _d(exp)
    assert _floats(rec) == (ROUNDS * N * d, ROUNDS * N * d)


def test_fesem_warmup_is_local_until_the_first_upload():
    exp, rec = _run({"name": "fesem", "n_clusters": K, "warmup_rounds": 2})
    d = _d(exp)
    # rounds 1-2 local (round 2 ends with every client uploading θ_i), round 3 as FeSEM
    assert _floats(rec) == (N * d, N * d + N * d)


def test_ifca_cam_sends_global_and_k_cluster_parts_and_gets_both_parts_back():
    exp, rec = _run({"name": "ifca_cam", "n_clusters": K, "warmup_rounds": 1})
    d = _d(exp)
    warm = (N * d, N * d)  # round 1: FedAvg on Θ_g
    cam = (N * (K * d + d), N * (K + 2 * d))  # Θ_g + K Θ_k down; K losses, θ_i, θ_i^0 up
    assert _floats(rec) == (warm[0] + 2 * cam[0], warm[1] + 2 * cam[1])


def test_fesem_cam_sends_global_and_own_cluster_part():
    exp, rec = _run({"name": "fesem_cam", "n_clusters": K, "warmup_rounds": 1})
    d = _d(exp)
    # round 1: local warm-up ending with the upload of θ_i; then Θ_g, Θ_c(i) down and
    # θ_i, θ_i^0 up per client and round
    assert _floats(rec) == (2 * (2 * N * d), N * d + 2 * (2 * N * d))


def test_cfl_trains_every_client_every_round():
    exp, rec = _run({"name": "cfl"})
    d = _d(exp)
    assert _floats(rec) == (ROUNDS * N * d, ROUNDS * N * d)


@pytest.mark.parametrize("ratio", [1.0, 4.0])
def test_cfl_gp_probe_goes_to_clients_off_the_broadcast_model(ratio):
    exp, rec = _run({"name": "cfl_gp", "n_clusters": K, "period": 2,
                     "compression_ratio": ratio, "stable_rounds": 0})
    d = _d(exp)
    d_hat = round(d / ratio)
    # Alg. 1: every round each client gets its model and sends a gradient (d); in a
    # clustering round t (t mod P = 1: rounds 1 and 3) the broadcast model k̄ (0, then 1)
    # goes to the clients not in cluster k̄, which send their d̂ feature coordinates.
    initial = np.arange(N) % K  # the balanced start: K clusters of N / K
    after_1 = np.asarray(rec[1]["assignment"] if isinstance(rec[1], dict)
                         else rec[1].assignment)
    others = int((initial != 0).sum()) + int((after_1 != 1).sum())
    assert _floats(rec) == (ROUNDS * N * d + others * d, ROUNDS * N * d + others * d_hat)


def test_pca_km_hc_pays_the_signatures_once():
    exp, rec = _run({"name": "pca_km_hc", "fraction": 0.5, "n_clusters": 2, "k": 3})
    d = _d(exp)
    e = int(np.prod(exp.factory.input_shape))  # centroids in input space
    # one-off: nothing down for PCA, k·e up per client; then ρN clients train each round
    assert _floats(rec) == (ROUNDS * N // 2 * d, N * 3 * e + ROUNDS * N // 2 * d)


def test_flt_pays_the_encoder_and_signatures_once():
    exp, rec = _run({"name": "flt", "fraction": 0.5, "n_clusters": 2, "k": 3,
                     "encoder": "none", "latent": 8, "finetune_epochs": 0, "umap": False})
    d = _d(exp)
    from clusterfl.encoders import resolve  # the untrained ConvAE every client receives

    w = int(resolve("none", tuple(exp.factory.input_shape), 8, 1, 0, None, None).params.numel())
    assert _floats(rec) == (N * w + ROUNDS * N // 2 * d, N * 3 * 8 + ROUNDS * N // 2 * d)


def test_fedem_sends_the_m_components_down_and_up():
    exp, rec = _run({"name": "fedem", "n_components": 3})
    d = _d(exp)
    # Marfoq et al.: each participant gets the M components and returns its M trained
    # components; its mixture weights π never leave the device
    assert _floats(rec) == (ROUNDS * N * 3 * d, ROUNDS * N * 3 * d)
    exp, rec = _run({"name": "fedem", "n_components": 2, "per_round": 3})
    assert _floats(rec) == (ROUNDS * 3 * 2 * d, ROUNDS * 3 * 2 * d)


def test_fedsoft_sends_s_models_once_a_round_and_counts_every_tau():
    exp, rec = _run({"name": "fedsoft", "n_clusters": K, "estimation_interval": 2})
    d = _d(exp)
    # rounds 1 and 3 estimate importance: every client gets the S cluster models (S·d) and
    # sends S counts, then trains against the models it holds; round 2 sends the S models
    # with the training request. Every client trains (no selection) and sends w_k (d); w_k
    # itself stays on the device.
    assert _floats(rec) == (ROUNDS * N * K * d, 2 * N * K + ROUNDS * N * d)


def test_fedsoft_with_selection_pays_for_the_selected_clients():
    exp, rec = _run({"name": "fedsoft", "n_clusters": K, "estimation_interval": 2,
                     "per_cluster": 2})
    d = _d(exp)
    sel = [r["extras"]["selected"] if isinstance(r, dict) else r.extras["selected"]
           for r in rec]
    assert all(1 <= s <= 2 * K for s in sel)
    # estimation rounds 1, 3: N·S·d down, N·S up; round 2: the selected get S·d down;
    # every selected client sends its w_k
    down = 2 * N * K * d + sel[1] * K * d
    up = 2 * N * K + sum(sel) * d
    assert _floats(rec) == (down, up)


@pytest.mark.parametrize("per_label", [False, True])
def test_pacfl_pays_the_bases_once(per_label):
    exp, rec = _run({"name": "pacfl", "fraction": 0.5, "p": 3, "per_label": per_label,
                     "n_clusters": 2})
    d = _d(exp)
    e = int(np.prod(exp.factory.input_shape))  # bases live in input space
    bases = 10 if per_label else 1  # per label: the reply is sized for all 10 digit labels
    # one-off: nothing down, p·e per basis up from every client; then ρN clients a round
    assert _floats(rec) == (ROUNDS * N // 2 * d, N * bases * 3 * e + ROUNDS * N // 2 * d)


def test_flhc_clusters_with_every_client_once():
    exp, rec = _run({"name": "flhc", "fraction": 0.5, "warmup_rounds": 1, "n_clusters": 2})
    d = _d(exp)
    # round 1: FedAvg with ρN clients; round 2: all N train from θ¹ (the clustering round);
    # round 3: ρN clients, each gets its cluster's model and sends its own
    per_round = [N // 2, N, N // 2]
    assert _floats(rec) == (sum(per_round) * d, sum(per_round) * d)
