"""FedDF's remaining models: VGG-9 without normalisation, the binarized ResNet-8 and ShuffleNet V2."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.models import Classifier, build_model, count_parameters, model_options
from fedistill.models.binary import BinaryConv2d, sign_ste
from fedistill.models.shufflenet import BasicUnit, DownUnit, channel_shuffle


def make_info(name: str, channels: int, size: int, classes: int) -> DatasetInfo:
    return DatasetInfo(name, channels, size, classes, (0.5,) * channels, (0.25,) * channels)


DIGITS = make_info("digits", 1, 8, 10)
MNIST = make_info("mnist", 1, 28, 10)
CIFAR10 = make_info("cifar10", 3, 32, 10)
NAMES = ["vgg9", "resnet8-binary", "shufflenetv2"]

# feature size per image side: VGG-9 flattens 256 maps of side/8 (floored), the others pool globally
FEATURES = {
    "vgg9": {8: 256, 28: 256 * 3 * 3, 32: 256 * 4 * 4},
    "resnet8-binary": {8: 64, 28: 64, 32: 64},
    "shufflenetv2": {8: 1024, 28: 1024, 32: 1024},
}


def images(info: DatasetInfo, n: int) -> torch.Tensor:
    return torch.randn(n, info.channels, info.image_size, info.image_size)


def binary_convs(model: nn.Module) -> list[BinaryConv2d]:
    return [m for m in model.modules() if isinstance(m, BinaryConv2d)]


@pytest.mark.parametrize("info", [DIGITS, MNIST, CIFAR10], ids=lambda i: f"{i.image_size}px")
@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_split(name: str, info: DatasetInfo):
    torch.manual_seed(0)
    model = build_model(name, info)
    assert isinstance(model, Classifier)
    assert model.feature_dim == FEATURES[name][info.image_size]
    x = images(info, 3)
    assert model.extractor(x).shape == (3, model.feature_dim)
    assert model(x).shape == (3, 10)
    assert all(k.startswith(("extractor.", "classifier.")) for k in model.state_dict())


def test_parameter_counts_for_cifar10():
    # VGG-9, no conv biases (FedDF's code): convs 3·32·9 + 32·64·9 + 64·128·9 + 128·128·9 + 128·256·9
    # + 256·256·9 = 1,125,216; fcs (4096·512 + 512) + (512·512 + 512) + (512·10 + 10) = 2,365,450.
    assert count_parameters(build_model("vgg9", CIFAR10)) == 1_125_216 + 2_365_450
    # FedMA's own VGG-9 adds the conv biases 32 + 64 + 128 + 128 + 256 + 256 = 864.
    assert count_parameters(build_model("vgg9", CIFAR10, options={"conv_bias": True})) == 3_491_530
    # The binarized ResNet-8 keeps resnet8's parameters: its weights are the latent floats.
    assert count_parameters(build_model("resnet8-binary", CIFAR10)) == 78_042
    # ShuffleNet V2 ×1: stem 648 + 48; down unit (c_in → c_out, m = c_out/2) 11·c_in + 2·c_in·m + m² + 17m;
    # basic unit (h = c/2) 2h² + 15h; stages 7,398 + 3·7,598, 43,616 + 7·28,652, 167,968 + 3·111,128;
    # last conv 464·1024 + 2·1024; linear 1024·10 + 10.
    stages = (7_398 + 3 * 7_598) + (43_616 + 7 * 28_652) + (167_968 + 3 * 111_128)
    assert count_parameters(build_model("shufflenetv2", CIFAR10)) == 696 + stages + 477_184 + 10_250
    assert 696 + stages + 477_184 + 10_250 == 1_263_854
    # ×0.5 (48/96/192/1024): stages (2,400 + 3·1,512) + (8,256 + 7·5,328) + (30,336 + 3·19,872).
    half = (2_400 + 3 * 1_512) + (8_256 + 7 * 5_328) + (30_336 + 3 * 19_872)
    shuffle_half = build_model("shufflenetv2", CIFAR10, options={"width": 0.5})
    assert count_parameters(shuffle_half) == 696 + half + (192 * 1024 + 2 * 1024) + 10_250 == 352_042


def shufflenet_count(widths: tuple[int, int, int, int], classes: int = 10) -> int:
    """ShuffleNet V2 counted by hand from FedDF's shufflenetv2.py (BatchNorm: 2 per channel, no conv
    biases): stem conv3×3 3→24; per stage one down unit and 3, 7, 3 basic units; 1×1 conv; linear."""
    down = lambda c_in, m: 11 * c_in + 2 * c_in * m + m * m + 17 * m  # noqa: E731
    basic = lambda h: 2 * h * h + 15 * h  # noqa: E731
    *stages, last = widths
    total, c_in = 3 * 24 * 9 + 2 * 24, 24
    for width, repeats in zip(stages, (3, 7, 3), strict=True):
        total += down(c_in, width // 2) + repeats * basic(width // 2)
        c_in = width
    return total + c_in * last + 2 * last + last * classes + classes


def test_shufflenet_parameter_counts_at_feddfs_other_widths():
    # FedDF's configs: ×1.5 → 176/352/704/1024, ×2 → 224/488/976/2048.
    assert shufflenet_count((116, 232, 464, 1024)) == 1_263_854  # the helper agrees with the count above
    for width, widths, expected in (
        (1.5, (176, 352, 704, 1024), 2_488_874),
        (2, (224, 488, 976, 2048), 5_338_026),
    ):
        model = build_model("shufflenetv2", CIFAR10, options={"width": width})
        assert count_parameters(model) == shufflenet_count(widths) == expected
    cifar100 = make_info("cifar100", 3, 32, 100)
    assert count_parameters(build_model("shufflenetv2", cifar100)) == shufflenet_count(
        (116, 232, 464, 1024), 100
    )


def test_registry_defaults_and_options():
    assert model_options("vgg9") == ("conv_bias",)
    assert model_options("shufflenetv2") == ("width",)
    assert model_options("resnet8-binary") == ()
    norms = (nn.BatchNorm2d, nn.GroupNorm)
    assert not any(isinstance(m, norms) for m in build_model("vgg9", CIFAR10).modules())  # Table 3: no BN
    assert not any(
        m.bias is not None for m in build_model("vgg9", CIFAR10).extractor if isinstance(m, nn.Conv2d)
    )
    for norm, kind in (("batch", nn.BatchNorm2d), ("group", nn.GroupNorm)):
        model = build_model("vgg9", CIFAR10, norm=norm)
        assert sum(isinstance(m, kind) for m in model.modules()) == 6  # one after each conv


@pytest.mark.parametrize("name", ["resnet8-binary", "shufflenetv2"])
def test_group_norm_everywhere(name: str):
    model = build_model(name, MNIST, norm="group", group_norm_groups=2)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert any(isinstance(m, nn.GroupNorm) for m in model.modules())


def test_bad_options_are_refused():
    with pytest.raises(ConfigError, match=r"width must be one of 0\.5, 1, 1\.5, 2.*0\.75"):
        build_model("shufflenetv2", CIFAR10, options={"width": 0.75})
    with pytest.raises(ConfigError, match="width"):
        build_model("shufflenetv2", CIFAR10, options={"width": True})
    with pytest.raises(ConfigError, match="conv_bias must be true or false"):
        build_model("vgg9", CIFAR10, options={"conv_bias": "yes"})
    with pytest.raises(ConfigError, match="takes no options"):
        build_model("resnet8-binary", CIFAR10, options={"width": 2})
    # ShuffleNet's ×1 branches have 58 channels: 4 groups cannot split them
    with pytest.raises(ConfigError, match="58 channels"):
        build_model("shufflenetv2", CIFAR10, norm="group", group_norm_groups=4)


def test_shufflenet_layout():
    model = build_model("shufflenetv2", CIFAR10)
    stem = model.extractor.stem.conv
    assert (stem.out_channels, stem.stride) == (24, (1, 1))  # CIFAR stem: no stride, no max-pool
    stages = [model.extractor.stage1, model.extractor.stage2, model.extractor.stage3]
    assert [len(s) for s in stages] == [4, 8, 4]
    assert all(isinstance(s[0], DownUnit) and all(isinstance(u, BasicUnit) for u in s[1:]) for s in stages)
    assert model.feature_dim == 1024
    assert build_model("shufflenetv2", CIFAR10, options={"width": 2}).feature_dim == 2048
    x = torch.arange(4.0).view(1, 4, 1, 1)
    assert channel_shuffle(x).flatten().tolist() == [0.0, 2.0, 1.0, 3.0]


def test_sign_ste():
    x = torch.tensor([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0], requires_grad=True)
    out = sign_ste(x)
    assert out.tolist() == [-1, -1, -1, 1, 1, 1, 1]  # 0 ↦ +1: only ±1
    out.backward(torch.full_like(x, 3.0))
    assert x.grad.tolist() == [0, 3, 3, 3, 3, 3, 0]  # passed where |x| <= 1


def test_binary_resnet_binarizes_block_convs_only():
    model = build_model("resnet8-binary", CIFAR10)
    convs = binary_convs(model)
    assert len(convs) == 2 * 3 + 2  # two per block, and the shortcut convs of stages 2 and 3
    assert type(model.extractor.conv) is nn.Conv2d and type(model.classifier) is nn.Linear
    for conv in convs:
        w = conv.binary_weight().detach()
        alpha = conv.weight.detach().abs().mean(dim=(1, 2, 3), keepdim=True)
        assert torch.equal(w.abs(), alpha.expand_as(w))  # ±alpha per output filter
        assert torch.equal(torch.sign(w), torch.where(conv.weight >= 0, 1.0, -1.0))


def test_binary_forward_sees_only_signs_and_scales():
    torch.manual_seed(0)
    model = build_model("resnet8-binary", CIFAR10).eval()
    seen: list[tuple[BinaryConv2d, torch.Tensor, torch.Tensor]] = []
    for conv in binary_convs(model):
        conv.register_forward_hook(lambda m, args, out: seen.append((m, args[0], out)))
    with torch.no_grad():
        model(images(CIFAR10, 4))
    assert len(seen) == 8
    for conv, x, out in seen:  # every binary conv computed conv(±1 inputs, ±alpha weights)
        w = conv.binary_weight()
        alpha = conv.weight.abs().mean(dim=(1, 2, 3), keepdim=True)
        assert torch.equal(w.abs(), alpha.expand_as(w))
        ones = torch.where(x >= 0, 1.0, -1.0)
        assert torch.equal(out, F.conv2d(ones, w, None, conv.stride, conv.padding))
    conv = model.extractor.layer2[0].conv1
    a = torch.randn(2, conv.in_channels, 8, 8)
    b = a.sign() * torch.rand_like(a).add(0.5)  # same signs, other magnitudes: the same output
    assert torch.equal(conv(a), conv(b))


def test_binary_gradients_reach_latent_weights():
    torch.manual_seed(0)
    model = build_model("resnet8-binary", CIFAR10)
    F.cross_entropy(model(images(CIFAR10, 8)), torch.randint(10, (8,))).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    # through the estimator the input gradient is zero exactly where |input| > 1
    conv = model.extractor.layer1[0].conv1
    a = torch.linspace(-3, 3, 16 * 8 * 8).view(1, 16, 8, 8).requires_grad_()
    conv(a).sum().backward()
    assert torch.all(a.grad[a.detach().abs() > 1] == 0) and a.grad[a.detach().abs() <= 1].abs().sum() > 0


def test_binary_clients_and_full_precision_student_share_a_state_dict():
    torch.manual_seed(0)
    clients = [build_model("resnet8-binary", CIFAR10) for _ in range(2)]
    student = build_model("resnet8", CIFAR10)
    reference = student.state_dict()
    states = [c.state_dict() for c in clients]
    assert {k: v.shape for k, v in states[0].items()} == {k: v.shape for k, v in reference.items()}
    assert all(v.dtype == reference[k].dtype for k, v in states[0].items())
    # FedAvg of the binary clients' latent weights starts the student; its weights go back as latents
    average = {
        k: (states[0][k] + states[1][k]) / 2 if v.is_floating_point() else v for k, v in reference.items()
    }
    student.load_state_dict(average)
    x = images(CIFAR10, 8)
    teachers = [c.eval() for c in clients]
    with torch.no_grad():
        target = torch.stack([t(x) for t in teachers]).mean(0).softmax(1)
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-3)
    for _ in range(3):
        optimizer.zero_grad()
        F.kl_div(student(x).log_softmax(1), target, reduction="batchmean").backward()
        optimizer.step()
    clients[0].load_state_dict(student.state_dict())
    assert torch.isfinite(clients[0](x)).all()


@pytest.mark.parametrize("name", NAMES)
def test_trains_a_few_steps_without_nan(name: str):
    torch.manual_seed(0)
    model = build_model(name, CIFAR10)
    x, y = images(CIFAR10, 16), torch.randint(10, (16,))
    start = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(4):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # every parameter takes part in training: a nonzero gradient; nearly all of them move (a step below
    # float32's resolution may leave one as it was: a BatchNorm scale of ShuffleNetV2 on AVX2 kernels)
    assert all(p.grad is not None and bool(p.grad.any()) for p in model.parameters())
    moved = [not torch.equal(a, p) for a, p in zip(start, model.parameters(), strict=True)]
    assert sum(moved) >= 0.95 * len(moved)
