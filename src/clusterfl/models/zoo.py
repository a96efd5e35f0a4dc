"""Built-in architectures. Normalization, where used, is GroupNorm (BatchNorm does not stack).

- `MLP`: input → hidden layers (ReLU, dropout) → outputs. FLT App. C.3 / CFL-GP §5.2 use 784-200-10.
- `LeNet`: a small LeNet-size CNN (conv5-6 → pool → conv5-16 → pool → 120 → 84 → out); the
  widths, the head's hidden layers and stride-2 convolutions instead of pooling are options.
- `LeafCNN`: the LEAF CNN used by FLT (App. C.3): conv5-32 → pool → conv5-64 → pool → 2048 → out.
- `LinearRegression`: y = w·x + b (CFL-GP §5.1 synthetic regression).
- `ConvAE`: FLT's convolutional autoencoder (App. C.3): encoder conv3-16 → conv3-4 → pool →
  linear to a 128-d latent; decoder linear → two transposed convolutions back to the image.
- `ResNet18`: ResNet-18 (He et al. 2016), the model of CFL-GP App. F.7 ("CIFAR10 and
  ResNet18"), in its CIFAR variant (3×3 stride-1 stem, no max-pool) with GroupNorm, which
  Hsieh et al. 2020 ("The non-IID data quagmire") use for federated ResNets.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn


def _flat_size(input_shape: tuple[int, ...]) -> int:
    return int(math.prod(input_shape))


def image_shape(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """`(channels, height, width)` of a convolutional model's input, or a ValueError saying
    that the data's samples are not images (flat features, sequences) and what reads them."""
    if len(input_shape) != 3:
        raise ValueError(f"a convolutional model reads images (channels, height, width); the "
                         f"data has inputs {tuple(input_shape)}: use 'mlp' or 'linear' for "
                         "other inputs (or give images their channel axis, [N, 1, H, W])")
    c_in, h, w = input_shape
    return c_in, h, w


class MLP(nn.Module):
    def __init__(
        self,
        input_shape: tuple[int, ...],
        n_outputs: int,
        hidden: list[int],
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        sizes = [_flat_size(input_shape), *hidden, n_outputs]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))
        self.dropout = float(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(x.shape[0], -1)
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = torch.relu(h)
                if self.dropout > 0:
                    h = nn.functional.dropout(h, self.dropout, self.training)
        return h


def _norm(channels: int, groups: int) -> nn.Module:
    return nn.GroupNorm(min(groups, channels), channels) if groups > 0 else nn.Identity()


def dense_head(sizes: list[int]) -> nn.Sequential:
    """Linear layers of widths `sizes` (input, hidden..., outputs), ReLU between them."""
    head: list[nn.Module] = []
    for j, (a, b) in enumerate(itertools.pairwise(sizes)):
        head.append(nn.Linear(a, b))
        if j < len(sizes) - 2:
            head.append(nn.ReLU())
    return nn.Sequential(*head)


class LeNet(nn.Module):
    """Two 5×5 convolutions, then fully-connected layers.

    `downsample="maxpool"` (LeNet): stride-1 convolutions, each followed by 2×2 max-pooling.
    `downsample="stride"`: each convolution has stride 2 and no pooling follows (four times
    fewer multiply-adds for the same output size). `hidden` lists the hidden widths of the
    head, `()` for a single linear layer on the flattened features.
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        n_outputs: int,
        channels: tuple[int, int] = (6, 16),
        hidden: tuple[int, ...] = (120, 84),
        groups: int = 0,
        downsample: str = "maxpool",
    ) -> None:
        super().__init__()
        if downsample not in ("maxpool", "stride"):
            raise ValueError(f"downsample must be 'maxpool' or 'stride', got {downsample!r}")
        c_in, h, w = image_shape(input_shape)
        c1, c2 = channels
        stride = 2 if downsample == "stride" else 1

        def block(a: int, b: int) -> list[nn.Module]:
            pool = [nn.MaxPool2d(2)] if stride == 1 else []
            return [nn.Conv2d(a, b, 5, stride=stride, padding=2), _norm(b, groups), nn.ReLU(),
                    *pool]

        self.features = nn.Sequential(*block(c_in, c1), *block(c1, c2))
        flat = c2 * (h // 4) * (w // 4)
        self.classifier = dense_head([flat, *hidden, n_outputs])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


class LeafCNN(nn.Module):
    """LEAF's FEMNIST CNN (Caldas et al. 2018), which FLT (App. C.3) uses for FEMNIST.

    LEAF: conv5-32 (same padding) → ReLU → pool2 → conv5-64 → ReLU → pool2 → 2048 → out;
    6,603,710 parameters on 28×28 inputs with 62 classes. FLT's App. C.3 listing of it shows
    one pooling, 63 channels and 3,459,582 parameters, which no reading of it reproduces; we
    follow LEAF. `groups` > 0 adds GroupNorm (our option; off by default).
    """

    def __init__(
        self, input_shape: tuple[int, ...], n_outputs: int, hidden: int = 2048, groups: int = 0
    ) -> None:
        super().__init__()
        c_in, h, w = image_shape(input_shape)
        self.features = nn.Sequential(
            nn.Conv2d(c_in, 32, 5, padding=2), _norm(32, groups), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), _norm(64, groups), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(64 * (h // 4) * (w // 4), hidden), nn.ReLU(), nn.Linear(hidden, n_outputs)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


class LinearRegression(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], n_outputs: int = 1, bias: bool = True) -> None:
        super().__init__()
        self.linear = nn.Linear(_flat_size(input_shape), n_outputs, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.reshape(x.shape[0], -1))


class ConvAE(nn.Module):
    """FLT's ConvAE (App. C.3). `encode` gives the latent signature used for client relatedness."""

    def __init__(self, input_shape: tuple[int, ...], latent: int = 128) -> None:
        super().__init__()
        c_in, h, w = image_shape(input_shape)
        if h % 4 or w % 4:
            raise ValueError(f"ConvAE needs image sides divisible by 4, got {h}x{w}")
        self.grid = (4, h // 4, w // 4)
        flat = 4 * (h // 4) * (w // 4)
        self.encoder = nn.Sequential(
            nn.Conv2d(c_in, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.to_latent = nn.Linear(flat, latent)
        self.from_latent = nn.Linear(latent, flat)
        self.decoder = nn.Sequential(
            nn.ConvTranspose2d(4, 16, 2, stride=2), nn.ReLU(),
            nn.ConvTranspose2d(16, c_in, 2, stride=2), nn.Sigmoid(),
        )

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.to_latent(self.encoder(x).flatten(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.relu(self.from_latent(self.encode(x)))
        return self.decoder(z.view(x.shape[0], *self.grid))


class BasicBlock(nn.Module):
    """Two 3×3 convolutions, each followed by GroupNorm, with a residual connection.

    Where the shape changes (stride 2 or more channels) the shortcut is a 1×1 projection
    followed by GroupNorm ("option B" of He et al. 2016); elsewhere it is the identity. The
    ReLUs and the residual sum are out-of-place so that `torch.func.vmap` traces the block.
    """

    def __init__(self, c_in: int, c_out: int, stride: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(min(groups, c_out), c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(min(groups, c_out), c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                nn.GroupNorm(min(groups, c_out), c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm1(self.conv1(x)))
        h = self.norm2(self.conv2(h))
        return torch.relu(h + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 for small images, with GroupNorm instead of BatchNorm.

    What the sources say: CFL-GP (Kim et al. 2024) App. F.7 trains a ResNet18 on CIFAR10;
    Hsieh et al. 2020 ("The non-IID data quagmire of decentralized machine learning") replace
    BatchNorm by GroupNorm in ResNets trained on non-IID clients, since BatchNorm's batch
    statistics differ between clients. Here, as well, BatchNorm would not stack across
    clients (its running statistics are buffers updated in place, outside `vmap`).

    What we chose: the usual CIFAR variant of ResNet-18 — a 3×3 stride-1 stem convolution
    (`width` channels) with GroupNorm and ReLU, no max-pool; four stages of two `BasicBlock`s
    with `width`·(1, 2, 4, 8) channels and strides 1, 2, 2, 2; global average pooling; one
    linear layer. Convolutions have no bias (GroupNorm's shift takes its place). Every
    GroupNorm has `min(groups, channels)` groups (default 2). With `width` = 64 and 10
    classes the model has 11,173,962 parameters, as the BatchNorm version (whose running
    statistics are buffers, not parameters). Parameter names follow torchvision's
    (`conv1`, `layer1`…`layer4`, `fc`), so `feature_layers = ["fc"]` picks the last layer.
    """

    def __init__(
        self, input_shape: tuple[int, ...], n_outputs: int, groups: int = 2, width: int = 64
    ) -> None:
        super().__init__()
        c_in = image_shape(input_shape)[0]
        self.conv1 = nn.Conv2d(c_in, width, 3, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(min(groups, width), width)

        def stage(c: int, c_out: int, stride: int) -> nn.Sequential:
            return nn.Sequential(BasicBlock(c, c_out, stride, groups),
                                 BasicBlock(c_out, c_out, 1, groups))

        self.layer1 = stage(width, width, 1)
        self.layer2 = stage(width, 2 * width, 2)
        self.layer3 = stage(2 * width, 4 * width, 2)
        self.layer4 = stage(4 * width, 8 * width, 2)
        self.fc = nn.Linear(8 * width, n_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm1(self.conv1(x)))
        h = self.layer4(self.layer3(self.layer2(self.layer1(h))))
        return self.fc(h.mean(dim=(2, 3)))
