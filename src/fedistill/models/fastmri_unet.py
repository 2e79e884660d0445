"""fastMRI's baseline U-Net (Zbontar et al. 2018, ``fastmri.models.Unet``), the reconstruction net of
FL-MRCM (Guo et al., CVPR 2021) that FedIOD reuses for T_k and S in MRI reconstruction.

``Unet(in_chans, out_chans, chans, num_pool_layers, drop_prob)`` layer by layer, with its parameter
names (``down_sample_layers.N.layers.M.*``, ``conv.*``, ``up_transpose_conv.*``, ``up_conv.*``), so
its released weights load unchanged:

- ConvBlock(c_in, c_out) = 2 × (conv3×3 without bias → InstanceNorm → LeakyReLU(0.2) → Dropout2d(p));
- down path: ConvBlock(in, chans), then ``num_pool_layers - 1`` blocks doubling the channels, each
  level's output kept for the skip and average-pooled 2×2; bottleneck ConvBlock(ch, 2·ch);
- up path, per level: TransposeConvBlock (transposed conv 2×2/2 without bias → InstanceNorm →
  LeakyReLU(0.2)) halving the channels, concatenation [upsampled, skip], ConvBlock halving them
  again; the last level ends in a 1×1 convolution (with bias) to ``out_chans``.

Defaults are the reference's, chans 32 and 4 poolings (7,756,097 parameters for one channel in and
out): the model is named after that net, so it should be that net; ``chans=16`` quarters both the
parameters and the multiply-adds for CPU runs. ``norm`` (default ``"instance"``, the reference's) may
also be batch, group or none; with ``"none"`` the 3×3 and transposed convolutions carry a bias.

One deliberate difference: fastMRI reflect-pads an upsampled map by one pixel when an odd size was
halved; here both sides must be multiples of ``2^num_pool_layers`` and other sizes are refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.models.checks import check_divisible, check_instance_norm_size, positive_int, probability
from fedistill.models.norm import make_norm2d


class ConvBlock(nn.Module):
    """Two 3×3 convolutions, each followed by normalisation, LeakyReLU and dropout, as fastMRI's U-Net."""

    def __init__(self, in_chans: int, out_chans: int, drop_prob: float, norm: str, groups: int):
        super().__init__()
        bias = norm == "none"
        self.layers = nn.Sequential(
            nn.Conv2d(in_chans, out_chans, 3, padding=1, bias=bias),
            make_norm2d(norm, out_chans, groups=groups),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Dropout2d(drop_prob),
            nn.Conv2d(out_chans, out_chans, 3, padding=1, bias=bias),
            make_norm2d(norm, out_chans, groups=groups),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Dropout2d(drop_prob),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class TransposeConvBlock(nn.Module):
    """A 2×2 transposed convolution of stride 2 that doubles the resolution, with normalisation and
    LeakyReLU."""

    def __init__(self, in_chans: int, out_chans: int, norm: str, groups: int):
        super().__init__()
        self.layers = nn.Sequential(
            nn.ConvTranspose2d(in_chans, out_chans, 2, stride=2, bias=norm == "none"),
            make_norm2d(norm, out_chans, groups=groups),
            nn.LeakyReLU(0.2, inplace=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class FastMRIUnet(nn.Module):
    """image (B, in_chans, H, W) → image (B, out_chans, H, W); H and W multiples of 2^num_pool_layers."""

    def __init__(
        self,
        in_chans: int,
        out_chans: int,
        *,
        chans: int = 32,
        num_pool_layers: int = 4,
        drop_prob: float = 0.0,
        norm: str = "instance",
        groups: int = 2,
    ):
        super().__init__()
        chans = positive_int("fastMRI U-Net chans", chans)
        num_pool_layers = positive_int("fastMRI U-Net num_pool_layers", num_pool_layers)
        drop_prob = probability("fastMRI U-Net drop_prob", drop_prob)
        self.in_chans, self.out_chans = in_chans, out_chans
        self.in_channels, self.out_channels = in_chans, out_chans  # the names the other nets use
        self.chans, self.num_pool_layers, self.drop_prob = chans, num_pool_layers, drop_prob

        self.down_sample_layers = nn.ModuleList([ConvBlock(in_chans, chans, drop_prob, norm, groups)])
        ch = chans
        for _ in range(num_pool_layers - 1):
            self.down_sample_layers.append(ConvBlock(ch, ch * 2, drop_prob, norm, groups))
            ch *= 2
        self.conv = ConvBlock(ch, ch * 2, drop_prob, norm, groups)

        self.up_conv = nn.ModuleList()
        self.up_transpose_conv = nn.ModuleList()
        for _ in range(num_pool_layers - 1):
            self.up_transpose_conv.append(TransposeConvBlock(ch * 2, ch, norm, groups))
            self.up_conv.append(ConvBlock(ch * 2, ch, drop_prob, norm, groups))
            ch //= 2
        self.up_transpose_conv.append(TransposeConvBlock(ch * 2, ch, norm, groups))
        self.up_conv.append(
            nn.Sequential(ConvBlock(ch * 2, ch, drop_prob, norm, groups), nn.Conv2d(ch, out_chans, 1))
        )

    def encode(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The down path: every level's features, finest first, the bottleneck's last."""
        check_divisible(
            f"a fastMRI U-Net with {self.num_pool_layers} poolings",
            x.shape[-2],
            x.shape[-1],
            2**self.num_pool_layers,
        )
        features = []
        for layer in self.down_sample_layers:
            x = layer(x)
            features.append(x)
            x = F.avg_pool2d(x, kernel_size=2, stride=2, padding=0)
        features.append(self.conv(x))
        return features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *skips, x = self.encode(x)
        for transpose_conv, conv, skip in zip(
            self.up_transpose_conv, self.up_conv, reversed(skips), strict=True
        ):
            x = conv(torch.cat([transpose_conv(x), skip], dim=1))
        return x

    @contextmanager
    def bottleneck_features(self) -> Iterator[list[torch.Tensor]]:
        """Within the block, every pass through the net (``forward`` or ``encode``) appends its bottleneck
        features, (B, chans·2^num_pool_layers, H / 2^num_pool_layers, W / 2^num_pool_layers) and still in
        the autograd graph, to the list it yields: FL-MRCM aligns them across sites while the outputs, the
        parameter names and any wrapper (data consistency) stay as they are."""
        captured: list[torch.Tensor] = []
        handle = self.conv.register_forward_hook(lambda _module, _inputs, output: captured.append(output))
        try:
            yield captured
        finally:
            handle.remove()

    def encoder_module(self) -> nn.Module:
        """The down path as a module returning every level's features (shares this net's weights)."""
        return _FastMRIEncoder(self)


class _FastMRIEncoder(nn.Module):
    """A view of a FastMRIUnet's down path; holds the same blocks, registered under the same names."""

    def __init__(self, net: FastMRIUnet):
        super().__init__()
        self.down_sample_layers = net.down_sample_layers
        self.conv = net.conv
        self.num_pool_layers = net.num_pool_layers
        self.num_levels = net.num_pool_layers + 1

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return FastMRIUnet.encode(self, x)  # type: ignore[arg-type]  # the same attributes, the same code


def unet_fastmri(
    info: DatasetInfo,
    norm: str = "instance",
    groups: int = 2,
    *,
    chans: int = 32,
    num_pool_layers: int = 4,
    drop_prob: float = 0.0,
) -> FastMRIUnet:
    """fastMRI's U-Net from ``info``'s channels back to them; ConfigError on a size it cannot keep."""
    pools = positive_int("fastMRI U-Net num_pool_layers", num_pool_layers)
    size = info.image_size
    what = f"a fastMRI U-Net with {pools} poolings (dataset {info.name!r})"
    check_divisible(what, size, size, 2**pools)
    check_instance_norm_size(what, size, pools, norm)
    return FastMRIUnet(
        info.channels,
        info.channels,
        chans=chans,
        num_pool_layers=pools,
        drop_prob=drop_prob,
        norm=norm,
        groups=groups,
    )
