"""Binarized ResNet-8 (FedDF Table 4): 1-bit weights and activations, trained through latent floats.

Each convolution inside the residual blocks (both 3×3 convs and the 1×1 shortcut convs) computes
``conv(sign(x), alpha · sign(w))`` with ``alpha`` the mean |w| of each output filter (XNOR-Net,
Rastegari et al. 2016). The stem conv and the final Linear stay full precision, as is usual for binary
nets since XNOR-Net. sign maps 0 to +1, so every value is exactly ±1 (weights ±alpha).

sign has no useful gradient; the straight-through estimator (Hubara et al. 2016) passes the incoming
gradient where |input| <= 1 and blocks it elsewhere, for activations and weights alike (``alpha`` is
differentiated as usual). The optimiser updates the latent float weights ``w``, which are what the
state dict holds, under the same names and shapes as ``resnet8``: FedAvg averages binary clients like
any other, and FedDF can start a full-precision ``resnet8`` student from their average and send its
weights back as the clients' new latent weights.

sign(ReLU(x)) would be +1 everywhere, so the ReLUs of ``resnet8`` become Hardtanh (Hubara et al.'s
binarized ResNet): the sign of a block's input carries information, and Hardtanh's linear range is
the estimator's window. The shortcut adds real values, as in those nets.

FedDF's released code binarizes differently: weights only (activations stay real and ReLU), every
parameter whose name lacks ``bn`` (so also the first conv, the classifier and the shortcut's norm), as
``mean + rms · sign(w - mean)`` per filter, with error feedback between local steps; the paper says it
uses the straight-through estimator or error feedback. This module implements the usual binary net.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.models.resnet import CIFAR_WIDTHS, BasicBlock, ResNet, init_feddf


class SignSTE(torch.autograd.Function):
    """Forward: +1 where x >= 0, else -1. Backward: the gradient where |x| <= 1, zero elsewhere."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.where(x >= 0, 1.0, -1.0).to(x.dtype)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return grad * (x.abs() <= 1).to(grad.dtype)


def sign_ste(x: torch.Tensor) -> torch.Tensor:
    """sign(x) in the forward pass, with the straight-through gradient (passed where abs(x) <= 1) in the
    backward."""
    return SignSTE.apply(x)  # type: ignore[no-any-return]


class BinaryConv2d(nn.Conv2d):
    """A Conv2d whose forward uses sign(input) and the binary weights; ``weight`` stays the latent float.
    With ``binarize`` off (`full_precision`) it is the plain convolution of the latent weights."""

    binarize = True

    def binary_weight(self) -> torch.Tensor:
        """alpha · sign(w), with alpha the mean |w| over each output filter: what the forward uses."""
        alpha = self.weight.abs().mean(dim=(1, 2, 3), keepdim=True)
        return alpha * sign_ste(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The convolution of sign(x) with the binary weights; the plain convolution with `binarize` off."""
        if not self.binarize:
            return super().forward(x)
        w = self.binary_weight()
        return F.conv2d(sign_ste(x), w, self.bias, self.stride, self.padding, self.dilation, self.groups)


def has_binary_layers(model: nn.Module) -> bool:
    """Whether `model` has any binary convolution (and so a full-precision mode to switch to)."""
    return any(isinstance(m, BinaryConv2d) for m in model.modules())


@contextmanager
def full_precision(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block, `model`'s binary convolutions compute with their latent float weights on real
    inputs: the full-precision network behind a binary one, which FedDF's server fuses binary clients
    into (its Table 4) before the clients binarize the result again."""
    convs = [m for m in model.modules() if isinstance(m, BinaryConv2d)]
    for conv in convs:
        conv.binarize = False
    try:
        yield model
    finally:
        for conv in convs:
            conv.binarize = True


class BinaryBlock(BasicBlock):
    """resnet8's BasicBlock with binary convs and Hardtanh in place of ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: str, groups: int):
        super().__init__(in_channels, out_channels, stride, norm, groups)
        self.conv1 = BinaryConv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.conv2 = BinaryConv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        if isinstance(self.shortcut, nn.Sequential):
            self.shortcut[0] = BinaryConv2d(in_channels, out_channels, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.hardtanh(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.hardtanh(out + self.shortcut(x))


def resnet8_binary(info: DatasetInfo, norm: str = "batch", groups: int = 2) -> ResNet:
    """ResNet-8 with binary block convs: ``resnet8``'s layout, parameter names and count (78,042 for
    3×32×32 inputs and 10 classes) and FedDF's init of the latent weights."""
    model = ResNet(
        info,
        widths=CIFAR_WIDTHS,
        blocks_per_stage=1,
        norm=norm,
        groups=groups,
        block=BinaryBlock,
        activation=nn.Hardtanh,
    )
    init_feddf(model)
    return model
