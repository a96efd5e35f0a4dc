"""Time one round of local training of 20 clients on the synthetic four-topic federation for
each way the generic kernel can run the `lstm` model: `cell = "fused"` (nn.LSTM) and
`cell = "written"` (the cell equations written out), each under vmap and under the loop over
clients (docs/language_model.md). Two sizes: the tests' (embed 16, hidden 32, 123 sequences
of 20 tokens per client) and AG News' defaults (embed 128, hidden 256, 8 sequences of 35).

    PYTHONPATH=src python -W ignore benchmarks/lm_kernel.py
"""

from __future__ import annotations

import time

import numpy as np
import torch

from clusterfl.backends.simulation import SimulationBackend
from clusterfl.data.scenarios import make_federation
from clusterfl.engine.generic import GenericKernel
from clusterfl.models import ModelFactory, model_config
from clusterfl.protocol import LocalTraining, TrainRequest

PATHS = (("fused", False), ("fused", True), ("written", False), ("written", True))


def main(repeats: int = 3) -> None:
    torch.set_num_threads(1)
    for embed, hidden, seq_len, per_client in ((16, 32, 20, None), (128, 256, 35, 10)):
        fed = make_federation("synthetic_topics", "topics", {
            "n_clients": 20, "seq_len": seq_len, "vocab_size": 50,
            "n_train_per_client": per_client}, seed=0)
        best: dict[str, float] = {}
        for _ in range(repeats):  # interleaved: the machine's load hits every path alike
            for cell, vmap in PATHS:
                cfg = model_config({"name": "lstm", "embed": embed, "hidden": hidden,
                                    "cell": cell})
                fac = ModelFactory(cfg, fed.input_shape, fed.n_outputs)
                sim = SimulationBackend(fed, fac, 20)
                kernel = sim.engine.kernel
                assert isinstance(kernel, GenericKernel)
                kernel.use_vmap = vmap
                training = LocalTraining(optimizer="adam", lr=0.01, batch_size=16)
                req = TrainRequest(np.arange(20), fac.init_many(1, 0), np.zeros(20, np.int64),
                                   training, 1)
                sim.train(req)  # warm-up
                t0 = time.perf_counter()
                sim.train(req)
                label = f"{cell}, {'vmap' if vmap else 'loop'}"
                best[label] = min(best.get(label, np.inf), time.perf_counter() - t0)
        print(f"embed {embed}, hidden {hidden}, {fed.train_sizes[0]} sequences of {seq_len} "
              "per client: " + ", ".join(f"{k} {v:.2f} s" for k, v in best.items()),
              flush=True)


if __name__ == "__main__":
    main()
