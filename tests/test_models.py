"""Models: shapes, the extractor/classifier split, parameter counts, norm options, init, gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.models import Classifier, build_model, count_parameters, model_names
from fedistill.models.norm import make_norm2d


def make_info(name: str, channels: int, size: int, classes: int) -> DatasetInfo:
    return DatasetInfo(name, channels, size, classes, (0.5,) * channels, (0.25,) * channels)


DIGITS = make_info("digits", 1, 8, 10)
MNIST = make_info("mnist", 1, 28, 10)
FMNIST = make_info("fashion-mnist", 1, 28, 10)
CIFAR10 = make_info("cifar10", 3, 32, 10)
CIFAR100 = make_info("cifar100", 3, 32, 100)
INFOS = [DIGITS, MNIST, CIFAR10, CIFAR100]

WIDE = "resnet8-wide"  # 4.9M parameters: built once, in the fixture below
SMALL = [name for name in model_names("classification") if name != WIDE]
NORMED = ["resnet8", "resnet20", "resnet32", "lenet-fedmdcg", "small-cnn"]
UNNORMED = ["lenet5", "mlp"]


@pytest.fixture(scope="module")
def wide() -> Classifier:
    torch.manual_seed(0)
    return build_model(WIDE, CIFAR10)


def batch(info: DatasetInfo, n: int = 4) -> torch.Tensor:
    return torch.randn(n, info.channels, info.image_size, info.image_size)


def check_shapes(model: Classifier, info: DatasetInfo) -> None:
    x = batch(info, 3)
    assert model.extractor(x).shape == (3, model.feature_dim)
    assert model(x).shape == (3, info.num_classes)
    assert model.num_classes == info.num_classes


def test_registry_lists_every_model():
    assert model_names("classification") == sorted(
        [
            "lenet-fedmdcg",
            "lenet-fedmdcg-dlg",
            "lenet-fedmdcg-sigmoid",
            "lenet5",
            "mlp",
            "resnet20",
            "resnet32",
            "resnet8",
            "resnet8-binary",
            "resnet8-wide",
            "shufflenetv2",
            "small-cnn",
            "vgg9",
        ]
    )
    dense = ["unet", "unet-chang", "unet-fastmri"]
    assert model_names() == sorted([*model_names("classification"), *dense, "distilbert"])


@pytest.mark.parametrize("info", INFOS, ids=lambda i: f"{i.name}-{i.image_size}")
@pytest.mark.parametrize("name", SMALL)
def test_shapes_and_split(name: str, info: DatasetInfo):
    model = build_model(name, info)
    assert isinstance(model, Classifier)
    check_shapes(model, info)
    keys = model.state_dict().keys()
    assert all(k.startswith(("extractor.", "classifier.")) for k in keys)
    assert any(k.startswith("classifier.") for k in keys)


@pytest.mark.parametrize("size", [8, 28, 32])
def test_wide_resnet_shapes_any_size(wide: Classifier, size: int):
    info = make_info("cifar10", 3, size, 10)
    assert wide.feature_dim == 2048
    check_shapes(wide, info)
    assert all(k.startswith(("extractor.", "classifier.")) for k in wide.state_dict())


def test_resnet8_parameter_count_matches_feddf():
    n10 = count_parameters(build_model("resnet8", CIFAR10))
    assert n10 == 78_042
    assert abs(n10 - 78_000) / 78_000 < 0.01
    assert count_parameters(build_model("resnet8", CIFAR100)) == 83_892


def test_wide_resnet_parameter_count(wide: Classifier):
    # FedIOD's released resnet8_t has 4,932,344 with its unused linear2 (20,490) and emb (100).
    assert count_parameters(wide) == 4_911_754


def test_other_parameter_counts():
    assert count_parameters(build_model("resnet20", CIFAR10)) == 272_474
    assert count_parameters(build_model("resnet32", CIFAR10)) == 466_906
    assert count_parameters(build_model("mlp", MNIST)) == 199_210  # McMahan et al.'s 2NN
    assert count_parameters(build_model("lenet5", MNIST)) == 61_706
    assert count_parameters(build_model("lenet5", CIFAR10)) == 62_006


def test_cifar100_parameter_counts_match_the_reference_codes():
    """CIFAR-100 changes only the head: + 90 · (features + 1) over CIFAR-10."""
    # FedDF's notes: ResNet-8 ≈ 84 k for C = 100.
    assert count_parameters(build_model("resnet20", CIFAR100)) == 272_474 + 90 * 65 == 278_324
    assert count_parameters(build_model("resnet32", CIFAR100)) == 466_906 + 90 * 65 == 472_756
    # FedIOD's released resnet8_t: ≈ 5.31 M for C = 100 with its unused linear2 (2048·100 + 100) and
    # emb (100·100), which this model leaves out.
    with torch.device("meta"):
        wide100 = build_model(WIDE, CIFAR100)
    assert count_parameters(wide100) == 4_911_754 + 90 * 2_049 == 5_096_164
    assert count_parameters(wide100) + 204_900 + 10_000 == 5_311_064


@pytest.mark.parametrize(
    ("info", "h"),
    [(MNIST, 64), (FMNIST, 128), (CIFAR10, 128), (make_info("emnist-digits", 1, 28, 10), 128), (DIGITS, 16)],
    ids=lambda v: v.name if isinstance(v, DatasetInfo) else str(v),
)
def test_lenet_fedmdcg_latent_matches_released_configs(info: DatasetInfo, h: int):
    model = build_model("lenet-fedmdcg", info)
    assert model.feature_dim == h
    fc1, fc2 = model.classifier
    expected_fc1 = {"mnist": 32, "digits": 32, "fashion-mnist": 64}.get(info.name, 128)
    assert (fc1.in_features, fc1.out_features, fc2.out_features) == (h, expected_fc1, info.num_classes)
    # fc1 → fc2 with no non-linearity in between
    assert all(isinstance(m, nn.Linear) for m in model.classifier)


def test_lenet_fedmdcg_and_its_generator_parameter_counts():
    """FedMD-CG's released configs, counted by hand (conv3×3 with bias, BatchNorm 2 per channel):
    MNIST    conv 1→6 60 + 12, conv 6→16 880 + 32, fc 64→32 2,080, fc 32→10 330: 3,394;
    FMNIST   conv 1→16 160 + 32, conv 16→32 4,640 + 64, fc 128→64 8,256, fc 64→10 650: 13,802;
    CIFAR-10 conv 3→16 448 + 32, 4,640 + 64, fc 128→128 16,512, fc 128→10 1,290: 22,986.
    Its generator, input noise + one-hot, Linear → BatchNorm1d → ReLU per hidden width, Linear out:
    MNIST    (64 + 10)→512 38,400 + 1,024, 512→128 65,664 + 256, 128→64 8,256: 113,600;
    FMNIST   (128 + 10)→512 71,168 + 1,024, 512→256 131,328 + 512, 256→128 32,896: 236,928."""
    from fedistill.models.feature_generator import feature_generator_for

    # EMNIST (digits split, FedMD-CG's config): CIFAR-10's widths on one channel, 432 fewer conv weights.
    emnist = make_info("emnist-digits", 1, 28, 10)
    counts = {
        MNIST: (3_394, 113_600),
        FMNIST: (13_802, 236_928),
        CIFAR10: (22_986, 236_928),
        emnist: (22_986 - 2 * 16 * 9, 236_928),
    }
    for info, (model_count, generator_count) in counts.items():
        model = build_model("lenet-fedmdcg", info)
        assert count_parameters(model) == model_count, info.name
        assert count_parameters(feature_generator_for(model, info)) == generator_count, info.name
        # Sigmoid in place of ReLU: the same weights
        assert count_parameters(build_model("lenet-fedmdcg-sigmoid", info)) == model_count, info.name
    # Without the max-pools fc1 reads larger maps: MNIST 28→14→7 gives 16·7·7 = 784 features, so fc1 is
    # 784→32 (25,120) where lenet-fedmdcg's is 64→32 (2,080); the convs and fc2 are the same.
    assert (
        count_parameters(build_model("lenet-fedmdcg-dlg", MNIST, norm="none")) == 3_394 - 2_080 + 25_120 - 44
    )


def test_lenet5_has_classic_geometry():
    for info in (MNIST, CIFAR10):
        assert build_model("lenet5", info).extractor.fc1.in_features == 16 * 5 * 5
    assert build_model("lenet5", DIGITS).extractor.fc1.in_features == 16 * 2 * 2


def norm_types(model: nn.Module) -> list[type]:
    kinds = (nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm)
    return [type(m) for m in model.modules() if isinstance(m, kinds)]


@pytest.mark.parametrize("name", NORMED)
def test_group_norm_replaces_every_batch_norm(name: str):
    n_batch = len(norm_types(build_model(name, MNIST)))
    assert n_batch > 0
    grouped = build_model(name, MNIST, norm="group", group_norm_groups=2)
    assert norm_types(grouped) == [nn.GroupNorm] * n_batch
    assert all(m.num_groups == 2 for m in grouped.modules() if isinstance(m, nn.GroupNorm))
    plain = build_model(name, MNIST, norm="none")
    assert norm_types(plain) == []
    check_shapes(plain, MNIST)


def test_group_norm_on_wide_resnet():
    model = build_model(WIDE, make_info("cifar10", 3, 8, 10), norm="group", group_norm_groups=4)
    assert set(norm_types(model)) == {nn.GroupNorm}


@pytest.mark.parametrize("name", UNNORMED)
def test_models_without_norm_layers(name: str):
    for norm in ("batch", "none"):
        assert norm_types(build_model(name, MNIST, norm=norm)) == []
    with pytest.raises(ConfigError, match="no norm layers"):
        build_model(name, MNIST, norm="group")


def test_group_count_must_divide_channels():
    with pytest.raises(ConfigError, match="6 channels"):
        build_model("lenet-fedmdcg", MNIST, norm="group", group_norm_groups=4)


@pytest.mark.parametrize("groups", [0, -2, 2.0, True])
def test_group_count_must_be_a_positive_integer(groups: object):
    """A float or bool count used to build and then fail at the first forward inside torch."""
    with pytest.raises(ConfigError, match=rf"group_norm_groups must be a positive integer, got {groups!r}"):
        build_model("resnet8", CIFAR10, norm="group", group_norm_groups=groups)  # type: ignore[arg-type]


def test_make_norm2d():
    assert isinstance(make_norm2d("batch", 8, groups=2), nn.BatchNorm2d)
    assert make_norm2d("group", 8, groups=4).num_groups == 4
    assert isinstance(make_norm2d("none", 8, groups=2), nn.Identity)
    with pytest.raises(ConfigError, match="did you mean 'group'"):
        make_norm2d("groups", 8, groups=2)


@pytest.mark.parametrize("name", SMALL)
def test_init_is_deterministic_under_seed(name: str):
    def build(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return build_model(name, CIFAR10).state_dict()

    a, b, c = build(0), build(0), build(1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_build_leaves_batch_norm_statistics_untouched():
    model = build_model("lenet-fedmdcg", MNIST)
    assert model.training
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert int(m.num_batches_tracked) == 0
            assert torch.equal(m.running_mean, torch.zeros_like(m.running_mean))


def test_resnet8_uses_feddf_init():
    model = build_model("resnet8", CIFAR10)
    conv = model.extractor.layer3[0].conv2  # 3×3, 64 output channels
    assert abs(conv.weight.std().item() - (2 / (9 * 64)) ** 0.5) < 0.005
    norm = model.extractor.layer3[0].norm2
    assert torch.equal(norm.weight, torch.ones(64)) and torch.equal(norm.bias, torch.zeros(64))


def check_gradients(model: Classifier, info: DatasetInfo) -> None:
    model.train()
    model.zero_grad()
    F.cross_entropy(model(batch(info)), torch.randint(info.num_classes, (4,))).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("name", SMALL)
def test_gradient_reaches_every_parameter(name: str):
    torch.manual_seed(0)
    check_gradients(build_model(name, CIFAR10), CIFAR10)


def test_gradient_reaches_every_wide_parameter(wide: Classifier):
    torch.manual_seed(0)
    check_gradients(wide, make_info("cifar10", 3, 8, 10))


def test_unknown_model_name():
    with pytest.raises(ConfigError, match=r"unknown model 'resnet9'; did you mean 'resnet8'.*resnet8-wide"):
        build_model("resnet9", CIFAR10)


def test_unknown_norm():
    with pytest.raises(ConfigError, match="did you mean 'batch'"):
        build_model("resnet8", CIFAR10, norm="batchnorm")
    with pytest.raises(ConfigError, match="valid: batch, group, none"):
        build_model("mlp", CIFAR10, norm="layer")


def test_local_training_draws_dropout_from_its_own_stream_not_from_whatever_ran_before():
    """Dropout takes torch's global RNG: two trainings of a dropout model from the same weights and
    generator, after different global draws, ended apart (vgg9 runs did not repeat, nor resume exactly)."""
    from torch import nn

    from fedistill.algorithms.shared.training import LocalTraining, train_local
    from fedistill.config import RunConfig, build_config
    from fedistill.engine.setup import prepare_data
    from fedistill.seeding import torch_generator

    config = build_config(RunConfig(), {"dataset": "digits", "clients": 2, "local_steps": 4}, {})
    data = prepare_data(config).dataset
    spec = LocalTraining.from_config(config, data.info)

    def trained(global_seed: int) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 10))
        torch.manual_seed(global_seed)
        before = torch.random.get_rng_state()
        train_local(model, data.train, data.info, spec, torch_generator(0, "local-training", 0, 1))
        assert torch.equal(torch.random.get_rng_state(), before)  # the global stream is left as it was
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(trained(1), trained(2), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("name", "size"), [("vgg9", 4), ("lenet5", 1), ("small-cnn", 1)])
def test_images_too_small_for_a_model_are_a_config_error_naming_the_size(name: str, size: int):
    with pytest.raises(ConfigError, match=rf"images of 3×{size}×{size} \(dataset 'tiny'\) are too small"):
        build_model(name, make_info("tiny", 3, size, 10))


@pytest.mark.parametrize("name", ["vgg9", "lenet5", "small-cnn", "lenet-fedmdcg", "mlp"])
def test_images_of_another_size_than_a_model_was_built_for_are_refused_naming_its_size(name: str):
    """These models flatten into a Linear of fixed width; a batch of other-sized images used to fail
    deep inside with torch's 'mat1 and mat2 shapes cannot be multiplied', naming no image size."""
    model = build_model(name, CIFAR10).eval()
    wrong = torch.zeros(2, 3, 40, 40)
    with pytest.raises(ValueError, match=r"built for images of 3×32×32 .*: got a batch of shape \(2, "):
        model(wrong)
    with pytest.raises(ValueError, match=r"built for images of 3×32×32"):
        model.extractor(wrong)  # the extractor alone, as decoupling methods call it, checks too
    assert model(batch(CIFAR10, 2)).shape == (2, 10)  # the size it was built for still works
