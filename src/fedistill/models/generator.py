"""The image generator G of MosaicKD (Fang et al., NeurIPS'21) as used by FedIOD's released code.

Layer by layer it is ``Generator(nz, ngf, img_size, nc)`` of those codes, with ``latent_dim`` = nz,
``width`` = ngf and the image size and channel count taken from the dataset; the parameter names
(``l1.0.*``, ``conv_blocks.N.*``) are theirs too, so released generator weights load unchanged.
The two codes differ in one layer, the second upsampling: FedIOD uses bilinear, MosaicKD nearest.
``layout="dense"`` builds DENSE's released generator instead: the same layers and names with 2w channels
before the first convolution where those codes have 4w (`GENERATOR_LAYOUTS`).

G ends in a sigmoid, so it draws images in [0, 1]; :meth:`Generator.forward` then normalises them with
the dataset's mean and std, as FedIOD does before the images reach its discriminators, teachers and
student, so they can go straight into classifiers trained on normalised data.
"""

from __future__ import annotations

import torch
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.models.base import unknown_choice

UPSAMPLE_MODES = ("bilinear", "nearest")
#: The channels of G's base grid, before its first convolution: fediod 4w (FedIOD's and MosaicKD's), dense
#: 2w (DENSE's released code). The rest is the same: 2w, then w, then the image.
HEAD_FACTORS = {"fediod": 4, "dense": 2}
GENERATOR_LAYOUTS = tuple(HEAD_FACTORS)
UPSAMPLES = ("auto", 0, 1, 2)
MIN_BASE_GRID_PX = 4


def check_upsamples(key: str, value: object) -> None:
    """ConfigError naming `key` unless `value` is one of auto, 0, 1, 2."""
    if isinstance(value, bool) or value not in UPSAMPLES:
        raise ConfigError(f"{key} must be auto, 0, 1 or 2; got {value!r}")


def resolve_upsamples(value: int | str, image_size: int) -> int:
    """How often G upsamples: `value`, or for auto the paper's 2 unless that starts G from a grid under
    4 px, then as many as keep it at 4 px or more (8x8 digits: 1, from 4x4; 28 and 32 px: 2, from 7 and 8).

    Why: on 8x8 digits the paper's 2x2 grid limited FedIOD's student, and a 4x4 one raised it
    (docs/results/tuning-history.md)."""
    if value != "auto":
        return int(value)
    for upsamples in (2, 1):
        factor = 2**upsamples
        if image_size % factor == 0 and image_size // factor >= MIN_BASE_GRID_PX:
            return upsamples
    return 0


def _check_positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


class Generator(nn.Module):
    """z (B, latent_dim) → image (B, channels, image_size, image_size).

    The image is built at a quarter of the final size (s = image_size // 4) and upsampled twice:
    8×8 → 2 → 8, 28×28 → 7 → 28, 32×32 → 8 → 32. `upsamples` = 1 or 0 builds it at half or full size
    instead (8×8: from 4×4 or 8×8) with the same layers, a dropped upsampling becoming an identity, so
    the parameter names stay those of the two codes.
    """

    def __init__(
        self,
        info: DatasetInfo,
        *,
        latent_dim: int = 100,
        width: int = 64,
        upsample: str = "bilinear",
        condition_dim: int = 0,
        upsamples: int = 2,
        layout: str = "fediod",
    ):
        """`condition_dim` > 0 makes G conditional: its input is z followed by a condition vector of
        that length (FedIOD's per-client mixture feeds the one-hot of the client a sample is for);
        `layout` is one of `GENERATOR_LAYOUTS`."""
        super().__init__()
        latent_dim = _check_positive("latent_dim", latent_dim)
        if isinstance(condition_dim, bool) or not isinstance(condition_dim, int) or condition_dim < 0:
            raise ConfigError(f"condition_dim must be a non-negative integer, got {condition_dim!r}")
        width = _check_positive("generator width", width)
        if upsample not in UPSAMPLE_MODES:
            raise unknown_choice("upsample mode", upsample, UPSAMPLE_MODES)
        if layout not in GENERATOR_LAYOUTS:
            raise unknown_choice("generator layout", layout, GENERATOR_LAYOUTS)
        if isinstance(upsamples, bool) or upsamples not in (0, 1, 2):
            raise ConfigError(f"the generator's upsamples must be 0, 1 or 2, got {upsamples!r}")
        factor = 2**upsamples
        if info.image_size <= 0 or info.image_size % factor != 0:
            raise ConfigError(
                f"a generator with {upsamples} upsamplings needs an image size divisible by {factor}, "
                f"got {info.image_size} (dataset {info.name!r})"
            )
        self.latent_dim = latent_dim
        self.condition_dim = condition_dim
        self.width = width
        self.channels = info.channels
        self.upsamples = upsamples
        self.layout = layout
        head = HEAD_FACTORS[layout] * width
        self.init_size = info.image_size // factor
        first_upsample: nn.Module = nn.Identity()
        if upsamples >= 1:
            first_upsample = nn.Upsample(scale_factor=2, mode="nearest")
        second_upsample: nn.Module = nn.Identity()
        if upsamples == 2:
            second_upsample = (
                nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
                if upsample == "bilinear"
                else nn.Upsample(scale_factor=2, mode="nearest")
            )
        # Linear z → (head, s, s), head 4·width (2·width in DENSE's layout); the codes wrap it in a
        # Sequential, hence the key "l1.0".
        self.l1 = nn.Sequential(nn.Linear(latent_dim + condition_dim, head * self.init_size**2))
        self.conv_blocks = nn.Sequential(
            nn.BatchNorm2d(head),  # no activation after this BN, as in both codes
            first_upsample,
            nn.Conv2d(head, 2 * width, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.LeakyReLU(0.2, inplace=True),
            second_upsample,  # FedIOD: bilinear; MosaicKD: nearest
            nn.Conv2d(2 * width, width, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(width, info.channels, 3, stride=1, padding=1),
            nn.Sigmoid(),
        )
        # Normalisation constants: buffers so they follow .to(device), not saved in the state dict.
        mean = torch.tensor(info.mean, dtype=torch.float32).view(1, -1, 1, 1)
        std = torch.tensor(info.std, dtype=torch.float32).view(1, -1, 1, 1)
        self.register_buffer("mean", mean, persistent=False)
        self.register_buffer("std", std, persistent=False)

    def forward_unit(self, z: torch.Tensor) -> torch.Tensor:
        """Images in [0, 1] (the sigmoid output), e.g. for plotting."""
        if z.dim() != 2 or z.shape[1] != self.latent_dim + self.condition_dim:
            condition = f" followed by a condition (B, {self.condition_dim})" if self.condition_dim else ""
            raise ValueError(
                f"the generator takes a latent (B, {self.latent_dim}){condition}, got {tuple(z.shape)}"
            )
        out = self.l1(z)
        out = out.view(out.shape[0], -1, self.init_size, self.init_size)
        return self.conv_blocks(out)

    def forward(self, z: torch.Tensor, *, unit: bool = False) -> torch.Tensor:
        """Images normalised with the dataset's mean/std, or in [0, 1] when ``unit`` is true."""
        x01 = self.forward_unit(z)
        return x01 if unit else (x01 - self.mean) / self.std

    def export_metadata(self) -> dict[str, str]:
        """What a saved file needs beside the weights to rebuild this G: the weights fix the base grid,
        not how often it is upsampled (`fedistill.algorithms.shared.distillation_data.load_generator`),
        and the first layer's input size, not how much of it is a condition (recorded when there is one,
        so a conditional G is not mistaken for an unconditional one with a longer z)."""
        recorded = {"upsamples": str(self.upsamples)}
        if self.condition_dim:
            recorded["condition_dim"] = str(self.condition_dim)
        return recorded

    def sample_latent(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """z ~ N(0, I) of shape (batch, latent_dim), on this module's device."""
        device = self.mean.device
        gen_device = generator.device if generator is not None else device
        z = torch.randn(batch, self.latent_dim, generator=generator, device=gen_device)
        return z.to(device)


def build_generator(
    info: DatasetInfo,
    latent_dim: int = 100,
    width: int = 64,
    upsample: str = "bilinear",
    condition_dim: int = 0,
    upsamples: int = 2,
    layout: str = "fediod",
) -> Generator:
    """FedIOD's generator for ``info`` (``upsample="nearest"``: MosaicKD's; ``layout="dense"``: DENSE's
    channels); ConfigError on bad values."""
    return Generator(
        info,
        latent_dim=latent_dim,
        width=width,
        upsample=upsample,
        condition_dim=condition_dim,
        upsamples=upsamples,
        layout=layout,
    )
