"""The small CNNs the papers train on CIFAR-10 and EMNIST (registered in `clusterfl.models`).

`ValidCNN` is the family: two 5×5 convolutions without padding ("valid"), each followed by
ReLU and 2×2 max-pooling, then fully-connected layers. Two settings have a name:

- `cfl_cnn` — CFL (Sattler et al. 2020) and CFL-GP's EMNIST CNN.
  Paper (CFL §V-C, Fig. 9): "a five-layer convolutional neural network" on CIFAR-10, trained
  with three local epochs at batch size 100; no layer sizes. Authors' code (the CFL
  repository's `ConvNet`, which CFL-GP's released code reuses for EMNIST, App. F.8 "the
  convolutional neural network architecture from (Sattler, 2020)"): conv5-6 → pool →
  conv5-16 → pool → one linear layer, i.e. five layers counting the poolings. We follow the
  code: 6,882 parameters on CIFAR-10 (3×32×32, 10 classes), 18,506 on EMNIST byclass
  (1×28×28, 62 classes).
- `cam_cnn` — CAM's (Ma et al. 2023) CIFAR-10 CNN. Paper (§5): "the Convolutional Neural
  Network (CNN) [32] ... as detailed in the supplementary material", [32] being LeCun,
  Bengio and Hinton 2015; the supplementary material is not public. Our choice: LeNet-5 as
  federated benchmarks use it on CIFAR-10 (conv5-6 → pool → conv5-16 → pool → 120 → 84 →
  out, 62,006 parameters for 10 classes).

LEAF's FEMNIST CNN (FLT App. C.3) is `leaf_cnn` and ResNet-18 (CFL-GP App. F.7) `resnet18`,
both in `clusterfl.models.zoo`.
"""

from __future__ import annotations

import torch
from torch import nn

from clusterfl.models.zoo import dense_head, image_shape


class ValidCNN(nn.Module):
    """conv5(valid)-c1 → ReLU → pool2 → conv5(valid)-c2 → ReLU → pool2 → `hidden` → outputs."""

    def __init__(self, input_shape: tuple[int, ...], n_outputs: int,
                 channels: tuple[int, int] = (6, 16), hidden: tuple[int, ...] = ()) -> None:
        super().__init__()
        c_in, h, w = image_shape(input_shape)
        side_h, side_w = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
        if side_h < 1 or side_w < 1:
            raise ValueError(f"images of {h}x{w} are too small for two valid 5x5 convolutions "
                             "with pooling (at least 16x16)")
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(c_in, c1, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = dense_head([c2 * side_h * side_w, *hidden, n_outputs])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))
