"""Dense-prediction models: the segmentation and reconstruction U-Nets, the registry's task and option
checks, pix2pix's conditional G and PatchGAN D, and the perceptual loss with its feature networks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.models import build_model, check_model_norm, count_parameters, model_names
from fedistill.models.fastmri_unet import FastMRIUnet
from fedistill.models.perceptual import (
    PerceptualLoss,
    VGG16Features,
    encoder_features,
    load_vgg16_features,
    vgg16_feature_shapes,
)
from fedistill.models.pix2pix import (
    ConditionalPatchDiscriminator,
    build_conditional_discriminator,
    build_conditional_generator,
    one_hot_mask,
)
from fedistill.models.registry import model_options
from fedistill.models.unet import UNet

SEG_TASKS = ["semantic-segmentation", "instance-segmentation"]


def info(channels: int, size: int, classes: int = 2, task: str = "semantic-segmentation") -> DatasetInfo:
    return DatasetInfo("toy", channels, size, classes, (0.5,) * channels, (0.25,) * channels, task=task)


def recon(channels: int = 1, size: int = 32) -> DatasetInfo:
    return info(channels, size, 1, "reconstruction")


def on_meta(build):
    """Build on the meta device: parameter counts of big reference nets without allocating them."""
    with torch.device("meta"):
        return build()


# --- registry -------------------------------------------------------------------------------------


def test_models_by_task():
    assert model_names("semantic-segmentation") == ["unet", "unet-chang"]
    assert model_names("instance-segmentation") == ["unet", "unet-chang"]
    assert model_names("reconstruction") == ["unet-fastmri"]
    assert model_options("unet") == ("width", "depth")
    assert model_options("unet-chang") == ("layout",)
    assert model_options("unet-fastmri") == ("chans", "num_pool_layers", "drop_prob")
    assert model_options("resnet8") == ()


def test_model_refused_for_a_task_it_does_not_serve():
    with pytest.raises(
        ConfigError,
        match=r"model 'resnet8' serves classification, not the 'semantic-segmentation' task of dataset "
        r"'toy'; models for it: unet, unet-chang",
    ):
        build_model("resnet8", info(1, 32))
    with pytest.raises(
        ConfigError, match=r"'unet' serves semantic-segmentation, instance-segmentation.*resnet8"
    ):
        build_model("unet", info(1, 32, 10, "classification"))
    with pytest.raises(ConfigError, match="models for it: unet-fastmri"):
        build_model("unet", recon())
    with pytest.raises(ConfigError, match="no registered model serves it"):
        build_model("unet", info(1, 32, 2, "denoising"))


def test_options_reach_the_model_and_unknown_ones_are_refused():
    net = build_model("unet", info(1, 16), options={"width": 4, "depth": 2})
    assert isinstance(net, UNet) and (net.width, net.depth) == (4, 2)
    with pytest.raises(ConfigError, match=r"unknown option of model 'unet' 'widht'; did you mean 'width'"):
        build_model("unet", info(1, 16), options={"widht": 4})
    with pytest.raises(ConfigError, match=r"unknown option of model 'unet-chang' 'width'.*valid: layout"):
        build_model("unet-chang", info(1, 16), options={"width": 4})
    with pytest.raises(ConfigError, match="model 'resnet8' takes no options"):
        build_model("resnet8", info(3, 32, 10, "classification"), options={"depth": 3})
    with pytest.raises(ConfigError, match="U-Net width must be a positive integer, got 0"):
        build_model("unet", info(1, 16), options={"width": 0})
    with pytest.raises(ConfigError, match=r"drop_prob must be a number in \[0, 1\), got 1.5"):
        build_model("unet-fastmri", recon(), options={"drop_prob": 1.5})


def norm_kinds(model: nn.Module) -> set[type]:
    kinds = (nn.BatchNorm2d, nn.GroupNorm, nn.InstanceNorm2d)
    return {type(m) for m in model.modules() if isinstance(m, kinds)}


def test_norms_per_model():
    seg = info(1, 32)
    assert norm_kinds(build_model("unet", seg, options={"width": 4})) == {nn.BatchNorm2d}
    assert norm_kinds(build_model("unet", seg, norm="instance", options={"width": 4})) == {nn.InstanceNorm2d}
    grouped = build_model("unet", seg, norm="group", group_norm_groups=2, options={"width": 4})
    assert norm_kinds(grouped) == {nn.GroupNorm}
    plain = build_model("unet", seg, norm="none", options={"width": 4})
    assert norm_kinds(plain) == set()
    assert all(c.bias is not None for c in plain.modules() if isinstance(c, nn.Conv2d))
    assert norm_kinds(build_model("unet-fastmri", recon(), options={"chans": 4})) == {nn.InstanceNorm2d}
    assert norm_kinds(build_model("unet-fastmri", recon(), norm="batch", options={"chans": 4})) == {
        nn.BatchNorm2d
    }
    with pytest.raises(ConfigError, match="model 'resnet8' offers norm batch, group, none, not 'instance'"):
        build_model("resnet8", info(3, 32, 10, "classification"), norm="instance")
    with pytest.raises(ConfigError, match=r"did you mean 'instance'.*valid: batch, group, instance, none"):
        build_model("unet", seg, norm="instanc")


def test_norm_auto_is_the_model_default_as_the_config_writes_it():
    """`norm = "auto"` is the config's default and what a run records: build_model takes it as None."""
    assert norm_kinds(build_model("unet-fastmri", recon(), norm="auto", options={"chans": 4})) == {
        nn.InstanceNorm2d
    }
    assert norm_kinds(build_model("unet", info(1, 32), norm="auto", options={"width": 4})) == {nn.BatchNorm2d}
    check_model_norm("unet-fastmri", "auto")
    check_model_norm("vgg9", "auto")


# --- U-Net ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", SEG_TASKS)
@pytest.mark.parametrize(("channels", "size", "classes"), [(1, 16, 2), (3, 32, 4), (2, 48, 3)])
def test_unet_keeps_the_size_and_gives_class_logits(task: str, channels: int, size: int, classes: int):
    torch.manual_seed(0)
    net = build_model("unet", info(channels, size, classes, task), options={"width": 4})
    assert net(torch.randn(2, channels, size, size)).shape == (2, classes, size, size)
    assert net(torch.randn(1, channels, 32, 64)).shape == (1, classes, 32, 64)  # not only squares


def test_unet_refuses_sizes_it_cannot_keep():
    with pytest.raises(
        ConfigError, match=r"depth 4 \(dataset 'toy'\) needs image sides divisible by 16, got 30×30"
    ):
        build_model("unet", info(1, 30))
    net = build_model("unet", info(1, 16), options={"width": 4, "depth": 2})
    assert net(torch.randn(1, 1, 12, 12)).shape == (1, 2, 12, 12)  # 12 = 3·2²
    with pytest.raises(ConfigError, match="divisible by 4, got 10×12"):
        net(torch.randn(1, 1, 10, 12))


def test_unet_parameter_counts():
    # DoubleConv(a, b) with BatchNorm: 9ab + 9b² weights (no bias) + 2·2b norm parameters.
    # Levels 1→16→32→64→128→256: 2,512 + 13,952 + 55,552 + 221,696 + 885,760 = 1,179,472.
    # Up level c → c/2: transposed conv 4·c·c/2 + c/2, then DoubleConv(c, c/2):
    # 574,080 (c=256) + 143,680 + 36,000 + 9,040 (c=32) = 762,800; 1×1 head 16·2 + 2 = 34.
    assert count_parameters(build_model("unet", info(1, 32))) == 1_942_306
    # unet-chang is the same layout at widths 64…1024: the widely used PyTorch U-Net's 31,037,698 for
    # RGB input and 2 classes (its first conv has 9·64 fewer weights per input channel less).
    assert count_parameters(on_meta(lambda: build_model("unet-chang", info(3, 256)))) == 31_037_698
    assert count_parameters(on_meta(lambda: build_model("unet-chang", info(1, 240)))) == 31_036_546


def test_unet_chang_asyndgan_layout_follows_chang_et_al_released_unet():
    """AsynDGAN's released models/UNet.py: every 3×3 conv has a bias and runs conv → ReLU → BatchNorm,
    dropout 0.5 acts on the bottleneck, and the upsampled map comes before the skip in the
    concatenation; 31,043,586 parameters for RGB input and 2 classes, the default layout's 31,037,698
    plus the 5,888 biases of its 18 3×3 convs (3,968 on the way down, 1,920 on the way up)."""
    net = on_meta(lambda: build_model("unet-chang", info(3, 256), options={"layout": "asyndgan"}))
    assert count_parameters(net) == 31_037_698 + 5_888 == 31_043_586
    assert [type(m) for m in net.encoder.levels[0]] == [nn.Conv2d, nn.ReLU, nn.BatchNorm2d] * 2
    assert all(m.bias is not None for m in net.modules() if isinstance(m, nn.Conv2d))
    small = UNet(1, 2, width=4, depth=2, layout="asyndgan")
    seen = {}
    small.decoder[0].conv.register_forward_hook(lambda m, args, out: seen.update(x=args[0]))
    small.decoder[0].up.register_forward_hook(lambda m, args, out: seen.update(up=out))
    x = torch.randn(2, 1, 16, 16)
    small.eval()
    assert torch.equal(small(x), small(x))
    assert torch.equal(seen["x"][:, : seen["up"].shape[1]], seen["up"])  # upsampled first, then the skip
    small.train()
    torch.manual_seed(0)
    assert not torch.equal(small(x), small(x))  # the bottleneck dropout
    with pytest.raises(ConfigError, match="layout must be one of"):
        build_model("unet-chang", info(3, 32), options={"layout": "bilinear"})


def test_unet_chang_configuration():
    net = on_meta(lambda: build_model("unet-chang", info(1, 240)))
    assert (net.width, net.depth) == (64, 4)
    assert [level.conv2.out_channels for level in net.encoder.levels] == [64, 128, 256, 512, 1024]
    assert norm_kinds(net) == {nn.BatchNorm2d}


# --- fastMRI U-Net --------------------------------------------------------------------------------


def test_fastmri_unet_reference_parameter_count():
    # ConvBlock(a, b) = 9ab + 9b² weights (no bias; InstanceNorm has no parameters);
    # TransposeConvBlock(a, b) = 4ab. Down: (1,32) 9,504 + (32,64) 55,296 + (64,128) 221,184
    # + (128,256) 884,736; bottleneck (256,512) 3,538,944.
    # Up: 524,288 + 1,769,472 (512→256), 131,072 + 442,368, 32,768 + 110,592, 8,192 + 27,648 (64→32).
    # Final 1×1 conv 32·1 + 1 = 33. Total 7,756,097.
    net = on_meta(lambda: build_model("unet-fastmri", recon(1, 320)))
    assert count_parameters(net) == 7_756_097
    assert (net.chans, net.num_pool_layers, net.drop_prob) == (32, 4, 0.0)


def test_fastmri_unet_keeps_fastmri_parameter_names():
    keys = set(build_model("unet-fastmri", recon(), options={"chans": 4}).state_dict())
    for key in (
        "down_sample_layers.0.layers.0.weight",
        "down_sample_layers.3.layers.4.weight",
        "conv.layers.4.weight",
        "up_transpose_conv.0.layers.0.weight",
        "up_conv.0.layers.4.weight",
        "up_conv.3.0.layers.4.weight",
        "up_conv.3.1.weight",
        "up_conv.3.1.bias",
    ):
        assert key in keys, key
    assert not any(k.endswith("bias") for k in keys - {"up_conv.3.1.bias"})


@pytest.mark.parametrize(("channels", "size", "pools"), [(1, 32, 4), (2, 16, 2), (1, 24, 3)])
def test_fastmri_unet_shapes(channels: int, size: int, pools: int):
    torch.manual_seed(0)
    options = {"chans": 4, "num_pool_layers": pools, "drop_prob": 0.1}
    net = build_model("unet-fastmri", recon(channels, size), options=options)
    assert isinstance(net, FastMRIUnet)
    assert net(torch.randn(2, channels, size, size)).shape == (2, channels, size, size)
    assert {m.p for m in net.modules() if isinstance(m, nn.Dropout2d)} == {0.1}
    assert len(net.encode(torch.randn(1, channels, size, size))) == pools + 1


def test_fastmri_unet_refuses_sizes_it_cannot_keep():
    with pytest.raises(ConfigError, match=r"4 poolings .*divisible by 16, got 40×40"):
        build_model("unet-fastmri", recon(1, 40))
    net = build_model("unet-fastmri", recon(1, 32), options={"chans": 4})
    with pytest.raises(ConfigError, match="divisible by 16"):
        net(torch.randn(1, 1, 32, 40))
    # InstanceNorm needs more than one pixel per map at the bottleneck
    with pytest.raises(
        ConfigError, match=r"norm 'instance' needs at least 2×2 pixels after 4 poolings.*32×32"
    ):
        build_model("unet-fastmri", recon(1, 16))
    assert build_model("unet-fastmri", recon(1, 16), norm="batch", options={"chans": 4}) is not None


# --- pix2pix G and D ------------------------------------------------------------------------------


def test_one_hot_mask():
    mask = torch.tensor([[[0, 1], [2, 1]]])
    cond = one_hot_mask(mask, 3)
    assert cond.shape == (1, 3, 2, 2) and cond.dtype == torch.float32
    assert torch.equal(cond.argmax(1), mask) and torch.equal(cond.sum(1), torch.ones(1, 2, 2))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        one_hot_mask(mask, 2)


@pytest.mark.parametrize("output", ["tanh", "sigmoid"])
@pytest.mark.parametrize(("channels", "size", "cond"), [(1, 16, 2), (3, 24, 1)])
def test_generator_draws_unit_images_then_normalises(output: str, channels: int, size: int, cond: int):
    torch.manual_seed(0)
    data = info(channels, size)
    g = build_conditional_generator(data, cond, width=4, blocks=2, output=output).eval()
    c = torch.rand(3, cond, size, size)
    unit = g(c, unit=True)
    assert unit.shape == (3, channels, size, size)
    assert unit.min() >= 0 and unit.max() <= 1
    assert torch.allclose(g(c), (unit - 0.5) / 0.25)


def test_generator_noise_channels():
    g = build_conditional_generator(info(1, 16), 2, noise_channels=3, width=4, blocks=1)
    c = torch.rand(2, 2, 16, 16)
    noise = g.sample_noise(c, torch.Generator().manual_seed(0))
    assert noise.shape == (2, 3, 16, 16)
    assert g(c, noise).shape == (2, 1, 16, 16)
    with pytest.raises(ValueError, match=r"needs noise \(B, 3, H, W\)"):
        g(c)
    with pytest.raises(ValueError, match=r"expects a condition \(B, 2, H, W\)"):
        g(torch.rand(2, 1, 16, 16), noise)


def test_generator_refuses_sizes_and_bad_options():
    with pytest.raises(ConfigError, match=r"ResNet generator .*divisible by 4, got 30×30"):
        build_conditional_generator(info(1, 30), 2, width=4, blocks=1)
    with pytest.raises(ConfigError, match="unknown generator output 'relu'"):
        build_conditional_generator(info(1, 16), 2, output="relu")
    with pytest.raises(ConfigError, match="condition_channels must be a positive integer"):
        build_conditional_generator(info(1, 16), 0)


def test_generator_refuses_images_its_blocks_cannot_pad():
    """At 4×4 the residual blocks see 1×1 maps, which reflection padding (and InstanceNorm) cannot take."""
    with pytest.raises(ConfigError, match=r"ResNet generator needs images of at least 8×8 .*got 4×4"):
        build_conditional_generator(info(1, 4), 2, width=4, blocks=1)
    g = build_conditional_generator(info(1, 8), 2, width=4, blocks=1)
    assert g(torch.rand(2, 2, 8, 8)).shape == (2, 1, 8, 8)
    with pytest.raises(ValueError, match=r"at least 8×8, got 4×4"):
        g(torch.rand(2, 2, 4, 4))


def test_generator_reference_parameter_counts_and_names():
    # resnet_9blocks, ngf 64, RGB → RGB. With InstanceNorm (CycleGAN) every conv has a bias:
    # stem 7·7·3·64 + 64 = 9,472; downs 73,856 + 295,168; 9 blocks × 2 × (9·256² + 256) = 10,621,440;
    # ups 295,040 + 73,792; output 7·7·64·3 + 3 = 9,411: 11,378,179 (CycleGAN's "11.378 M").
    cyclegan = on_meta(lambda: build_conditional_generator(info(3, 256), 3, norm="instance", dropout=False))
    assert count_parameters(cyclegan) == 11_378_179
    # With BatchNorm (pix2pix) the biases go and each norm adds 2 per channel: 11,383,427.
    pix2pix = on_meta(lambda: build_conditional_generator(info(3, 256), 3))
    assert count_parameters(pix2pix) == 11_383_427
    keys = set(pix2pix.state_dict())
    # model.1 stem conv, model.4/7 downsamplings, model.10… blocks (dropout at conv_block.4), model.26 output
    for key in (
        "model.1.weight",
        "model.4.weight",
        "model.10.conv_block.1.weight",
        "model.10.conv_block.6.weight",
    ):
        assert key in keys, key
    assert {"model.26.weight", "model.26.bias"} <= keys


@pytest.mark.parametrize(("layers", "field"), [(1, 16), (2, 34), (3, 70), (4, 142), (5, 286)])
def test_patch_discriminator_receptive_field(layers: int, field: int):
    d = build_conditional_discriminator(info(1, 512), 1, width=2, layers=layers)
    assert d.receptive_field == field


def test_patch_discriminator_receptive_field_is_seen_by_gradients():
    torch.manual_seed(0)
    d = build_conditional_discriminator(info(1, 128), 1, width=2, norm="none")
    image = torch.randn(1, 1, 128, 128, requires_grad=True)
    out = d(torch.zeros(1, 1, 128, 128), image)
    assert out.shape == (1, 1, 14, 14)  # 128 → 64 → 32 → 16 → 15 → 14
    out[0, 0, 7, 7].backward()
    rows, cols = image.grad[0, 0].abs().sum(1).nonzero(), image.grad[0, 0].abs().sum(0).nonzero()
    assert int(rows.max() - rows.min()) + 1 == 70 and int(cols.max() - cols.min()) + 1 == 70


def test_patch_discriminator_is_conditional_and_sized_like_pix2pix():
    torch.manual_seed(0)
    d = build_conditional_discriminator(info(3, 256), 2, width=4)
    assert isinstance(d, ConditionalPatchDiscriminator)
    assert d.model[0].in_channels == 5  # condition and image concatenated
    assert d(torch.rand(2, 2, 256, 256), torch.rand(2, 3, 256, 256)).shape == (2, 1, 30, 30)
    assert d.output_size(256) == 30 and d.output_size(24) == 1 and d.output_size(23) == 0
    with pytest.raises(ConfigError, match="at least 24×24, got 16"):
        build_conditional_discriminator(info(1, 16), 1)
    with pytest.raises(ValueError, match="condition with 2 channels"):
        d(torch.rand(1, 1, 32, 32), torch.rand(1, 3, 32, 32))
    # pix2pix's D for RGB pairs (6 channels in), ndf 64, BatchNorm:
    # 6,208 + 131,328 + 524,800 + 2,098,176 + 8,193 (its "2.769 M").
    assert count_parameters(on_meta(lambda: build_conditional_discriminator(info(3, 256), 3))) == 2_768_705


# --- perceptual loss ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["unet", "unet-fastmri"])
def test_perceptual_loss_on_a_unet_encoder(name: str):
    torch.manual_seed(0)
    data = info(1, 32) if name == "unet" else recon(1, 32)
    options = {"width": 4} if name == "unet" else {"chans": 4}
    model = build_model(name, data, options=options)
    loss = PerceptualLoss(encoder_features(model))
    x, y = torch.randn(2, 1, 32, 32, requires_grad=True), torch.randn(2, 1, 32, 32)
    assert loss(y, y).item() == 0
    value = loss(x, y)
    assert value.item() > 0
    value.backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in loss.parameters())
    assert all(p.requires_grad and p.grad is None for p in model.parameters())  # the model is untouched
    loss.train()
    assert not loss.features.training  # BatchNorm statistics of the feature network stay fixed


def test_encoder_features_is_a_frozen_copy_on_its_own():
    """Frozen as its docstring says, also outside PerceptualLoss: no gradients, eval-mode BatchNorm."""
    torch.manual_seed(0)
    model = build_model("unet", info(1, 16), options={"width": 4, "depth": 2})
    with torch.no_grad():
        model(torch.randn(4, 1, 16, 16) + 1)  # running statistics other than their init; still training
    features = encoder_features(model)
    assert not features.training
    assert all(not p.requires_grad for p in features.parameters())
    x = torch.randn(1, 1, 16, 16)
    with torch.no_grad():
        expected = model.eval().encoder(x)
    assert all(torch.allclose(a, b) for a, b in zip(features(x), expected, strict=True))


def test_encoder_levels():
    model = build_model("unet", info(1, 16), options={"width": 4, "depth": 2})
    feats = encoder_features(model, levels=[0, 2])(torch.randn(1, 1, 16, 16))
    assert [tuple(f.shape) for f in feats] == [(1, 4, 16, 16), (1, 16, 4, 4)]
    with pytest.raises(ConfigError, match=r"levels must be among 0…2, got \[3\]"):
        encoder_features(model, levels=[3])


def test_perceptual_loss_weights_and_plain_modules():
    conv = nn.Conv2d(1, 2, 3)
    x, y = torch.randn(1, 1, 8, 8), torch.randn(1, 1, 8, 8)
    one = PerceptualLoss(conv)(x, y)
    assert torch.allclose(PerceptualLoss(conv, weights=[2.0])(x, y), 2 * one)
    with pytest.raises(ValueError, match="2 perceptual weights for 1 feature maps"):
        PerceptualLoss(conv, weights=[1.0, 1.0])(x, y)
    with pytest.raises(ValueError, match="0 perceptual weights for 1 feature maps"):
        PerceptualLoss(conv, weights=[])(x, y)  # not silently every weight 1


@pytest.fixture(scope="module")
def vgg_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torchvision's vgg16 state-dict keys and shapes with random values (classifier keys included)."""
    gen = torch.Generator().manual_seed(0)
    tensors = {k: 0.05 * torch.randn(shape, generator=gen) for k, shape in vgg16_feature_shapes().items()}
    tensors["classifier.6.bias"] = torch.zeros(1000)
    path = tmp_path_factory.mktemp("vgg") / "vgg16.safetensors"
    save_file(tensors, str(path))
    return path


def test_vgg16_layout():
    shapes = vgg16_feature_shapes()
    assert len(shapes) == 26 and shapes["features.0.weight"] == (64, 3, 3, 3)
    assert shapes["features.28.weight"] == (512, 512, 3, 3)
    assert count_parameters(VGG16Features(["relu5_3"])) == 14_714_688  # torchvision's vgg16().features
    assert len(VGG16Features(["relu2_2"]).features) == 9  # built only up to the deepest layer asked for
    with pytest.raises(ConfigError, match="unknown VGG-16 layer 'relu2_4'"):
        VGG16Features(["relu2_4"])


def test_vgg16_loads_from_safetensors_and_gives_a_perceptual_loss(vgg_file: Path):
    from safetensors import safe_open

    net = load_vgg16_features(vgg_file)
    with safe_open(str(vgg_file), framework="pt") as f:
        assert torch.equal(net.features[21].weight, f.get_tensor("features.21.weight"))
    loss = PerceptualLoss(net)
    gray = torch.rand(2, 1, 16, 16)
    assert loss(gray, gray).item() == 0
    assert loss(torch.rand(2, 1, 16, 16), gray).item() > 0
    rgb = torch.rand(1, 3, 16, 16)
    feats = net(rgb)
    assert [f.shape[1] for f in feats] == [64, 128, 256, 512]  # relu1_2, relu2_2, relu3_3, relu4_3
    # grayscale is the same image repeated on the three channels
    assert all(
        torch.allclose(a, b) for a, b in zip(net(gray[:1]), net(gray[:1].repeat(1, 3, 1, 1)), strict=True)
    )


def test_vgg16_file_errors(vgg_file: Path, tmp_path: Path):
    with pytest.raises(ConfigError, match="not found; save torchvision's vgg16 state dict"):
        load_vgg16_features(tmp_path / "absent.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError, match="cannot read VGG-16 weights file"):
        load_vgg16_features(junk)
    shapes = vgg16_feature_shapes()
    bad = {k: torch.zeros(s) for k, s in shapes.items() if k != "features.28.bias"}
    bad["features.0.weight"] = torch.zeros(64, 1, 3, 3)
    bad["features.1.running_mean"] = torch.zeros(64)  # a vgg16_bn file
    path = tmp_path / "bad.safetensors"
    save_file(bad, str(path))
    with pytest.raises(
        ConfigError,
        match=r"missing: features\.28\.bias; unexpected: features\.1\.running_mean; "
        r"wrong shape: features\.0\.weight \(64, 1, 3, 3\) \(expected \(64, 3, 3, 3\)\)",
    ):
        load_vgg16_features(path)
