"""U-Net (Ronneberger et al., MICCAI 2015) for per-pixel classification: image → per-pixel logits.

Level ``i`` (0 … depth) of the down path is a double convolution, 2 × (conv3×3 → norm → ReLU), with
``width · 2^i`` channels, levels joined by 2×2 max-pooling; the up path mirrors it: a 2×2 stride-2
transposed convolution halves the channels and doubles the size, the skip connection of the same
level is concatenated in front, a double convolution follows; a 1×1 convolution gives the logits.
Unlike the 2015 net the 3×3 convolutions are padded, so the output has the input's size and no tile
overlapping is needed; both sides must then be multiples of ``2^depth`` (other sizes are refused).
Convolutions followed by a norm layer carry no bias (the norm's shift replaces it), those with
``norm="none"`` do.

Two registered configurations:

- ``unet``: width 16, depth 4 (options ``width``, ``depth``): 1/16 of the 2015 net's parameters and
  multiply-adds, so local training on a 2-core CPU at 224×224 stays practical.
- ``unet-chang``: the segmentation net of Chang et al. (AsynDGAN, CVPR 2020), which FedIOD reuses for
  T_k and S. Their paper names the 2015 U-Net; this is its layout at its widths (64 … 1024 channels,
  4 poolings, transposed-conv upsampling, 1×1 output) with padded convolutions and BatchNorm, the
  form of the widely used PyTorch U-Net (31,037,698 parameters for RGB input and 2 classes).
  AsynDGAN's released ``models/UNet.py`` differs in four places, which ``layout="asyndgan"``
  reproduces (31,043,586 parameters for RGB and 2 classes): every 3×3 conv has a bias (5,888 more
  parameters), each runs conv → ReLU → norm instead of conv → norm → ReLU, dropout 0.5 acts on the
  bottleneck's features, and the upsampled map comes before the skip in each concatenation.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.models.checks import check_divisible, check_instance_norm_size, positive_int
from fedistill.models.norm import make_norm2d

LAYOUTS = ("pytorch-unet", "asyndgan")


class DoubleConv(nn.Sequential):
    """2 × (conv3×3, padding 1 → norm → ReLU): one level of either path. The ``"asyndgan"`` layout
    gives 2 × (conv3×3 with bias → ReLU → norm), as AsynDGAN's code; the parameter names are the same."""

    def __init__(self, in_channels: int, out_channels: int, norm: str, groups: int, layout: str = LAYOUTS[0]):
        asyndgan = layout == "asyndgan"
        bias = norm == "none" or asyndgan
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        for i, channels in enumerate((in_channels, out_channels), start=1):
            layers[f"conv{i}"] = nn.Conv2d(channels, out_channels, 3, padding=1, bias=bias)
            if asyndgan:
                layers[f"relu{i}"] = nn.ReLU(inplace=True)
            layers[f"norm{i}"] = make_norm2d(norm, out_channels, groups=groups)
            if not asyndgan:
                layers[f"relu{i}"] = nn.ReLU(inplace=True)
        super().__init__(layers)


class UNetEncoder(nn.Module):
    """The down path: image → the features of every level, finest first (``depth + 1`` maps).

    A module of its own so that it can serve alone as a feature network (see ``models.perceptual``).
    """

    def __init__(
        self, in_channels: int, width: int, depth: int, norm: str, groups: int, layout: str = LAYOUTS[0]
    ):
        super().__init__()
        self.depth = depth
        self.num_levels = depth + 1
        widths = [width * 2**i for i in range(depth + 1)]
        self.levels = nn.ModuleList(
            DoubleConv(c_in, c_out, norm, groups, layout)
            for c_in, c_out in zip([in_channels, *widths[:-1]], widths, strict=True)
        )
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        check_divisible(f"a U-Net of depth {self.depth}", x.shape[-2], x.shape[-1], 2**self.depth)
        features = []
        for i, level in enumerate(self.levels):
            x = level(self.pool(x) if i else x)
            features.append(x)
        return features


class UpLevel(nn.Module):
    """Transposed conv 2×2/2 (channels c → c/2), concatenation [skip, upsampled] ([upsampled, skip] in
    the ``"asyndgan"`` layout), DoubleConv(c → c/2)."""

    def __init__(self, channels: int, norm: str, groups: int, layout: str = LAYOUTS[0]):
        super().__init__()
        self.up = nn.ConvTranspose2d(channels, channels // 2, 2, stride=2)
        self.conv = DoubleConv(channels, channels // 2, norm, groups, layout)
        self.skip_first = layout != "asyndgan"

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        up = self.up(x)
        return self.conv(torch.cat([skip, up] if self.skip_first else [up, skip], dim=1))


class UNet(nn.Module):
    """image (B, in_channels, H, W) → logits (B, out_channels, H, W); H and W multiples of 2^depth."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        width: int = 16,
        depth: int = 4,
        norm: str = "batch",
        groups: int = 2,
        layout: str = LAYOUTS[0],
    ):
        super().__init__()
        width = positive_int("U-Net width", width)
        depth = positive_int("U-Net depth", depth)
        if layout not in LAYOUTS:
            raise ConfigError(f"U-Net layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.width, self.depth, self.layout = width, depth, layout
        self.encoder = UNetEncoder(in_channels, width, depth, norm, groups, layout)
        self.decoder = nn.ModuleList(UpLevel(width * 2**i, norm, groups, layout) for i in range(depth, 0, -1))
        self.head = nn.Conv2d(width, out_channels, 1)
        self.bottleneck_dropout = 0.5 if layout == "asyndgan" else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *skips, x = self.encoder(x)
        if self.bottleneck_dropout:
            x = F.dropout(x, self.bottleneck_dropout, training=self.training)
        for up, skip in zip(self.decoder, reversed(skips), strict=True):
            x = up(x, skip)
        return self.head(x)

    def encoder_module(self) -> nn.Module:
        """The down path as a module returning every level's features (shares this net's weights)."""
        return self.encoder


def build_unet(
    info: DatasetInfo,
    norm: str = "batch",
    groups: int = 2,
    *,
    width: int,
    depth: int,
    layout: str = LAYOUTS[0],
) -> UNet:
    """A U-Net from ``info``'s channels to its pixel classes; ConfigError on a size it cannot keep."""
    depth = positive_int("U-Net depth", depth)
    size = info.image_size
    what = f"a U-Net of depth {depth} (dataset {info.name!r})"
    check_divisible(what, size, size, 2**depth)
    check_instance_norm_size(what, size, depth, norm)
    return UNet(
        info.channels, info.num_classes, width=width, depth=depth, norm=norm, groups=groups, layout=layout
    )


def unet(info: DatasetInfo, norm: str = "batch", groups: int = 2, *, width: int = 16, depth: int = 4) -> UNet:
    """U-Net (Ronneberger et al. 2015) for per-pixel logits, CPU-sized: width 16, depth 4 by default."""
    return build_unet(info, norm, groups, width=width, depth=depth)


def unet_chang(info: DatasetInfo, norm: str = "batch", groups: int = 2, *, layout: str = LAYOUTS[0]) -> UNet:
    """The 2015 U-Net at its original widths (64 to 1024 channels): Chang et al.'s and FedIOD's segmenter;
    ``layout="asyndgan"`` follows AsynDGAN's code (conv biases, conv → ReLU → norm, bottleneck dropout)."""
    return build_unet(info, norm, groups, width=64, depth=4, layout=layout)
