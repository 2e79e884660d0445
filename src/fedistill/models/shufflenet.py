"""ShuffleNet V2 (Ma et al. 2018) for small images, as in FedDF's code (``shufflenetv2-<width>``).

The ImageNet stem (stride-2 conv and max-pool) would shrink a 32×32 image to 8×8 before the first
stage, so the CIFAR variant keeps a stride-1 conv3×3 stem and no pool. Three stages follow, each a
down-sampling unit (stride 2) and then basic units: 4, 8 and 4 units in all. A 1×1 conv to the last
width, global average pooling and a Linear close the net. The pool is adaptive (FedDF's is a fixed 4×4
average, the same on 32×32), so 32×32 (→16→8→4), 28×28 (→14→7→4) and 8×8 digits (→4→2→1) all work.

FedDF's widths per multiplier: 0.5 → 48/96/192/1024, 1 → 116/232/464/1024, 1.5 → 176/352/704/1024,
2 → 224/488/976/2048, with a 24-channel stem. Default PyTorch init, as FedDF's code.

Parameters at width 1 for 3×32×32 inputs and 10 classes (norm parameters are 2 per channel):
  stem        conv 3·24·9 = 648, norm 48                                                       696
  down unit   (c_in → c_out, m = c_out/2): 11·c_in + 2·c_in·m + m² + 17·m
  basic unit  (c, h = c/2): 2·h² + 15·h
  stage 1     down 24→116: 7,398; 3 basic (h 58): 3·7,598                                  30,192
  stage 2     down 116→232: 43,616; 7 basic (h 116): 7·28,652                              244,180
  stage 3     down 232→464: 167,968; 3 basic (h 232): 3·111,128                            501,352
  last conv   464·1024 + norm 2,048                                                       477,184
  linear      1024·10 + 10                                                                  10,250
  total                                                                                  1,263,854
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.models.base import Classifier
from fedistill.models.norm import make_norm2d

# width multiplier → (stage 1, stage 2, stage 3, last conv) channels, from FedDF's code
SHUFFLENET_WIDTHS: dict[float, tuple[int, int, int, int]] = {
    0.5: (48, 96, 192, 1024),
    1.0: (116, 232, 464, 1024),
    1.5: (176, 352, 704, 1024),
    2.0: (224, 488, 976, 2048),
}
STEM_CHANNELS = 24
BASIC_UNITS = (3, 7, 3)  # after each stage's down-sampling unit


def channel_shuffle(x: torch.Tensor, groups: int = 2) -> torch.Tensor:
    """Interleave the channels of ``groups`` groups, so that the two branches mix in the next unit."""
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


def pointwise(in_channels: int, out_channels: int, norm: str, groups: int) -> nn.Sequential:
    """1×1 conv → norm → ReLU: mixes channels (every 1×1 conv of ShuffleNet V2 is followed by a ReLU)."""
    return nn.Sequential(
        OrderedDict(
            conv=nn.Conv2d(in_channels, out_channels, 1, bias=False),
            norm=make_norm2d(norm, out_channels, groups=groups),
            relu=nn.ReLU(),
        )
    )


def depthwise(channels: int, stride: int, norm: str, groups: int) -> nn.Sequential:
    """Depthwise 3×3 conv → norm, no ReLU (as in the paper): filters each channel on its own."""
    return nn.Sequential(
        OrderedDict(
            conv=nn.Conv2d(channels, channels, 3, stride=stride, padding=1, groups=channels, bias=False),
            norm=make_norm2d(norm, channels, groups=groups),
        )
    )


class BasicUnit(nn.Module):
    """Split the channels in halves; keep one, pass the other through 1×1 → depthwise 3×3 → 1×1;
    concatenate and shuffle."""

    def __init__(self, channels: int, norm: str, groups: int):
        super().__init__()
        half = channels // 2
        self.branch = nn.Sequential(
            pointwise(half, half, norm, groups),
            depthwise(half, 1, norm, groups),
            pointwise(half, half, norm, groups),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept, rest = x.chunk(2, dim=1)
        return channel_shuffle(torch.cat([kept, self.branch(rest)], dim=1))


class DownUnit(nn.Module):
    """Both branches see the whole input and halve the resolution; each gives half the output channels."""

    def __init__(self, in_channels: int, out_channels: int, norm: str, groups: int):
        super().__init__()
        half = out_channels // 2
        self.left = nn.Sequential(
            depthwise(in_channels, 2, norm, groups),
            pointwise(in_channels, half, norm, groups),
        )
        self.right = nn.Sequential(
            pointwise(in_channels, half, norm, groups),
            depthwise(half, 2, norm, groups),
            pointwise(half, half, norm, groups),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return channel_shuffle(torch.cat([self.left(x), self.right(x)], dim=1))


class ShuffleNetV2(Classifier):
    """ShuffleNet V2 for small images: a stride-1 stem, three stages of shuffle units, a 1×1 conv and a
    linear head."""

    def __init__(self, info: DatasetInfo, norm: str = "batch", groups: int = 2, *, width: float = 1.0):
        *stage_widths, last = SHUFFLENET_WIDTHS[width]
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        layers["stem"] = nn.Sequential(
            OrderedDict(
                conv=nn.Conv2d(info.channels, STEM_CHANNELS, 3, padding=1, bias=False),
                norm=make_norm2d(norm, STEM_CHANNELS, groups=groups),
                relu=nn.ReLU(),
            )
        )
        in_channels = STEM_CHANNELS
        for stage, (out, repeats) in enumerate(zip(stage_widths, BASIC_UNITS, strict=True), start=1):
            units = [DownUnit(in_channels, out, norm, groups)]
            units += [BasicUnit(out, norm, groups) for _ in range(repeats)]
            layers[f"stage{stage}"] = nn.Sequential(*units)
            in_channels = out
        layers["last"] = pointwise(in_channels, last, norm, groups)
        layers["pool"] = nn.AdaptiveAvgPool2d(1)
        layers["flatten"] = nn.Flatten(1)
        super().__init__(
            nn.Sequential(layers),
            nn.Linear(last, info.num_classes),
            feature_dim=last,
            num_classes=info.num_classes,
        )


def shufflenetv2(
    info: DatasetInfo, norm: str = "batch", groups: int = 2, *, width: float = 1.0
) -> ShuffleNetV2:
    """FedDF's ShuffleNet V2: 1,263,854 parameters at width 1 for 3×32×32 inputs and 10 classes."""
    valid = ", ".join(f"{w:g}" for w in SHUFFLENET_WIDTHS)
    if isinstance(width, bool) or not isinstance(width, int | float) or float(width) not in SHUFFLENET_WIDTHS:
        raise ConfigError(f"shufflenetv2 option width must be one of {valid} (FedDF's sizes), got {width!r}")
    return ShuffleNetV2(info, norm, groups, width=float(width))
