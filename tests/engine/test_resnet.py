"""The built-in `resnet18` (CIFAR-variant ResNet-18 with GroupNorm, CFL-GP App. F.7).

Its shape and parameter count (11,173,962 at width 64, 10 classes: ResNet-18 for CIFAR),
that the generic kernel runs it under `vmap` (no per-client loop), that the simulation backend
gives the sequential reference's replies on a narrow net (width 4, 3x8x8 inputs), that a bad
option is a one-line error naming the field, and that a tiny federation's loss falls.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from tests.engine.test_equivalence import (
    FILLED,
    SIZES,
    close,
    make_federation,
    predictor_for,
    train_request,
)
from tests.tiny import tiny_config

from clusterfl.algorithms.common import LossExtras
from clusterfl.backends.sequential import SequentialBackend
from clusterfl.backends.simulation import SimulationBackend
from clusterfl.config import load_config
from clusterfl.engine.generic import GenericKernel
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment
from clusterfl.models import ModelFactory, ResNet18, ResNet18Config, model_config
from clusterfl.protocol import (
    EvaluateRequest,
    GradientRequest,
    LossRequest,
    Predictor,
    TrainRequest,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny nets: one thread is faster

SMALL = {"name": "resnet18", "width": 4, "groups": 2}
SHAPE = (3, 8, 8)  # 8x8 → 8, 4, 2, 1 through the four stages


@pytest.fixture
def float64() -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def setup(sizes: list[int], chunk_size: int = 4):
    """(federation, factory, sequential backend, simulation backend) for the narrow ResNet."""
    fed = make_federation(SHAPE, "classification", sizes)
    fac = ModelFactory(model_config(SMALL), SHAPE, fed.n_outputs)
    return fed, fac, SequentialBackend(fed, fac), SimulationBackend(fed, fac, chunk_size)


# --------------------------------------------------------------------------- the architecture


def resnet18_cifar_parameters(c_in: int, width: int, classes: int) -> int:
    """The parameter count from the layer shapes: bias-free convolutions, two affine
    parameters per GroupNorm channel, a 1x1 projection (+ GroupNorm) where the shape changes."""

    def gn(c: int) -> int:
        return 2 * c

    def block(a: int, b: int) -> int:
        body = 9 * a * b + gn(b) + 9 * b * b + gn(b)
        return body + (a * b + gn(b) if a != b else 0)

    total = 9 * c_in * width + gn(width)  # stem
    c = width
    for c_out in (width, 2 * width, 4 * width, 8 * width):
        total += block(c, c_out) + block(c_out, c_out)
        c = c_out
    return total + c * classes + classes  # linear head


def test_shape_and_parameter_count_of_resnet18_for_cifar() -> None:
    expected = resnet18_cifar_parameters(3, 64, 10)
    assert expected == 11_173_962  # the known count of ResNet-18 for CIFAR-10
    config = model_config({"name": "resnet18"})
    assert isinstance(config, ResNet18Config) and (config.width, config.groups) == (64, 2)
    fac = ModelFactory(config, (3, 32, 32), 10)
    assert fac.size == expected
    model = fac.build()
    assert isinstance(model, ResNet18)
    with torch.no_grad():
        assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs[0].kernel_size == (3, 3) and convs[0].stride == (1, 1)  # CIFAR stem
    assert len(convs) == 1 + 16 + 3  # stem, 8 blocks of two, 3 projections
    assert not any(isinstance(m, (torch.nn.MaxPool2d, torch.nn.BatchNorm2d))
                   for m in model.modules())
    norms = [m for m in model.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert len(norms) == len(convs) and {m.num_groups for m in norms} == {2}
    # min(groups, channels): 16 groups on a width-8 net are 8 in the first stage
    narrow = ModelFactory(model_config({"name": "resnet18", "width": 8, "groups": 16}),
                          (1, 16, 16), 4)
    assert narrow.size == resnet18_cifar_parameters(1, 8, 4)
    groups = [m.num_groups for m in narrow.build().modules() if isinstance(m, torch.nn.GroupNorm)]
    assert groups[0] == 8 and groups[-1] == 16


# --------------------------------------------------------------------------- vmap


def test_the_generic_kernel_vmaps_resnet18(monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """No per-client fallback: GenericKernel keeps `use_vmap` and never loops."""

    def no_loop(*args: object, **kwargs: object) -> None:
        raise AssertionError("GenericKernel fell back to its per-client loop")

    monkeypatch.setattr(GenericKernel, "_loop_grads", no_loop)
    fed, fac, _, sim = setup(FILLED)
    kernel = sim.engine.kernel
    assert type(kernel) is GenericKernel
    with caplog.at_level(logging.INFO, logger="clusterfl.engine.generic"):
        sim.train(train_request(fac, "resnet18", "sgd", fed.n_clients))
        n = fed.n_clients
        pred = Predictor.single(fac.init_many(n, seed=5), np.arange(n)[::-1].copy())
        sim.evaluate(EvaluateRequest(np.arange(n), pred, "test"))  # the vmapped forward
    assert kernel.use_vmap
    assert "vmap failed" not in caplog.text


# --------------------------------------------------------------------------- the reference


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("setting", ["sgd", "adam", "prox", "offset"])
def test_train_matches_reference(setting: str) -> None:
    sizes = FILLED if setting == "offset" else SIZES
    fed, fac, seq, sim = setup(sizes)
    req = train_request(fac, "resnet18", setting, fed.n_clients)
    a, b = sim.train(req), seq.train(req)
    assert a.params.dtype == torch.float64
    close(a.params, b.params, torch.float64)
    close(a.loss, b.loss, torch.float64)
    np.testing.assert_array_equal(a.n_samples, b.n_samples)
    if 0 in sizes:  # the client without data is returned unchanged, with a NaN loss
        i = sizes.index(0)
        assert torch.equal(a.params[i], req.models[req.model_of_client[i]])
        assert np.isnan(a.loss[i])


def test_train_matches_reference_float32() -> None:
    fed, fac, seq, sim = setup(FILLED)
    req: TrainRequest = train_request(fac, "resnet18", "momentum_wd", fed.n_clients)
    a, b = sim.train(req), seq.train(req)
    assert a.params.dtype == torch.float32
    close(a.params, b.params, torch.float32)
    close(a.loss, b.loss, torch.float32)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("batch", [8, None])
def test_gradient_matches_reference(batch: int | None) -> None:
    fed, fac, seq, sim = setup([13, 40, 5, 27, 9], chunk_size=3)
    req = GradientRequest(np.arange(fed.n_clients), fac.init_many(3, seed=2),
                          np.array([2, 0, 1, 0, 2]), batch, seed=5)
    a, b = sim.gradient(req), seq.gradient(req)
    close(a.grads, b.grads, torch.float64)
    close(a.loss, b.loss, torch.float64)
    np.testing.assert_array_equal(a.n_samples, b.n_samples)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("with_offset", [False, True])
def test_losses_match_reference(with_offset: bool) -> None:
    fed, fac, seq, sim = setup(FILLED)
    clients = np.array([5, 0, 1, 3, 4])
    offset = None
    if with_offset:
        offset = Predictor.single(fac.init_many(2, seed=4), np.array([0, 1, 1, 0, 1]))
    for split in ("train", "test"):
        req = LossRequest(clients, fac.init_many(3, seed=3), split, offset)
        a, b = sim.losses(req), seq.losses(req)
        close(a.loss, b.loss, torch.float64)
        close(a.accuracy, b.accuracy, torch.float64)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("how", ["single", "own_models", "sum_logits"])
def test_evaluate_matches_reference(how: str) -> None:
    fed, fac, seq, sim = setup(FILLED)
    n = fed.n_clients
    req = EvaluateRequest(np.arange(n), predictor_for(fac, n, how), "test")
    a, b = sim.evaluate(req), seq.evaluate(req)
    for field in ("accuracy", "macro_f1", "loss"):
        close(getattr(a, field), getattr(b, field), torch.float64)
    np.testing.assert_array_equal(a.n_samples, b.n_samples)


# --------------------------------------------------------------------------- the config


@pytest.mark.parametrize(("raw", "field"), [
    ({"groups": 0}, "model.groups"),
    ({"width": 0}, "model.width"),
    ({"groups": 3}, "model.groups"),  # 3 does not divide 64 channels
    ({"width": 6, "groups": 4}, "model.groups"),
    ({"shared": ["fc"]}, "model.shared"),  # not an option (yet)
])
def test_a_bad_option_is_a_one_line_error_naming_the_field(raw: dict, field: str) -> None:
    for parse in (lambda r: model_config(r),
                  lambda r: load_config(tiny_config(model=r))):
        with pytest.raises(ConfigError) as err:
            parse({"name": "resnet18", **raw})
        assert err.value.field == field and "\n" not in str(err.value)
    if field == "model.groups" and raw["groups"]:
        assert "min(groups, channels)" in str(err.value)


# --------------------------------------------------------------------------- a whole run


def test_a_tiny_federation_trains_resnet18(tmp_path) -> None:
    """FedAvg on the digits (1x8x8) with a width-4 ResNet: the mean local loss falls."""
    cfg = tiny_config(rounds=5, n_clients=4, steps=3, algorithm={"name": "fedavg"},
                      model={"name": "resnet18", "width": 4})
    cfg["train"]["lr"] = 0.05
    history = Experiment.from_config(cfg, out_dir=tmp_path).run(progress=False)
    losses = [LossExtras.from_dict(r.extras).train_loss for r in history.records]
    assert len(losses) == 5 and all(v is not None and np.isfinite(v) for v in losses), losses
    first, last = float(losses[0] or 0), float(losses[-1] or 0)
    assert last < 0.95 * first, losses  # 2.58 -> 2.21 here
    assert history.final.metrics is not None and history.final.metrics.loss is not None
