"""Generator and patch discriminator: shapes, ranges, normalisation, released-code layers, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.data.transforms import normalize
from fedistill.errors import ConfigError
from fedistill.models.base import count_parameters
from fedistill.models.discriminator import PatchDiscriminator, build_discriminator
from fedistill.models.generator import Generator, build_generator

DIGITS = DatasetInfo("digits", 1, 8, 10, (0.3,), (0.4,))
MNIST = DatasetInfo("mnist", 1, 28, 10, (0.1307,), (0.3081,))
CIFAR10 = DatasetInfo("cifar10", 3, 32, 10, (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))
INFOS = [DIGITS, MNIST, CIFAR10]
IDS = [f"{i.name}-{i.image_size}" for i in INFOS]


def info_of_size(size: int, channels: int = 1) -> DatasetInfo:
    return DatasetInfo("odd", channels, size, 10, (0.5,) * channels, (0.25,) * channels)


def expected_generator_parameters(info: DatasetInfo, latent: int, w: int) -> int:
    s = info.image_size // 4
    linear = latent * 4 * w * s * s + 4 * w * s * s
    convs = 4 * w * 2 * w * 9 + 2 * w * w * 9 + w * info.channels * 9 + info.channels
    norms = 2 * (4 * w + 2 * w + w)
    return linear + convs + norms


def expected_discriminator_parameters(info: DatasetInfo, w: int) -> int:
    return info.channels * w * 16 + w + w * 2 * w * 16 + 2 * (2 * w) + 2 * w


# ---------------------------------------------------------------- generator


@pytest.mark.parametrize("info", INFOS, ids=IDS)
@pytest.mark.parametrize("upsample", ["bilinear", "nearest"])
def test_generator_shapes_and_ranges(info: DatasetInfo, upsample: str):
    torch.manual_seed(0)
    gen = Generator(info, latent_dim=16, width=8, upsample=upsample)
    z = gen.sample_latent(5)
    assert z.shape == (5, 16)
    x01 = gen.forward_unit(z)
    assert x01.shape == (5, info.channels, info.image_size, info.image_size)
    assert x01.min() >= 0 and x01.max() <= 1
    assert torch.equal(gen(z, unit=True), x01)
    x = gen(z)
    assert x.shape == x01.shape
    torch.testing.assert_close(x, normalize(x01, info), rtol=0, atol=0)  # bitwise: the same formula


@pytest.mark.parametrize("info", INFOS, ids=IDS)
def test_generator_forward_is_normalised_unit_output(info: DatasetInfo):
    torch.manual_seed(1)
    gen = Generator(info, width=8).eval()  # eval: BN uses running stats, so two calls agree
    z = gen.sample_latent(4)
    mean = torch.tensor(info.mean).view(1, -1, 1, 1)
    std = torch.tensor(info.std).view(1, -1, 1, 1)
    torch.testing.assert_close(gen(z), (gen.forward_unit(z) - mean) / std)
    assert count_parameters(gen) == expected_generator_parameters(info, 100, 8)


def test_generator_matches_released_layers_at_cifar_size():
    gen = build_generator(CIFAR10)  # latent 100, width 64, bilinear: FedIOD's defaults
    assert count_parameters(gen) == 2_026_051 == expected_generator_parameters(CIFAR10, 100, 64)
    shapes = {k: tuple(v.shape) for k, v in gen.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert shapes == {
        "l1.0.weight": (16384, 100),
        "l1.0.bias": (16384,),
        **{f"conv_blocks.0.{k}": (256,) for k in ("weight", "bias", "running_mean", "running_var")},
        "conv_blocks.2.weight": (128, 256, 3, 3),
        **{f"conv_blocks.3.{k}": (128,) for k in ("weight", "bias", "running_mean", "running_var")},
        "conv_blocks.6.weight": (64, 128, 3, 3),
        **{f"conv_blocks.7.{k}": (64,) for k in ("weight", "bias", "running_mean", "running_var")},
        "conv_blocks.9.weight": (3, 64, 3, 3),
        "conv_blocks.9.bias": (3,),
    }
    assert "mean" not in gen.state_dict() and "std" not in gen.state_dict()
    ups = [m for m in gen.conv_blocks if isinstance(m, nn.Upsample)]
    assert [u.mode for u in ups] == ["nearest", "bilinear"]
    assert isinstance(gen.conv_blocks[-1], nn.Sigmoid)
    mosaickd = build_generator(CIFAR10, upsample="nearest")
    assert [m.mode for m in mosaickd.conv_blocks if isinstance(m, nn.Upsample)] == ["nearest", "nearest"]


def test_the_dense_layout_has_the_official_dense_generators_parameters():
    """DENSE's released generator (nz = 256, ngf = 64, 32x32x3): FedIOD's layers with 2w channels before
    the first convolution instead of 4w. By hand, s = 32 // 4 = 8:
      l1: 256 * (128 * 8 * 8) + 128 * 8 * 8 = 2,105,344     BN(128): 256
      conv 128 -> 128, 3x3, no bias: 147,456                 BN(128): 256
      conv 128 -> 64, 3x3, no bias: 73,728                   BN(64): 128
      conv 64 -> 3, 3x3, with bias: 1,731
      total 2,328,899 (FedIOD's layout at these sizes, the default: 4,581,955)."""
    dense = build_generator(CIFAR10, latent_dim=256, width=64, upsample="nearest", layout="dense")
    assert count_parameters(dense) == 2_328_899
    default = build_generator(CIFAR10, latent_dim=256, width=64, upsample="nearest")
    assert default.layout == "fediod" and count_parameters(default) == 4_581_955
    assert [k for k in dense.state_dict()] == [k for k in default.state_dict()]  # the same names
    assert dense.l1[0].out_features == 128 * 8 * 8 and dense.conv_blocks[2].in_channels == 128
    assert dense(dense.sample_latent(2)).shape == (2, 3, 32, 32)


@pytest.mark.parametrize("upsamples", [0, 1])
def test_generator_with_fewer_upsamplings_builds_at_a_larger_size(upsamples: int):
    """upsamples = 1 / 0: the same layers from a half- / full-size grid; a dropped upsampling is an
    identity, so the layer indices and names stay those of the paper's G (upsamples = 2)."""
    paper = build_generator(DIGITS, width=8)
    gen = build_generator(DIGITS, width=8, upsamples=upsamples)
    assert gen.init_size == 8 // 2**upsamples and paper.init_size == 2
    assert gen(gen.sample_latent(3)).shape == (3, 1, 8, 8)
    assert [k for k in gen.state_dict()] == [k for k in paper.state_dict()]
    assert gen.l1[0].out_features == 4 * 8 * gen.init_size**2
    modes = [m.mode for m in gen.conv_blocks if isinstance(m, nn.Upsample)]
    assert modes == ["nearest"][:upsamples]
    assert sum(isinstance(m, nn.Identity) for m in gen.conv_blocks) == 2 - upsamples


def test_generator_is_deterministic_under_seed():
    def draw(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(seed)
        gen = Generator(MNIST, width=8)
        z = gen.sample_latent(3)
        return z, gen(z)

    z1, x1 = draw(0)
    z2, x2 = draw(0)
    assert torch.equal(z1, z2) and torch.equal(x1, x2)
    assert not torch.equal(draw(1)[0], z1)

    gen = Generator(DIGITS, width=8)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(gen.sample_latent(4, g1), gen.sample_latent(4, g2))
    assert gen.sample_latent(4, g1).shape == (4, 100)


def test_generator_metadata_records_what_its_weights_do_not():
    """The first layer's input is latent_dim + condition_dim: the weights fix the sum, not the split."""
    assert Generator(DIGITS, latent_dim=8, width=4, upsamples=1).export_metadata() == {"upsamples": "1"}
    conditional = Generator(DIGITS, latent_dim=8, width=4, condition_dim=3)
    assert conditional.export_metadata() == {"upsamples": "2", "condition_dim": "3"}


def test_generator_names_the_input_it_expects():
    conditional = Generator(DIGITS, latent_dim=8, width=4, condition_dim=3)
    with pytest.raises(ValueError, match=r"latent \(B, 8\) followed by a condition \(B, 3\).*got \(2, 8\)"):
        conditional(conditional.sample_latent(2))  # the condition left out
    assert conditional(torch.randn(2, 11)).shape == (2, 1, 8, 8)
    with pytest.raises(ValueError, match=r"latent \(B, 8\), got \(2, 11\)"):
        Generator(DIGITS, latent_dim=8, width=4)(torch.randn(2, 11))


def test_generator_gradients_reach_every_parameter():
    gen = Generator(DIGITS, latent_dim=8, width=4)
    gen(gen.sample_latent(6)).square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in gen.parameters())


@pytest.mark.parametrize("size", [4, 8, 12, 28, 32, 64])
def test_generator_accepts_sizes_divisible_by_four(size: int):
    gen = Generator(info_of_size(size), latent_dim=4, width=2)
    assert gen.init_size == size // 4
    assert gen(gen.sample_latent(2)).shape == (2, 1, size, size)


@pytest.mark.parametrize("size", [30, 7, 2, 0])
def test_generator_rejects_sizes_not_divisible_by_four(size: int):
    with pytest.raises(ConfigError, match=rf"\b{size}\b"):
        Generator(info_of_size(size))


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"latent_dim": 0}, "latent_dim.*0"),
        ({"latent_dim": -3}, "latent_dim.*-3"),
        ({"width": 0}, "width.*0"),
        ({"width": 2.5}, "width.*2.5"),
        ({"width": True}, "width.*True"),
        ({"upsample": "bicubic"}, "upsample mode 'bicubic'.*bilinear, nearest"),
        ({"upsample": "bilinar"}, "did you mean 'bilinear'"),
        ({"upsamples": 3}, "upsamples must be 0, 1 or 2, got 3"),
        ({"upsamples": True}, "upsamples must be 0, 1 or 2, got True"),
        ({"layout": "dcgan"}, "generator layout 'dcgan'.*fediod, dense"),
    ],
)
def test_build_generator_rejects_bad_values(kwargs: dict, named: str):
    with pytest.raises(ConfigError, match=named):
        build_generator(CIFAR10, **kwargs)


# ---------------------------------------------------------------- discriminator


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize(
    ("info", "width", "patches"), [(DIGITS, 32, 2), (MNIST, 64, 7), (CIFAR10, 128, 8)], ids=IDS
)
def test_discriminator_patch_map(info: DatasetInfo, width: int, patches: int, fast: bool):
    disc = build_discriminator(info, width=width, fast=fast)
    x = torch.randn(3, info.channels, info.image_size, info.image_size)
    assert disc(x).shape == (3, 1, patches, patches)
    assert count_parameters(disc) == expected_discriminator_parameters(info, width)


def test_discriminator_matches_released_layers_at_cifar_size():
    disc = build_discriminator(CIFAR10)  # width 128, plain nn.Conv2d layers
    assert not disc.fast
    assert count_parameters(disc) == 531_328
    shapes = {
        k: tuple(v.shape) for k, v in disc.state_dict().items() if not k.endswith("num_batches_tracked")
    }
    assert shapes == {
        "main.0.weight": (128, 3, 4, 4),
        "main.0.bias": (128,),
        "main.2.weight": (256, 128, 4, 4),
        **{f"main.3.{k}": (256,) for k in ("weight", "bias", "running_mean", "running_var")},
        "main.5.weight": (1, 256, 1, 1),
    }


@pytest.mark.parametrize(
    ("info", "width"),
    [(DIGITS, 32), (MNIST, 16), (CIFAR10, 16), (info_of_size(10, 2), 8)],
    ids=["digits", "mnist", "cifar10", "2x10x10"],
)
def test_discriminator_fast_path_equals_plain_convolution(info: DatasetInfo, width: int):
    torch.manual_seed(0)
    plain = PatchDiscriminator(info, width=width, fast=False)
    fast = PatchDiscriminator(info, width=width, fast=True)
    fast.load_state_dict(plain.state_dict())
    x = torch.randn(5, info.channels, info.image_size, info.image_size)
    x_plain, x_fast = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_plain, out_fast = plain(x_plain), fast(x_fast)
    torch.testing.assert_close(out_fast, out_plain, rtol=0, atol=1e-5)
    weights = torch.randn_like(out_plain)  # a loss with a different gradient for every patch
    (out_plain * weights).sum().backward()
    (out_fast * weights).sum().backward()
    torch.testing.assert_close(x_fast.grad, x_plain.grad, rtol=0, atol=1e-5)
    for (name, p_plain), p_fast in zip(plain.named_parameters(), fast.parameters(), strict=True):
        torch.testing.assert_close(p_fast.grad, p_plain.grad, rtol=1e-5, atol=1e-5, msg=name)
    for key, value in plain.state_dict().items():  # BN running statistics updated alike
        torch.testing.assert_close(fast.state_dict()[key], value, rtol=0, atol=1e-5)


def test_discriminator_is_deterministic_under_seed():
    def run(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        disc = PatchDiscriminator(DIGITS, width=8)
        return disc(torch.randn(4, 1, 8, 8))

    assert torch.equal(run(0), run(0))
    assert not torch.equal(run(0), run(1))


def test_generator_output_feeds_discriminator():
    gen, disc = Generator(MNIST, width=4), PatchDiscriminator(MNIST, width=8)
    logits = disc(gen(gen.sample_latent(2)))
    assert logits.shape == (2, 1, 7, 7)
    logits.mean().backward()
    assert gen.l1[0].weight.grad is not None


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"width": 0}, "width.*0"), ({"width": -8}, "width.*-8"), ({"fast": "yes"}, "fast.*'yes'")],
)
def test_build_discriminator_rejects_bad_values(kwargs: dict, named: str):
    with pytest.raises(ConfigError, match=named):
        build_discriminator(CIFAR10, **kwargs)


def test_discriminator_rejects_images_too_small():
    with pytest.raises(ConfigError, match=r"\b2\b"):
        PatchDiscriminator(info_of_size(2))
