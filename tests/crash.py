"""A run that stops mid-way (the process 'dies' at the start of a round) and is resumed from
its checkpoint, and the timing-free form its records are compared in: the helpers the resume
tests share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clusterfl.experiment import Experiment, History
from clusterfl.records import RoundRecord, RunSummary


class StopError(Exception):
    """Stands in for the process dying."""


def crash_then_resume(cfg: dict[str, Any], out: Path, stop_at: int) -> tuple[Experiment, History]:
    """Run `cfg` into `out` until it dies at the start of round `stop_at` (after the
    checkpoints before it), then resume it there; returns the resumed experiment and history."""
    broken = Experiment.from_config(cfg, out_dir=out)
    real = broken.algorithm.run_round

    def dies(ctx: Any, t: int) -> Any:
        if t == stop_at:
            raise StopError
        return real(ctx, t)

    broken.algorithm.run_round = dies  # type: ignore[method-assign]
    with pytest.raises(StopError):
        broken.run(progress=False)
    resumed = Experiment.from_config(cfg, out_dir=out)
    return resumed, resumed.run(resume=True, progress=False)


def timing_free(obj: Any) -> Any:
    """Records and summaries in their JSON form without wall times (they differ from run to
    run), for comparing two runs."""
    if isinstance(obj, RoundRecord | RunSummary):
        return timing_free(obj.to_json_dict())
    if isinstance(obj, dict):
        return {k: timing_free(v) for k, v in obj.items()
                if k != "wall_time" and not k.endswith("_seconds")}
    if isinstance(obj, list):
        return [timing_free(v) for v in obj]
    return obj
