"""The packages added for issue 24 (tensorboard; the hf extra: datasets, flwr-datasets) are
installed by the dev extra and require no torch of their own: torch stays 2.13.0."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_tensorboard_and_the_hf_extra_pull_no_torch():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    hf = project["optional-dependencies"]["hf"]
    assert set(hf) <= set(project["optional-dependencies"]["dev"])  # the tests exercise them
    assert any(d.startswith("tensorboard") for d in project["dependencies"])
    for dist in ("tensorboard", "datasets", "flwr-datasets"):
        required = [r for r in metadata.requires(dist) or [] if "extra ==" not in r]
        names = {re.split(r"[ <>=!;\[~]", r, maxsplit=1)[0].lower() for r in required}
        assert not {"torch", "torchvision"} & names, (dist, names)
    assert metadata.version("torch").startswith("2.13.0")
