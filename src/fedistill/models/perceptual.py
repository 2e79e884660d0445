"""Perceptual loss (Johnson et al., ECCV 2016), which FedIOD adds to G's adversarial loss on the dense
tasks: the mean squared error between the features a frozen network computes for two images,
summed over the chosen layers (optionally weighted). Gradients reach the first image only.

Feature networks:

- :func:`encoder_features`: a frozen copy of a U-Net's down path (``models.unet.UNet`` or
  ``models.fastmri_unet.FastMRIUnet``), e.g. the client's own T_k: FedIOD's default, since it needs no
  outside weights. It sees images as that net was trained on them (normalised with the dataset's
  mean and std).
- :class:`VGG16Features`: torchvision's VGG-16 ``features`` layer by layer (13 conv3×3 + ReLU, 5
  max-pools), loaded by :func:`load_vgg16_features` from a safetensors file the user supplies, holding
  torchvision's ``vgg16`` state dict (``features.0.weight``, …; its ``classifier.*`` keys are ignored).
  Nothing is downloaded. It takes images in [0, 1], repeats grayscale ones to 3 channels and applies
  the ImageNet normalisation (mean 0.485/0.456/0.406, std 0.229/0.224/0.225) it was trained with.
  Default layers: relu1_2, relu2_2, relu3_3, relu4_3, those of Johnson et al.
- any module returning a tensor or a list of tensors.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from fedistill.errors import ConfigError
from fedistill.models.base import unknown_choice

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# torchvision's configuration "D": conv3×3 widths, "M" = 2×2 max-pool; each conv is followed by a ReLU.
VGG16_LAYOUT: tuple[int | str, ...] = (
    *(64, 64, "M"),
    *(128, 128, "M"),
    *(256, 256, 256, "M"),
    *(512, 512, 512, "M"),
    *(512, 512, 512, "M"),
)
JOHNSON_LAYERS = ("relu1_2", "relu2_2", "relu3_3", "relu4_3")


def _vgg16_layers() -> tuple[list[nn.Module], dict[str, int]]:
    """The 31 layers of ``vgg16().features`` and the index of every ReLU by name (relu<block>_<conv>)."""
    layers: list[nn.Module] = []
    relus: dict[str, int] = {}
    channels, block, conv = 3, 1, 0
    for item in VGG16_LAYOUT:
        if item == "M":
            layers.append(nn.MaxPool2d(2, 2))
            block, conv = block + 1, 0
            continue
        assert isinstance(item, int)
        layers += [nn.Conv2d(channels, item, 3, padding=1), nn.ReLU()]
        conv += 1
        relus[f"relu{block}_{conv}"] = len(layers) - 1
        channels = item
    return layers, relus


VGG16_RELUS = _vgg16_layers()[1]


def vgg16_feature_shapes() -> dict[str, tuple[int, ...]]:
    """Key → shape of every tensor in torchvision's ``vgg16().features`` state dict (26 tensors)."""
    layers, _ = _vgg16_layers()
    shapes: dict[str, tuple[int, ...]] = {}
    for i, layer in enumerate(layers):
        if isinstance(layer, nn.Conv2d):
            shapes[f"features.{i}.weight"] = tuple(layer.weight.shape)
            shapes[f"features.{i}.bias"] = tuple(layer.bias.shape)  # type: ignore[union-attr]
    return shapes


class VGG16Features(nn.Module):
    """image in [0, 1] (B, 1 or 3, H, W) → the ReLU outputs named in ``layers``, shallowest first.

    Only the layers up to the deepest one asked for are built; their keys are torchvision's.
    """

    def __init__(self, layers: Sequence[str] = JOHNSON_LAYERS):
        super().__init__()
        if not layers:
            raise ConfigError("the VGG-16 feature network needs at least one layer")
        for name in layers:
            if name not in VGG16_RELUS:
                raise unknown_choice("VGG-16 layer", name, VGG16_RELUS)
        self.taps = sorted({VGG16_RELUS[name] for name in layers})
        all_layers, _ = _vgg16_layers()
        self.features = nn.Sequential(*all_layers[: self.taps[-1] + 1])
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        if x.dim() != 4 or x.shape[1] not in (1, 3):
            raise ValueError(f"VGG-16 takes images (B, 1 or 3, H, W) in [0, 1], got {tuple(x.shape)}")
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        x = (x - self.mean) / self.std
        out = []
        for i, layer in enumerate(self.features):
            x = layer(x)
            if i in self.taps:
                out.append(x)
        return out


def load_vgg16_features(path: str | Path, layers: Sequence[str] = JOHNSON_LAYERS) -> VGG16Features:
    """VGG16Features with the weights of a safetensors file holding torchvision's ``vgg16`` state dict.

    The whole ``features`` part is checked (every key present with its shape; no other key but
    ``classifier.*``) before anything is loaded, so a vgg16_bn or vgg19 file, or one saved with a
    ``module.`` prefix, is refused with the keys that differ.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"VGG-16 weights file {str(path)!r} not found; save torchvision's vgg16 state dict there with "
            f"safetensors (keys features.0.weight, features.0.bias, …)"
        )
    net = VGG16Features(layers)
    try:
        with safe_open(str(path), framework="pt") as f:
            shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118
            _check_vgg16_keys(path, shapes)
            state = {key: f.get_tensor(key) for key in net.state_dict()}
    except ConfigError:
        raise
    except Exception as exc:  # not a safetensors file, truncated, unreadable
        raise ConfigError(f"cannot read VGG-16 weights file {str(path)!r} as safetensors: {exc}") from exc
    net.load_state_dict(state)
    return net


def _check_vgg16_keys(path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    expected = vgg16_feature_shapes()
    missing = [k for k in expected if k not in shapes]
    unexpected = sorted(k for k in shapes if k not in expected and not k.startswith("classifier."))
    wrong = [
        f"{k} {shapes[k]} (expected {expected[k]})"
        for k in expected
        if k in shapes and shapes[k] != expected[k]
    ]
    if not (missing or unexpected or wrong):
        return
    parts = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)):
        if items:
            shown = ", ".join(items[:4]) + (f", … ({len(items)} in all)" if len(items) > 4 else "")
            parts.append(f"{label}: {shown}")
    raise ConfigError(
        f"{str(path)!r} does not hold torchvision's vgg16 weights (not vgg16_bn, no key prefix): "
        + "; ".join(parts)
    )


class _EncoderLevels(nn.Module):
    """A U-Net down path returning the features of the chosen levels (0 = full resolution)."""

    def __init__(self, encoder: nn.Module, levels: Sequence[int] | None):
        super().__init__()
        count = int(encoder.num_levels)  # type: ignore[arg-type]
        self.levels = list(range(count)) if levels is None else list(levels)
        bad = [level for level in self.levels if not (isinstance(level, int) and 0 <= level < count)]
        if bad or not self.levels:
            raise ConfigError(f"encoder levels must be among 0…{count - 1}, got {list(levels or [])}")
        self.encoder = encoder

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        features = self.encoder(x)
        return [features[level] for level in self.levels]


def encoder_features(model: nn.Module, levels: Sequence[int] | None = None) -> nn.Module:
    """A frozen copy of ``model``'s down path (a U-Net of this package) as a feature network; the
    model itself is left as it is. ``levels`` picks the levels (default: all, finest first). Frozen: no
    gradients reach its parameters and it is in eval mode (BatchNorm uses the running statistics)."""
    if not hasattr(model, "encoder_module"):
        raise TypeError(f"{type(model).__name__} has no U-Net down path (no encoder_module method)")
    encoder = copy.deepcopy(model.encoder_module())
    return _EncoderLevels(encoder, levels).requires_grad_(False).eval()


class PerceptualLoss(nn.Module):
    """``loss(x, target) = Σ_l w_l · MSE(φ_l(x), φ_l(target))`` with a frozen feature network φ.

    ``features`` is frozen in place (no gradients, eval mode, kept in eval mode by ``train()``): pass
    a copy of a network that still trains. ``weights`` default to 1 for every feature map.
    """

    def __init__(self, features: nn.Module, weights: Sequence[float] | None = None):
        super().__init__()
        self.features = features.requires_grad_(False).eval()
        self.weights = None if weights is None else [float(w) for w in weights]

    def train(self, mode: bool = True) -> PerceptualLoss:
        super().train(mode)
        self.features.eval()  # BatchNorm statistics and dropout of the feature network stay fixed
        return self

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        feats = _as_list(self.features(x))
        with torch.no_grad():
            targets = _as_list(self.features(target))
        weights = [1.0] * len(feats) if self.weights is None else self.weights
        if len(weights) != len(feats):
            raise ValueError(f"{len(weights)} perceptual weights for {len(feats)} feature maps")
        losses = [w * F.mse_loss(a, b) for w, a, b in zip(weights, feats, targets, strict=True)]
        return torch.stack(losses).sum()


def _as_list(out: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else list(out)
