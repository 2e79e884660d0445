"""CIFAR-style ResNets (He et al. 2016, §4.2): a 3×3 stem and three stages of BasicBlocks.

``resnet8``/``resnet20``/``resnet32`` reproduce FedDF's ``ResNet_cifar`` (16/32/64 channels, depth
6n + 2, FedDF's conv init). ``resnet8-wide`` reproduces FedIOD's ``resnet8_t`` (128/256/512 channels,
2×2-pooled 2048-d features, default PyTorch init), which FedIOD's paper also calls "ResNet-8".

Global pooling is adaptive, so any image size works: 8×8 digits, 28×28 MNIST and 32×32 CIFAR.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.models.base import Classifier
from fedistill.models.norm import make_norm2d


class BasicBlock(nn.Module):
    """conv3×3 → norm → ReLU → conv3×3 → norm, add the shortcut, ReLU.

    The shortcut is a 1×1 conv + norm wherever the stride or the channel count changes, else identity.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: str, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = make_norm2d(norm, out_channels, groups=groups)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.norm2 = make_norm2d(norm, out_channels, groups=groups)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                make_norm2d(norm, out_channels, groups=groups),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(Classifier):
    """Stem, three stages (strides 1/2/2) of ``blocks_per_stage`` BasicBlocks, average pool, Linear.

    ``widths`` = (stem, stage 1, stage 2, stage 3) channels. The pool averages to a ``pool_size`` ×
    ``pool_size`` map, so the feature dimension is ``widths[-1] * pool_size**2``. ``block`` and the
    stem's ``activation`` let a variant (the binarized ResNet-8) keep this layout and its parameter names.
    """

    def __init__(
        self,
        info: DatasetInfo,
        *,
        widths: tuple[int, int, int, int],
        blocks_per_stage: int,
        pool_size: int = 1,
        norm: str = "batch",
        groups: int = 2,
        block: type[BasicBlock] = BasicBlock,
        activation: Callable[[], nn.Module] = nn.ReLU,
    ):
        stem_width, *stage_widths = widths
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        layers["conv"] = nn.Conv2d(info.channels, stem_width, 3, stride=1, padding=1, bias=False)
        layers["norm"] = make_norm2d(norm, stem_width, groups=groups)
        layers["act"] = activation()
        in_channels = stem_width
        for stage, (width, stride) in enumerate(zip(stage_widths, (1, 2, 2), strict=True), start=1):
            blocks = []
            for i in range(blocks_per_stage):
                blocks.append(block(in_channels, width, stride if i == 0 else 1, norm, groups))
                in_channels = width
            layers[f"layer{stage}"] = nn.Sequential(*blocks)
        layers["pool"] = nn.AdaptiveAvgPool2d(pool_size)
        layers["flatten"] = nn.Flatten(1)
        feature_dim = in_channels * pool_size * pool_size
        super().__init__(
            nn.Sequential(layers),
            nn.Linear(feature_dim, info.num_classes),
            feature_dim=feature_dim,
            num_classes=info.num_classes,
        )


def init_feddf(model: nn.Module) -> None:
    """FedDF's init: conv weights ~ N(0, sqrt(2 / (k·k·C_out))), norm weight 1 and bias 0.

    Linear layers keep the PyTorch default, as in FedDF's code.
    """
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
        elif isinstance(m, nn.BatchNorm2d | nn.GroupNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


CIFAR_WIDTHS = (16, 16, 32, 64)  # FedDF's ResNet_cifar: stem and the three stages


def cifar_resnet(info: DatasetInfo, depth: int, norm: str = "batch", groups: int = 2) -> ResNet:
    """FedDF's ``ResNet_cifar`` of depth 6n + 2: n BasicBlocks per stage of 16/32/64 channels."""
    if (depth - 2) % 6 != 0:
        raise ValueError(f"CIFAR ResNet depth must be 6n + 2, got {depth}")
    model = ResNet(info, widths=CIFAR_WIDTHS, blocks_per_stage=(depth - 2) // 6, norm=norm, groups=groups)
    init_feddf(model)
    return model


def resnet8(info: DatasetInfo, norm: str = "batch", groups: int = 2) -> ResNet:
    """FedDF's ResNet-8 (one block per stage): 78,042 parameters for 3×32×32 inputs and 10 classes."""
    return cifar_resnet(info, 8, norm, groups)


def resnet20(info: DatasetInfo, norm: str = "batch", groups: int = 2) -> ResNet:
    """FedDF's ResNet-20 (three blocks per stage)."""
    return cifar_resnet(info, 20, norm, groups)


def resnet32(info: DatasetInfo, norm: str = "batch", groups: int = 2) -> ResNet:
    """FedDF's ResNet-32 (five blocks per stage)."""
    return cifar_resnet(info, 32, norm, groups)


def resnet8_wide(info: DatasetInfo, norm: str = "batch", groups: int = 2) -> ResNet:
    """FedIOD's ``resnet8_t``: one block per stage of 128/256/512 channels, 2×2-pooled 2048-d features.

    On 32×32 inputs the adaptive 2×2 pool equals the released code's ``avg_pool2d(kernel 4)`` on the
    8×8 map. The released model's unused ``linear2`` and ``emb`` are left out. Default PyTorch init.
    """
    return ResNet(
        info, widths=(128, 128, 256, 512), blocks_per_stage=1, pool_size=2, norm=norm, groups=groups
    )
