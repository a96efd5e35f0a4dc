import numpy as np
import pytest
import torch

from clusterfl.errors import ConfigError
from clusterfl.models import ModelFactory, get_flat, model_config, set_flat


@pytest.mark.parametrize(
    "raw, shape",
    [
        ({"name": "mlp", "hidden": [200]}, (1, 28, 28)),
        ({"name": "lenet"}, (1, 28, 28)),
        ({"name": "lenet", "groups": 2}, (1, 8, 8)),
        ({"name": "lenet", "channels": [8, 16], "hidden": [], "downsample": "stride"},
         (1, 28, 28)),
        ({"name": "leaf_cnn", "hidden": 64}, (1, 28, 28)),
        ({"name": "linear"}, (1,)),
        ({"name": "conv_ae"}, (1, 28, 28)),
    ],
)
def test_factory_builds_and_roundtrips(raw, shape):
    f = ModelFactory(model_config(raw), shape, 10)
    w = f.init(3)
    assert w.shape == (f.size,)
    assert torch.equal(w, f.init(3)) and not torch.equal(w, f.init(4))
    m = f.build()
    set_flat(m, w)
    assert torch.equal(get_flat(m), w)
    views = f.layout.views(torch.stack([w, 2 * w]))
    name = f.layout.names[0]
    assert torch.equal(views[name][1], 2 * dict(m.named_parameters())[name].detach())


def test_paper_parameter_counts():
    # FLT App. C.3: MLP 784-200-10 has 159,010 parameters (+ the paper's 169,462 is for 62
    # classes: 784*200+200+200*62+62 = 169,462); the ConvAE has 51,577.
    assert ModelFactory(model_config({"name": "mlp"}), (1, 28, 28), 62).size == 169_462
    assert ModelFactory(model_config({"name": "conv_ae"}), (1, 28, 28), 10).size == 51_577


def test_layer_index_selects_named_layers():
    f = ModelFactory(model_config({"name": "mlp", "hidden": [4]}), (3,), 2)
    idx = f.layout.index(["layers.1"])
    assert idx.tolist() == list(range(3 * 4 + 4, f.size))
    with pytest.raises(KeyError, match="no parameter matches"):
        f.layout.index(["conv"])


def test_small_cnn_options_change_the_layers():
    # stride-2 convolutions and a single linear head: 1*8*25+8 + 8*16*25+16 + 784*10+10
    small = model_config({"name": "lenet", "channels": [8, 16], "hidden": [],
                          "downsample": "stride"})
    f = ModelFactory(small, (1, 28, 28), 10)
    assert f.size == 208 + 3216 + 7850
    m = f.build()
    assert not any(isinstance(x, torch.nn.MaxPool2d) for x in m.modules())
    assert [c.stride for c in m.modules() if isinstance(c, torch.nn.Conv2d)] == [(2, 2)] * 2
    assert m(torch.rand(2, 1, 28, 28)).shape == (2, 10)
    deep = ModelFactory(model_config({"name": "lenet", "hidden": [32, 16, 8]}), (1, 28, 28), 10)
    widths = [x.out_features for x in deep.build().modules() if isinstance(x, torch.nn.Linear)]
    assert widths == [32, 16, 8, 10]


def test_model_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"model\.downsample"):
        model_config({"name": "lenet", "downsample": "avgpool"})
    with pytest.raises(ConfigError, match=r"model\.name: unknown value 'resnet'; allowed: .*mlp"):
        model_config({"name": "resnet"})
    with pytest.raises(ConfigError, match=r"model\.dropout"):
        model_config({"name": "mlp", "dropout": 1.5})
    with pytest.raises(ConfigError, match=r"model\.hiden: unknown field; allowed fields here"):
        model_config({"name": "mlp", "hiden": [3]})


def test_convae_reconstructs_shape():
    f = ModelFactory(model_config({"name": "conv_ae"}), (1, 28, 28), 10)
    m = f.build()
    x = torch.rand(3, 1, 28, 28)
    assert m(x).shape == x.shape and m.encode(x).shape == (3, 128)
    assert np.isfinite(m(x).detach().numpy()).all()
