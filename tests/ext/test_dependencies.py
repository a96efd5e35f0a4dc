"""The packages added for issue 24 (tensorboard; the hf extra: datasets, flwr-datasets) are
installed by the dev extra and require no torch of their own: torch stays 2.13.0."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_tensorboard_and_the_hf_extra_pull_no_torch():
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    # the tests exercise them: dev pulls all, all pulls hf and tensorboard (issue 35: extras)
    assert "clusterfl[all]" in extras["dev"]
    assert {"hf", "tensorboard"} <= set(extras["all"][0].split("[")[1].rstrip("]").split(","))
    assert any(d.startswith("tensorboard") for d in extras["tensorboard"])
    for dist in ("tensorboard", "datasets", "flwr-datasets"):
        required = [r for r in metadata.requires(dist) or [] if "extra ==" not in r]
        names = {re.split(r"[ <>=!;\[~]", r, maxsplit=1)[0].lower() for r in required}
        assert not {"torch", "torchvision"} & names, (dist, names)
    assert metadata.version("torch").startswith("2.13.0")
