"""Issue 35, "Models and methods of one's own": a module vmap cannot trace trains by the
per-client loop; a model of the wrong output width or shape, or without parameters, and a
method class missing its hooks or returning an assignment of the wrong length, each fail in
one line naming the model or the method."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from clusterfl.algorithms import Algorithm, AlgorithmConfig, algorithm_class, checked_assignment
from clusterfl.config import load_config
from clusterfl.engine.generic import GenericKernel
from clusterfl.errors import ClusterFLError, ConfigError
from clusterfl.experiment import Experiment
from clusterfl.models import ParamLayout
from clusterfl.plugins import OwnCodeError
from tests.core.conftest import blob_federation

HERE = "tests.core.test_hostile_models"


class BatchNormNet(nn.Module):
    """Linear → BatchNorm → ReLU → linear: BatchNorm updates its running statistics in place,
    which `torch.func` transforms refuse."""

    def __init__(self, input_shape: tuple[int, ...], n_outputs: int) -> None:
        super().__init__()
        self.a = nn.Linear(int(np.prod(input_shape)), 8)
        self.bn = nn.BatchNorm1d(8)
        self.b = nn.Linear(8, n_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.bn(self.a(x.flatten(1)))))


class Width(nn.Module):
    """A model that ignores `n_outputs` and outputs `width` logits (`shape3d`: [B, 2, width])."""

    def __init__(self, input_shape: tuple[int, ...], width: int = 2,
                 shape3d: bool = False) -> None:
        super().__init__()
        self.shape3d = shape3d
        self.lin = nn.Linear(int(np.prod(input_shape)), 2 * width if shape3d else width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x.flatten(1))
        return out.view(len(x), 2, -1) if self.shape3d else out


class NoParameters(nn.Module):
    def __init__(self, n_outputs: int) -> None:
        super().__init__()
        self.k = n_outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)[:, : self.k]


class TrainsNowhere(nn.Module):
    """Evaluates, but fails whenever it is trained (under vmap and under autograd alike)."""

    def __init__(self, input_shape: tuple[int, ...], n_outputs: int) -> None:
        super().__init__()
        self.lin = nn.Linear(int(np.prod(input_shape)), n_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            raise RuntimeError("this layer cannot train\nsecond line of a long message")
        return self.lin(x.flatten(1))


class HollowConfig(AlgorithmConfig):
    name: str = "hollow"


class Hollow(Algorithm):
    """A method class with its options and nothing else."""

    name = "hollow"
    Config = HollowConfig


def _config(model: dict, backend: str = "simulation") -> dict:
    return {"seed": 0, "rounds": 2, "eval_every": 1, "checkpoint_every": 0, "model": model,
            "train": {"lr": 0.1, "batch_size": 8, "epochs": 1},
            "backend": {"name": backend}, "output": {"figures": False, "progress": "off"}}


def test_a_batchnorm_model_trains_on_the_default_backend_by_the_per_client_loop():
    fed = blob_federation(n_clients=4, per_client=20)
    model = {"name": f"{HERE}:BatchNormNet"}
    runs = {}
    for backend in ("simulation", "sequential"):
        exp = Experiment(load_config(_config(model, backend)), federation=fed)
        exp.run(progress=False)
        runs[backend] = exp.algorithm.state.model
    # the global model equals the reference loop's (the sequential backend), up to rounding
    assert torch.allclose(runs["simulation"], runs["sequential"], atol=1e-5)
    start = Experiment(load_config(_config(model)), federation=fed).factory.init(0)
    assert not torch.allclose(runs["simulation"][0], start)  # it trained


def test_the_generic_kernel_loop_gives_each_clients_autograd_gradient():
    from clusterfl.engine.stacked import StepBatch

    torch.manual_seed(0)
    module = BatchNormNet((5,), 3)
    kernel = GenericKernel(module, ParamLayout(module))
    params = [torch.stack([p.detach() + 0.1 * j for j in range(2)]) for p in module.parameters()]
    x, y = torch.randn(2, 6, 5), torch.randint(0, 3, (2, 6))
    w = torch.full((2, 6), 1 / 6)
    got: dict[int, torch.Tensor] = {}

    class Sink:
        def grad(self, i: int, g: torch.Tensor) -> None:
            got[i] = g  # parameter i's gradients, stacked over the clients

    batch = StepBatch(x=x, y=y, w=w, offset=None, task="classification",
                      generator=torch.Generator().manual_seed(0))
    kernel.train_step(params, batch, Sink())
    assert kernel.use_vmap is False  # vmap refused BatchNorm; the loop took over
    for c in range(2):  # each client's gradient is plain autograd's on its own parameters
        own = BatchNormNet((5,), 3)
        with torch.no_grad():
            for p, q in zip(own.parameters(), params):
                p.copy_(q[c])
        loss = (nn.functional.cross_entropy(own.train()(x[c]), y[c], reduction="none")
                * w[c]).sum()
        expected = torch.autograd.grad(loss, list(own.parameters()))
        for i, e in enumerate(expected):
            assert torch.allclose(got[i][c], e, atol=1e-6)


@pytest.mark.parametrize("backend", ["simulation", "sequential"])
@pytest.mark.parametrize(("model", "batch_size", "error", "line"), [
    ("TrainsNowhere", 8, "RuntimeError: this layer cannot train", "in forward"),
    # BatchNorm on a batch of one sample: torch refuses to train it, under either backend
    ("BatchNormNet", 1, "ValueError: Expected more than 1 value per channel", "in forward"),
])
def test_a_model_that_cannot_train_under_autograd_names_its_line_on_either_backend(
        backend: str, model: str, batch_size: int, error: str, line: str):
    """Before: the simulation backend said `use [backend] name = "sequential"`, where the
    model fails the same way (it runs the same autograd): now both name the model's line."""
    fed = blob_federation(n_clients=3, per_client=10)
    config = _config({"name": f"{HERE}:{model}"}, backend)
    config["train"]["batch_size"] = batch_size
    exp = Experiment(load_config(config), federation=fed)
    with pytest.raises(OwnCodeError) as err:
        exp.run(progress=False)
    text = str(err.value)
    kind, message = error.split(": ", 1)
    assert text.startswith(f"model.name {HERE}:{model} raised {kind} in round 1: {message}")
    assert "test_hostile_models.py:" in text and text.endswith(f"{line})")
    assert "sequential" not in text and "\n" not in text


@pytest.mark.parametrize(("model", "got"), [
    ({"width": 2}, "[2, 2]"),                    # too few logits (3 classes)
    ({"width": 7}, "[2, 7]"),                    # too many logits
    ({"width": 3, "shape3d": True}, "[2, 2, 3]"),  # a 3-D output
])
def test_a_model_with_too_few_or_too_many_logits_or_a_3d_output_fails_at_setup(model, got):
    fed = blob_federation(n_clients=3, per_client=10)  # 3 classes, inputs of 5 features
    with pytest.raises(ConfigError) as err:
        Experiment(load_config(_config({"name": f"{HERE}:Width", **model})), federation=fed)
    assert err.value.field == "model.name" and f"{HERE}:Width" in err.value.message
    assert f"to {got}" in err.value.message and "[batch, 3]" in err.value.message
    assert "\n" not in str(err.value)


def test_a_parameterless_model_fails_at_setup_naming_the_model():
    fed = blob_federation(n_clients=3, per_client=10)
    with pytest.raises(ConfigError) as err:
        Experiment(load_config(_config({"name": f"{HERE}:NoParameters"})), federation=fed)
    assert err.value.field == "model.name" and "no trainable parameters" in err.value.message
    assert "NoParameters" in err.value.message


def test_a_model_of_the_right_width_passes_the_setup_check():
    fed = blob_federation(n_clients=3, per_client=10)
    exp = Experiment(load_config(_config({"name": f"{HERE}:Width", "width": 3})), federation=fed)
    assert exp.factory.size == 5 * 3 + 3


def test_an_algorithm_class_missing_its_methods_fails_in_one_line():
    with pytest.raises(ConfigError) as err:
        algorithm_class(f"{HERE}:Hollow")
    msg = err.value.message
    assert err.value.field == "algorithm.name"
    for hook in ("assignment", "predictor", "setup", "ask", "update", "State"):
        assert hook in msg
    assert "\n" not in str(err.value)


class _Fixed:
    """Stands in for a method: `assignment()` returns the given ids."""

    def __init__(self, ids: object) -> None:
        self.ids = ids

    def assignment(self) -> object:
        return self.ids


@pytest.mark.parametrize("ids", [np.zeros(3, np.int64), np.zeros((6, 1), np.int64),
                                 np.full(6, 0.5)])
def test_an_assignment_of_the_wrong_length_fails_naming_the_method(ids):
    with pytest.raises(ClusterFLError) as err:
        checked_assignment(_Fixed(ids), 6)
    assert f"{HERE}:_Fixed.assignment()" in str(err.value) and "6 clients" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_right_assignment_passes_unchanged():
    got = checked_assignment(_Fixed([0, 1, -1, 1]), 4)
    assert got.dtype == np.int64 and got.tolist() == [0, 1, -1, 1]


@pytest.mark.parametrize(("model", "field"), [
    ({"name": "mlp", "hidden": [0]}, "model.hidden[0]"),
    ({"name": "mlp", "hidden": [64, -5]}, "model.hidden[1]"),
    ({"name": "lenet", "channels": [0, 16]}, "model.channels[0]"),
    ({"name": "lenet", "hidden": [120, 0]}, "model.hidden[1]"),
    ({"name": "cfl_cnn", "channels": [6, -1]}, "model.channels[1]"),
    ({"name": "cam_cnn", "hidden": [0]}, "model.hidden[0]"),
])
def test_a_built_in_model_with_a_zero_or_negative_width_fails_naming_the_width(model, field):
    # hidden = [0] trained a constant model silently (exit 0); [-5] ended in torch's traceback
    with pytest.raises(ConfigError) as err:
        load_config({"data": {"source": "digits"}, "model": model})
    assert err.value.field == field and "greater than or equal to 1" in err.value.message


def test_an_empty_hidden_list_still_builds_a_one_layer_model():
    config = load_config({"data": {"source": "digits"}, "model": {"name": "mlp", "hidden": []}})
    assert config.model.hidden == []
