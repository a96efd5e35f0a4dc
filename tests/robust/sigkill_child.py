"""Runs `clusterfl run CONFIG --out OUT --quiet` and kills its own process with a real
SIGKILL at one chosen point of round R (the tests in `test_sigkill.py` then resume it):

- `round`: the round's work is done in memory, nothing of it is written yet;
- `history`: half of the round's history line is written (a torn line), its checkpoint not;
- `checkpoint`: the round's checkpoint is half written to `state.pt.tmp`, not yet renamed.

Usage: python sigkill_child.py CONFIG OUT POINT R"""

from __future__ import annotations

import json
import os
import signal
import sys

from clusterfl import cli, rundir, state
from clusterfl.checkpoint import Checkpoints
from clusterfl.recorder import Recorder


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(config: str, out: str, point: str, at: int) -> int:
    if point == "round":
        watch = Recorder.watch

        def watching(self, t, ctx):  # type: ignore[no-untyped-def]
            if t == at:
                die()
            return watch(self, t, ctx)

        Recorder.watch = watching  # type: ignore[method-assign]
    elif point == "history":
        append = rundir.RunDir.append

        def torn(self, record):  # type: ignore[no-untyped-def]
            if record.round != at:
                return append(self, record)
            line = json.dumps(record.to_json_dict()) + "\n"
            with open(self.path / rundir.HISTORY_FILE, "a") as fh:
                fh.write(line[: len(line) // 2])
                fh.flush()
                os.fsync(fh.fileno())
            die()

        rundir.RunDir.append = torn  # type: ignore[method-assign]
    elif point == "checkpoint":
        save, replace, now = Checkpoints.save, os.replace, {"t": 0}

        def saving(self, t, *args, **kwargs):  # type: ignore[no-untyped-def]
            now["t"] = t
            return save(self, t, *args, **kwargs)

        def half_then_die(src, dst, *args, **kwargs):  # type: ignore[no-untyped-def]
            if now["t"] == at and str(src).endswith("state.pt.tmp"):
                size = os.path.getsize(src)
                os.truncate(src, size // 2)
                die()
            return replace(src, dst, *args, **kwargs)

        Checkpoints.save = saving  # type: ignore[method-assign]
        state.os.replace = half_then_die  # type: ignore[assignment]
    else:
        raise SystemExit(f"point: {point!r}; allowed: round, history, checkpoint")
    return cli.main(["run", config, "--out", out, "--quiet"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
