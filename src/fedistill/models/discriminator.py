"""The patch discriminator D_k of MosaicKD (Fang et al., NeurIPS'21), one per client in FedIOD.

Layer by layer it is ``PatchDiscriminator(nc, ndf)`` of both released codes, with ``width`` = ndf and
the parameter names (``main.N.*``) kept, so that their weights load unchanged. It maps an image to a
map of patch logits (no sigmoid), a quarter of the image size per side: 8×8 → 2×2, 28×28 → 7×7,
32×32 → 8×8, each logit seeing a ≈10×10-pixel patch.

``fast=True`` computes the first 4×4/stride-2 convolution as an unfold followed by one matrix
product instead of ``nn.Conv2d``; it uses the same weights and gives the same outputs and gradients
up to float rounding. It is off by default: a whole forward+backward step is seldom faster with it, since
the second convolution dominates the step (docs/results/tuning-history.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError


class PatchDiscriminator(nn.Module):
    """image (B, channels, H, W) → patch logits (B, 1, H // 4, W // 4)."""

    def __init__(self, info: DatasetInfo, *, width: int = 128, fast: bool = False):
        super().__init__()
        if isinstance(width, bool) or not isinstance(width, int) or width <= 0:
            raise ConfigError(f"discriminator width must be a positive integer, got {width!r}")
        if not isinstance(fast, bool):
            raise ConfigError(f"discriminator 'fast' must be true or false, got {fast!r}")
        if info.image_size < 4:
            raise ConfigError(
                f"the patch discriminator needs images of at least 4×4, got {info.image_size} "
                f"(dataset {info.name!r})"
            )
        self.width = width
        self.fast = fast
        self.main = nn.Sequential(
            nn.Conv2d(info.channels, width, 4, stride=2, padding=1),  # H → H/2
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(width, 2 * width, 4, stride=2, padding=1, bias=False),  # H/2 → H/4
            nn.BatchNorm2d(2 * width),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(2 * width, 1, 1, stride=1, padding=0, bias=False),  # one logit per patch
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fast:
            return self.main(x)
        return self.main[1:](self._first_conv_unfolded(x))

    def _first_conv_unfolded(self, x: torch.Tensor) -> torch.Tensor:
        """``self.main[0](x)`` written as unfold → (patches @ weightᵀ + bias)."""
        conv = self.main[0]
        b, _, h, w = x.shape
        out_h, out_w = (h + 2 - 4) // 2 + 1, (w + 2 - 4) // 2 + 1
        patches = F.unfold(x, 4, padding=1, stride=2).transpose(1, 2)  # (B, out_h·out_w, C·16)
        out = F.linear(patches, conv.weight.flatten(1), conv.bias)  # (B, out_h·out_w, width)
        return out.transpose(1, 2).reshape(b, -1, out_h, out_w)


def build_discriminator(info: DatasetInfo, width: int = 128, fast: bool = False) -> PatchDiscriminator:
    """FedIOD's patch discriminator for ``info``; ConfigError on bad values."""
    return PatchDiscriminator(info, width=width, fast=fast)
