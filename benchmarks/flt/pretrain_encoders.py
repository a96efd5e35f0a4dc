"""Pretrain the two ConvAE encoders the FLT reproduction uses (Enc2 setting of the paper).

fashion_mnist → used for MNIST federations; mnist → used for Fashion-MNIST federations.
Scaled down: 5 epochs each (the authors' code uses 30). Equivalent CLI, per source:
    clusterfl encoder train --source fashion_mnist --epochs 5 \
        --out benchmarks/flt/encoders/conv_ae-fashion_mnist-e5.pt
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from clusterfl import encoders

HERE = Path(__file__).resolve().parent
EPOCHS = 5


def main() -> None:
    for source in sys.argv[1:] or ["fashion_mnist", "mnist"]:
        t0 = time.perf_counter()
        def show(epoch: int, loss: float, name: str = source) -> None:
            print(f"{name} epoch {epoch} loss {loss:.4f}", flush=True)

        enc = encoders.pretrain(source, EPOCHS, latent=128, seed=0, on_epoch=show)
        path = encoders.save(enc, HERE / "encoders" / f"conv_ae-{source}-e{EPOCHS}.pt")
        print(f"{source}: {path} sha256 {enc.sha256} in {time.perf_counter() - t0:.0f} s",
              flush=True)


if __name__ == "__main__":
    main()
