"""Data layer: dataset catalog, sources, transforms, scenarios and the `Federation` they produce."""

# modules that register a reader / scenarios on import (sources.READERS, scenarios.SCENARIOS)
from clusterfl.data import leaf, paper_scenarios  # noqa: F401
from clusterfl.data.catalog import DATASETS, default_data_dir
from clusterfl.data.download import download, verify
from clusterfl.data.federation import Federation
from clusterfl.data.scenarios import SCENARIOS, make_federation, scenario_params
from clusterfl.data.sources import SOURCE_NAMES, Source, load_source

__all__ = [
    "DATASETS",
    "SCENARIOS",
    "SOURCE_NAMES",
    "Federation",
    "Source",
    "default_data_dir",
    "download",
    "load_source",
    "make_federation",
    "scenario_params",
    "verify",
]
