"""The papers' CNNs (`cfl_cnn`, `cam_cnn`, `leaf_cnn`; clusterfl.models.paper_nets / zoo):
parameter counts from the layer shapes, the simulation backend's training equal to the
sequential reference (vmapped, no per-client loop), a short FedAvg run whose loss falls, and
ResNet-18's shared layers under CFL-GP's weight sharing (App. F.7)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.engine.test_equivalence import close, make_federation, train_request

from clusterfl.algorithms.common import LossExtras
from clusterfl.backends.sequential import SequentialBackend
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.data.federation import Federation
from clusterfl.engine.generic import GenericKernel
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from clusterfl.models import ModelFactory, model_config

pytestmark = pytest.mark.usefixtures("one_thread")


def conv(c_in: int, c_out: int, k: int = 5) -> int:
    return c_in * c_out * k * k + c_out


def linear(a: int, b: int) -> int:
    return a * b + b


@pytest.mark.parametrize(("name", "shape", "classes", "expected"), [
    # CFL's ConvNet on CIFAR-10: 32 → 28 → 14 → 10 → 5, 16·5·5 features
    ("cfl_cnn", (3, 32, 32), 10, conv(3, 6) + conv(6, 16) + linear(400, 10)),
    # CFL-GP F.8 on EMNIST byclass: 28 → 24 → 12 → 8 → 4, 16·4·4 features
    ("cfl_cnn", (1, 28, 28), 62, conv(1, 6) + conv(6, 16) + linear(256, 62)),
    # LeNet-5 on CIFAR-10 (62,006)
    ("cam_cnn", (3, 32, 32), 10,
     conv(3, 6) + conv(6, 16) + linear(400, 120) + linear(120, 84) + linear(84, 10)),
    # LEAF's FEMNIST CNN: same-padded, 28 → 14 → 7, 64·7·7 features
    ("leaf_cnn", (1, 28, 28), 62, conv(1, 32) + conv(32, 64) + linear(3136, 2048)
     + linear(2048, 62)),
])
def test_parameter_counts(name: str, shape: tuple[int, ...], classes: int, expected: int) -> None:
    fac = ModelFactory(model_config({"name": name}), shape, classes)
    assert fac.size == expected
    out = fac.build()(torch.zeros(2, *shape))
    assert out.shape == (2, classes)


def test_counts_match_the_sources() -> None:
    assert ModelFactory(model_config({"name": "cam_cnn"}), (3, 32, 32), 10).size == 62_006
    assert ModelFactory(model_config({"name": "cfl_cnn"}), (3, 32, 32), 10).size == 6_882


def test_too_small_images_are_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="too small for two valid 5x5") as err:
        ModelFactory(model_config({"name": "cfl_cnn"}), (1, 8, 8), 10)
    assert err.value.field == "model.name"


@pytest.mark.parametrize(("name", "shape"), [("cfl_cnn", (3, 32, 32)), ("cam_cnn", (1, 28, 28))])
def test_simulation_backend_trains_as_the_reference(name: str, shape: tuple[int, ...],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        fed = make_federation(shape, "classification", [6, 9, 3, 5])
        fac = ModelFactory(model_config({"name": name}), shape, fed.n_outputs)
        sim, seq = SimulationBackend(fed, fac, 4), SequentialBackend(fed, fac)
        kernel = sim.engine.kernel
        if isinstance(kernel, GenericKernel):  # vmapped: never the per-client loop
            monkeypatch.setattr(GenericKernel, "_loop_grads", lambda *a, **k: 1 / 0)
        req = train_request(fac, name, "sgd", fed.n_clients)
        a, b = sim.train(req), seq.train(req)
        close(a.params, b.params, torch.float64)
    finally:
        torch.set_default_dtype(old)


def _patterns(n_clients: int, side: int, seed: int = 0) -> Federation:
    """Class k lights the k-th quarter of the image (plus noise): learnable in a few steps."""
    rng = np.random.default_rng(seed)

    def part(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 4, n)
        x = rng.normal(0, 0.3, (n, 1, side, side)).astype(np.float32)
        h = side // 2
        for k, (r, c) in enumerate([(0, 0), (0, h), (h, 0), (h, h)]):
            x[y == k, :, r:r + h, c:c + h] += 1.0
        return x, y

    return Federation.from_clients([(*part(24), *part(8)) for _ in range(n_clients)],
                                   n_classes=4, name="patterns")


@pytest.mark.parametrize("model", [{"name": "cfl_cnn"}, {"name": "cam_cnn"},
                                   {"name": "leaf_cnn", "hidden": 32}])
def test_fedavg_with_each_paper_cnn_lowers_the_loss(model: dict, tmp_path) -> None:
    cfg = {"seed": 0, "rounds": 6, "eval_every": 1, "checkpoint_every": 0,
           "model": model,
           "train": {"lr": 0.05, "batch_size": 8, "steps": 6, "momentum": 0.9},
           "algorithm": {"name": "fedavg"}, "output": {"figures": False, "progress": "off"}}
    fed = _patterns(3, 16)
    history = Experiment.from_config(cfg, out_dir=tmp_path, federation=fed).run(progress=False)
    losses = [LossExtras.from_dict(r.extras).train_loss for r in history.records]
    assert all(v is not None and np.isfinite(v) for v in losses), losses
    assert float(losses[-1] or 0) < 0.8 * float(losses[0] or 0), losses


def test_resnet18_weight_sharing_under_cfl_gp(tmp_path) -> None:
    """CFL-GP App. F.7: every layer but the last (`fc`) shared by the K models, features
    from `fc` only; after a few rounds the K models agree on the shared layers and differ
    on `fc`."""
    cfg = {"seed": 0, "rounds": 3, "eval_every": 1, "checkpoint_every": 0,
           "model": {"name": "resnet18", "width": 4},
           "train": {"lr": 0.05, "batch_size": 8, "steps": 2},
           "algorithm": {"name": "cfl_gp", "n_clusters": 2, "period": 1,
                         "feature_layers": ["fc"],
                         "shared_layers": ["conv1", "norm1", "layer1", "layer2", "layer3",
                                           "layer4"]},
           "output": {"figures": False, "progress": "off"}}
    exp = Experiment.from_config(cfg, out_dir=tmp_path, federation=_patterns(4, 16))
    exp.run(progress=False)
    models = exp.algorithm.state.models
    layout = exp.factory.layout
    shared = layout.index(cfg["algorithm"]["shared_layers"])
    head = layout.index(["fc"])
    assert len(models) == 2 and len(shared) + len(head) == layout.size
    torch.testing.assert_close(models[0, shared], models[1, shared], rtol=0, atol=0)
    assert not torch.equal(models[0, head], models[1, head])
