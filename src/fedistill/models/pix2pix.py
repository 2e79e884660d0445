"""FedIOD's G and D_k for segmentation and reconstruction: the conditional nets of Chang et al.
(AsynDGAN, CVPR 2020), which take them from pix2pix (Isola et al., CVPR 2017).

``ResnetGenerator`` is pix2pix's ``ResnetGenerator(input_nc, output_nc, ngf, norm_layer, use_dropout,
n_blocks, padding_type="reflect")`` layer by layer: reflection-padded 7×7 stem, two stride-2 3×3
downsamplings, ``blocks`` ResNet blocks (reflection padding, conv3×3 → norm → ReLU → [dropout 0.5] →
conv3×3 → norm, plus the identity), two stride-2 transposed 3×3 upsamplings, reflection-padded 7×7
output conv; ``width`` = ngf. Its input is a condition (a label mask, one-hot with
:func:`one_hot_mask` or as given) followed by optional noise channels. pix2pix ends in a tanh for
images in [-1, 1]; here G draws images in [0, 1], as FedIOD's classification generator does
(``models.generator``): ``output="tanh"`` (default) rescales pix2pix's tanh as (t + 1) / 2, so pix2pix
weights draw the same images, ``output="sigmoid"`` ends in a sigmoid. :meth:`ResnetGenerator.forward`
then normalises them with the dataset's mean and std, ready for the local models.

``ConditionalPatchDiscriminator`` is pix2pix's ``NLayerDiscriminator(input_nc, ndf, n_layers)`` seeing
the condition and the image concatenated (condition first, as pix2pix's conditional D): 4×4
convolutions, ``layers`` of them with stride 2 and channel multipliers 1, 2, 4, 8 (capped at 8), then
two with stride 1, LeakyReLU(0.2), no norm after the first; it returns a map of patch logits (no
sigmoid). With 3 layers each logit sees a 70×70 patch (:func:`receptive_field`); a 256×256 input gives
a 30×30 map.

Both keep pix2pix's parameter names (``model.N.*``, ``model.N.conv_block.M.*``), its bias rule (convs
followed by BatchNorm carry no bias; with InstanceNorm, and here also with no norm, they do) and its
initialisation (weights N(0, 0.02), BatchNorm scales N(1, 0.02), biases 0). Defaults are pix2pix's:
width 64, 9 blocks, BatchNorm, dropout in G's blocks, D width 64 with 3 layers; at 240×240 such a G
costs about 44 G multiply-adds per image, so CPU runs want a width of 16 or 32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.models.base import unknown_choice
from fedistill.models.checks import check_divisible, non_negative_int, positive_int
from fedistill.models.norm import DENSE_NORMS, check_norm, make_norm2d

OUTPUTS = ("tanh", "sigmoid")
#: The smallest image side G takes: its blocks reflection-pad the quarter-size map by 1, so it needs 2 px.
MIN_GENERATOR_SIZE = 8
#: How far one unit of a look's parameters moves its colour map (`ResnetGenerator._in_look`).
LOOK_STEP = 10.0


def one_hot_mask(mask: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Label mask (B, H, W) of ints in [0, num_classes) → float condition (B, num_classes, H, W)."""
    if mask.dim() != 3 or mask.dtype.is_floating_point:
        raise ValueError(
            f"a label mask must be an integer tensor (B, H, W), got {mask.dtype} {tuple(mask.shape)}"
        )
    if mask.numel() and (int(mask.min()) < 0 or int(mask.max()) >= num_classes):
        raise ValueError(
            f"mask labels must lie in [0, {num_classes}), got {int(mask.min())}…{int(mask.max())}"
        )
    return F.one_hot(mask.long(), num_classes).permute(0, 3, 1, 2).float()


def init_pix2pix(module: nn.Module, gain: float = 0.02) -> None:
    """pix2pix's ``init_weights(net, "normal", 0.02)``: conv weights N(0, gain), BatchNorm N(1, gain)."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d | nn.ConvTranspose2d):
            nn.init.normal_(m.weight, 0.0, gain)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.normal_(m.weight, 1.0, gain)
            nn.init.zeros_(m.bias)


def _conv_bias(norm: str) -> bool:
    check_norm(norm, DENSE_NORMS)
    return norm in ("instance", "none")


class ResnetBlock(nn.Module):
    """x + (pad → conv3×3 → norm → ReLU → [dropout] → pad → conv3×3 → norm)(x)."""

    def __init__(self, dim: int, norm: str, groups: int, dropout: bool):
        super().__init__()
        bias = _conv_bias(norm)
        layers: list[nn.Module] = [
            nn.ReflectionPad2d(1),
            nn.Conv2d(dim, dim, 3, bias=bias),
            make_norm2d(norm, dim, groups=groups),
            nn.ReLU(True),
        ]
        if dropout:
            layers.append(nn.Dropout(0.5))
        layers += [
            nn.ReflectionPad2d(1),
            nn.Conv2d(dim, dim, 3, bias=bias),
            make_norm2d(norm, dim, groups=groups),
        ]
        self.conv_block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv_block(x)


class ResnetGenerator(nn.Module):
    """condition (B, condition_channels, H, W) [+ noise] → image (B, channels, H, W); H, W multiples of 4,
    at least 8."""

    def __init__(
        self,
        info: DatasetInfo,
        condition_channels: int,
        *,
        noise_channels: int = 0,
        width: int = 64,
        blocks: int = 9,
        norm: str = "batch",
        groups: int = 2,
        dropout: bool = True,
        output: str = "tanh",
        looks: int = 0,
    ):
        super().__init__()
        self.condition_channels = positive_int("generator condition_channels", condition_channels)
        self.looks = non_negative_int("generator looks", looks)
        if self.looks >= self.condition_channels:
            raise ConfigError(
                f"generator looks = {looks} must leave the mask among its {condition_channels} condition "
                "channels"
            )
        self.noise_channels = non_negative_int("generator noise_channels", noise_channels)
        width = positive_int("generator width", width)
        blocks = non_negative_int("generator blocks", blocks)
        if not isinstance(dropout, bool):
            raise ConfigError(f"generator dropout must be true or false, got {dropout!r}")
        if output not in OUTPUTS:
            raise unknown_choice("generator output", output, OUTPUTS)
        check_divisible(f"the ResNet generator (dataset {info.name!r})", info.image_size, info.image_size, 4)
        if info.image_size < MIN_GENERATOR_SIZE:
            raise ConfigError(
                f"the ResNet generator needs images of at least {MIN_GENERATOR_SIZE}×{MIN_GENERATOR_SIZE} "
                f"(its blocks reflection-pad the quarter-size map), got {info.image_size}×{info.image_size} "
                f"(dataset {info.name!r})"
            )
        bias = _conv_bias(norm)
        self.width, self.blocks, self.output, self.channels = width, blocks, output, info.channels

        layers: list[nn.Module] = [
            nn.ReflectionPad2d(3),
            nn.Conv2d(self.condition_channels - self.looks + self.noise_channels, width, 7, bias=bias),
            make_norm2d(norm, width, groups=groups),
            nn.ReLU(True),
        ]
        for mult in (1, 2):  # H → H/2 → H/4, channels width → 2·width → 4·width
            layers += [
                nn.Conv2d(width * mult, width * mult * 2, 3, stride=2, padding=1, bias=bias),
                make_norm2d(norm, width * mult * 2, groups=groups),
                nn.ReLU(True),
            ]
        layers += [ResnetBlock(4 * width, norm, groups, dropout) for _ in range(blocks)]
        for mult in (4, 2):  # H/4 → H/2 → H
            layers += [
                nn.ConvTranspose2d(
                    width * mult, width * mult // 2, 3, stride=2, padding=1, output_padding=1, bias=bias
                ),
                make_norm2d(norm, width * mult // 2, groups=groups),
                nn.ReLU(True),
            ]
        layers += [nn.ReflectionPad2d(3), nn.Conv2d(width, info.channels, 7)]
        layers.append(nn.Tanh() if output == "tanh" else nn.Sigmoid())
        self.model = nn.Sequential(*layers)
        init_pix2pix(self)
        if self.looks:  # each look a colour map C -> C of the image in [0, 1], the identity at the start
            self.look_matrix = nn.Parameter(torch.zeros(self.looks, info.channels, info.channels))
            self.look_bias = nn.Parameter(torch.zeros(self.looks, info.channels))
        # Normalisation constants: buffers so they follow .to(device), not saved in the state dict.
        self.register_buffer(
            "mean", torch.tensor(info.mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False
        )
        self.register_buffer(
            "std", torch.tensor(info.std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False
        )

    def forward_unit(self, condition: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        """Images in [0, 1], e.g. for plotting or a VGG perceptual loss (with looks, each image in its
        look's colours, which may leave [0, 1] a little)."""
        self._check_condition(condition)
        mask = condition[:, : self.condition_channels - self.looks]
        out = self.model(self._input(mask, noise))
        out = (out + 1) / 2 if self.output == "tanh" else out
        return self._in_look(out, condition[:, self.condition_channels - self.looks :]) if self.looks else out

    def _in_look(self, image: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
        """`image` through the colour map of the look its one-hot `planes` name: (I + s M_k) x + s b_k.
        The scale s = LOOK_STEP lets Adam's steps of G's learning rate turn a look's colours over within a
        run's few hundred G-steps (a fluorescence site's look inverts the H&E-like ones' brightness)."""
        which = planes[:, :, 0, 0]  # (B, looks) one-hot
        matrix = torch.eye(image.shape[1], device=image.device) + LOOK_STEP * torch.einsum(
            "bk,kij->bij", which, self.look_matrix
        )
        bias = LOOK_STEP * which @ self.look_bias
        return torch.einsum("bij,bjhw->bihw", matrix, image) + bias[:, :, None, None]

    def forward(
        self, condition: torch.Tensor, noise: torch.Tensor | None = None, *, unit: bool = False
    ) -> torch.Tensor:
        """Images normalised with the dataset's mean/std, or in [0, 1] when ``unit`` is true."""
        x01 = self.forward_unit(condition, noise)
        return x01 if unit else (x01 - self.mean) / self.std

    def sample_noise(self, condition: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """N(0, I) noise (B, noise_channels, H, W) for ``condition``, on this module's device."""
        b, _, h, w = condition.shape
        gen_device = generator.device if generator is not None else self.mean.device
        noise = torch.randn(b, self.noise_channels, h, w, generator=generator, device=gen_device)
        return noise.to(self.mean.device)

    def _check_condition(self, condition: torch.Tensor) -> None:
        if condition.dim() != 4 or condition.shape[1] != self.condition_channels:
            raise ValueError(
                f"the generator expects a condition (B, {self.condition_channels}, H, W), "
                f"got {tuple(condition.shape)}"
            )
        check_divisible("the ResNet generator", condition.shape[-2], condition.shape[-1], 4)
        if min(condition.shape[-2:]) < MIN_GENERATOR_SIZE:
            raise ValueError(
                f"the ResNet generator needs images of at least {MIN_GENERATOR_SIZE}×{MIN_GENERATOR_SIZE}, "
                f"got {condition.shape[-2]}×{condition.shape[-1]}"
            )

    def _input(self, condition: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        if self.noise_channels == 0:
            if noise is not None:
                raise ValueError("this generator takes no noise (noise_channels=0)")
            return condition
        if noise is None or tuple(noise.shape) != (
            condition.shape[0],
            self.noise_channels,
            *condition.shape[2:],
        ):
            got = None if noise is None else tuple(noise.shape)
            raise ValueError(
                f"the generator needs noise (B, {self.noise_channels}, H, W) matching the condition "
                f"{tuple(condition.shape)} (see sample_noise), got {got}"
            )
        return torch.cat([condition, noise], dim=1)


def _patch_output_size(size: int, layers: int) -> int:
    """Side of the logit map for an input side ``size``; 0 when the input is too small."""
    for _ in range(layers):
        size = (size + 2 - 4) // 2 + 1 if size >= 2 else 0
    for _ in range(2):
        size = size - 1 if size >= 2 else 0
    return max(size, 0)


def patch_min_size(layers: int) -> int:
    """The smallest image side a conditional PatchGAN of `layers` layers gives a logit map for."""
    return next(s for s in range(1, 1 << 16) if _patch_output_size(s, layers) > 0)


def receptive_field(net: nn.Module) -> int:
    """Side of the input square one output of a plain chain of convolutions sees (pooling ignored)."""
    field, jump = 1, 1
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            field += (m.kernel_size[0] - 1) * m.dilation[0] * jump
            jump *= m.stride[0]
    return field


class ConditionalPatchDiscriminator(nn.Module):
    """(condition (B, c, H, W), image (B, channels, H, W)) → patch logits (B, 1, h, w)."""

    def __init__(
        self,
        info: DatasetInfo,
        condition_channels: int,
        *,
        width: int = 64,
        layers: int = 3,
        norm: str = "batch",
        groups: int = 2,
    ):
        super().__init__()
        self.condition_channels = positive_int("discriminator condition_channels", condition_channels)
        width = positive_int("discriminator width", width)
        self.layers = positive_int("discriminator layers", layers)
        self.min_size = patch_min_size(self.layers)
        if info.image_size < self.min_size:
            raise ConfigError(
                f"a patch discriminator with {self.layers} layers needs images of at least "
                f"{self.min_size}×{self.min_size}, got {info.image_size} (dataset {info.name!r})"
            )
        bias = _conv_bias(norm)
        self.width, self.channels = width, info.channels
        seq: list[nn.Module] = [
            nn.Conv2d(self.condition_channels + info.channels, width, 4, stride=2, padding=1),
            nn.LeakyReLU(0.2, True),
        ]
        mult = 1
        for n in range(1, self.layers + 1):  # the last of these keeps the size (stride 1)
            prev, mult = mult, min(2**n, 8)
            stride = 2 if n < self.layers else 1
            seq += [
                nn.Conv2d(width * prev, width * mult, 4, stride=stride, padding=1, bias=bias),
                make_norm2d(norm, width * mult, groups=groups),
                nn.LeakyReLU(0.2, True),
            ]
        seq.append(nn.Conv2d(width * mult, 1, 4, stride=1, padding=1))  # one logit per patch
        self.model = nn.Sequential(*seq)
        init_pix2pix(self)

    @property
    def receptive_field(self) -> int:
        """The side, in input pixels, of the patch each logit of the map judges."""
        return receptive_field(self.model)

    def output_size(self, size: int) -> int:
        """Side of the logit map for an input side ``size`` (0: too small)."""
        return _patch_output_size(size, self.layers)

    def forward(self, condition: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        if condition.shape[1] != self.condition_channels or image.shape[1] != self.channels:
            raise ValueError(
                f"the discriminator expects a condition with {self.condition_channels} channels and an "
                f"image with {self.channels}, got {tuple(condition.shape)} and {tuple(image.shape)}"
            )
        if min(image.shape[-2:]) < self.min_size:
            raise ValueError(
                f"the discriminator needs images of at least {self.min_size}×{self.min_size}, "
                f"got {tuple(image.shape)}"
            )
        return self.model(torch.cat([condition, image], dim=1))


def build_conditional_generator(
    info: DatasetInfo,
    condition_channels: int,
    *,
    noise_channels: int = 0,
    width: int = 64,
    blocks: int = 9,
    norm: str = "batch",
    group_norm_groups: int = 2,
    dropout: bool = True,
    output: str = "tanh",
    looks: int = 0,
) -> ResnetGenerator:
    """FedIOD's conditional G for a per-pixel task (pix2pix defaults); ConfigError on bad values. With
    `looks` = K the last K condition channels are a site's one-hot planes: the net draws from the mask
    alone and each site's images come out in that site's colours (FedIOD's `site_looks`)."""
    return ResnetGenerator(
        info,
        condition_channels,
        noise_channels=noise_channels,
        width=width,
        blocks=blocks,
        norm=norm,
        groups=group_norm_groups,
        dropout=dropout,
        output=output,
        looks=looks,
    )


def build_conditional_discriminator(
    info: DatasetInfo,
    condition_channels: int,
    *,
    width: int = 64,
    layers: int = 3,
    norm: str = "batch",
    group_norm_groups: int = 2,
) -> ConditionalPatchDiscriminator:
    """One client's conditional 70×70 PatchGAN D_k (pix2pix defaults); ConfigError on bad values."""
    return ConditionalPatchDiscriminator(
        info, condition_channels, width=width, layers=layers, norm=norm, groups=group_norm_groups
    )
