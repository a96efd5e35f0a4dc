"""The `flower` backend: every method on Flower (flwr 1.41.0) through the Message API.

Only the backend lives here (neither module imports Flower at import time):

- `codec`: generic wire format of protocol dataclasses (RecordDict ⇄ request/reply).
- `backend`: `FlowerBackend`, one message per selected client over the ServerApp's Grid;
  `FlowerSession` / `active_session` (the Grid of the running ServerApp); `FlowerConfig`,
  the `[backend]` table of `name = "flower"`.

The deployment side — the ServerApp and ClientApp, the Flower App project, what a node does
with a message, the node worker, the local launcher and test certificates — is
`clusterfl.deploy`. See docs/deploy.md for a several-machine deployment with TLS and node
authentication.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FLOWER_VERSION = "1.41.0"
"""The Flower release this backend is built and tested against (pinned)."""

FLOWER_FILE = "flower.json"
"""A Flower run's node map, dropouts and message counts, in its run directory."""


def write_flower_json(run_dir: Path, report: dict[str, Any]) -> None:
    """`run_dir/flower.json`, whole or not at all; a write that fails (a full disk) is one
    line naming it (the run's own files, written before it, are intact)."""
    import json

    from clusterfl.errors import write_error
    from clusterfl.files import write_whole

    path = run_dir / FLOWER_FILE
    try:
        write_whole(path, json.dumps(report, indent=2))
    except OSError as exc:
        raise write_error(exc, path, "the Flower run's node map and message counts", "the "
                          "run's own files (summary.json, history.jsonl) are intact") from None
