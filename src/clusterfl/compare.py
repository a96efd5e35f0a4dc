"""Run several methods on the same federation and write one comparison report."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from clusterfl.config import Config
from clusterfl.errors import ConfigError
from clusterfl.experiment import Experiment, History, build_federation, claim_run_dir


def parse_algorithm_spec(spec: str) -> dict[str, Any]:
    """`"fedprox:mu=0.1:fraction=0.5"` → `{"name": "fedprox", "mu": 0.1, "fraction": 0.5}`."""
    name, *pairs = [p.strip() for p in spec.split(":")]
    if not name:
        raise ConfigError("--algorithms", f"empty method name in {spec!r}")
    out: dict[str, Any] = {"name": name}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError("--algorithms", f"expected key=value after ':' in {spec!r}")
        key, text = pair.split("=", 1)
        try:
            out[key.strip()] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = text
    return out


def run_comparison(
    config: Config, specs: list[str], out_dir: str | Path, progress: bool | None = None,
    overwrite: bool = False, hint: str = "overwrite=True to replace it",
) -> list[tuple[str, History]]:
    """Each method on the one federation built from `config`; returns (label, history).

    `out_dir` holds one comparison: when it is not empty, `overwrite` empties it first
    (otherwise `RunDirInUseError`, whose message ends with `hint`).
    """
    out = Path(out_dir)
    configs = [config.with_algorithm(parse_algorithm_spec(s)) for s in specs]
    claim_run_dir(out, overwrite=overwrite, hint=hint)  # after the specs were validated
    federation = build_federation(config)
    results, run_dirs = [], []
    for spec, cfg in zip(specs, configs):
        run_dir = out / spec.replace(":", "_").replace("=", "-")
        history = Experiment(cfg, run_dir, federation).run(progress=progress)
        results.append((history.summary.label or spec, history))
        run_dirs.append(run_dir)
    from clusterfl.report import write_comparison_report

    write_comparison_report(run_dirs, out)
    return results
