"""CFL against FedAvg on the synthetic four-topic language-modelling federation: the setting of
tests/engine/test_language_model.py::test_cfl_finds_the_four_topics_and_beats_fedavg, with
its numbers printed (docs/language_model.md).

    PYTHONPATH=src python benchmarks/lm_topics.py [SEED]    (the run's seed; default 0)
"""

from __future__ import annotations

import sys
import time

import torch

from clusterfl.config import load_config
from clusterfl.data.scenarios import make_federation
from clusterfl.data.sources import text_source
from clusterfl.data.text import synthetic_topics
from clusterfl.experiment import Experiment


def main(seed: int = 0) -> None:
    torch.set_num_threads(1)
    scenario = {"n_clients": 20, "seq_len": 10, "vocab_size": 50}
    fed = make_federation(text_source(synthetic_topics(articles=100)), "topics", scenario,
                          seed=seed)
    for name in ("cfl", "fedavg"):
        raw = {"seed": seed, "rounds": 20, "eval_every": 20, "checkpoint_every": 0,
               "data": {"source": "synthetic_topics"}, "scenario": {"name": "topics", **scenario},
               "model": {"name": "lstm", "embed": 16, "hidden": 24},
               "train": {"optimizer": "adam", "lr": 0.01, "momentum": 0.0, "batch_size": 16},
               "algorithm": {"name": name}, "output": {"progress": "off"}}
        t0 = time.perf_counter()
        history = Experiment(load_config(raw), federation=fed).run(progress=False)
        final, m = history.final, history.final.metrics
        splits = [r.round for r in history.records if r.extras.get("split")]
        assert m is not None and m.perplexity is not None and m.accuracy is not None
        print(f"{name}: perplexity {m.perplexity:.2f}, token accuracy {100 * m.accuracy:.1f}%, "
              f"ARI {final.ari}, clusters {final.n_clusters}"
              + (f" (splits in rounds {splits})" if splits else "") + ", "
              f"{time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
