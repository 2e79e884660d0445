"""Small convolutional nets for digits, letters and CIFAR.

``lenet-fedmdcg`` reproduces the "Lenet" of FedMD-CG's code, which is not LeNet-5: two stride-2
conv3×3 → norm → ReLU → max-pool blocks, then a linear–linear head. ``lenet5`` is the canonical
LeNet-5 (LeCun et al. 1998) with ReLU and max-pooling.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.models.base import Classifier, SizedFlatten, output_dim
from fedistill.models.norm import make_norm2d


def fedmdcg_widths(name: str) -> tuple[int, int, int]:
    """(conv1 channels, conv2 channels, fc1 width) of FedMD-CG's per-dataset configs."""
    name = name.lower()
    if name in ("mnist", "digits"):
        return 6, 16, 32
    if name == "fashion-mnist":
        return 16, 32, 64
    return 16, 32, 128  # EMNIST, CIFAR-10 and anything else


class LeNetFedMDCG(Classifier):
    """FedMD-CG's local model: extractor = the conv part up to the flatten (the latent feature h that
    its generator imitates), classifier = fc1 → fc2 with no non-linearity in between.

    Pooling uses ``ceil_mode=True`` so that 8×8 inputs still work (8→4→2→1→1); on 28×28 and 32×32
    it gives the released code's 2×2 maps (28→14→7→4→2, 32→16→8→4→2).
    """

    def __init__(
        self,
        info: DatasetInfo,
        norm: str = "batch",
        groups: int = 2,
        *,
        activation: str = "relu",
        pool: bool = True,
    ):
        """`activation` ("relu" or "sigmoid") and `pool` give the variants gradient-inversion attacks
        are studied on (DLG's Sigmoid LeNet without pooling); neither changes the parameter names, but
        `pool=False` widens fc1 to the unpooled feature maps."""
        activations = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid}
        if activation not in activations:
            raise ValueError(f"activation must be one of {sorted(activations)}, got {activation!r}")
        c1, c2, hidden = fedmdcg_widths(info.name)
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        in_channels = info.channels
        for i, width in enumerate((c1, c2), start=1):
            layers[f"conv{i}"] = nn.Conv2d(in_channels, width, 3, stride=2, padding=1)
            layers[f"norm{i}"] = make_norm2d(norm, width, groups=groups)
            layers[f"{activation}{i}"] = activations[activation]()
            if pool:
                layers[f"pool{i}"] = nn.MaxPool2d(2, ceil_mode=True)
            in_channels = width
        layers["flatten"] = flatten = SizedFlatten(info)
        extractor = nn.Sequential(layers)
        feature_dim = flatten.features = output_dim(extractor, info)
        classifier = nn.Sequential(
            OrderedDict(fc1=nn.Linear(feature_dim, hidden), fc2=nn.Linear(hidden, info.num_classes))
        )
        super().__init__(extractor, classifier, feature_dim=feature_dim, num_classes=info.num_classes)


class LeNet5(Classifier):
    """conv5×5(6) → ReLU → pool → conv5×5(16) → ReLU → pool → fc120 → ReLU → fc84 → ReLU | fc(classes).

    The extractor ends at the 84-d layer; like the original, there is no normalisation layer.

    LeNet-5's geometry is for 32×32 inputs (400 = 16·5·5 flattened features). A conv whose input is
    smaller than that geometry expects is zero-padded by 2 ("same" padding): 28×28 gets conv1 padding
    2, exactly the classic MNIST LeNet-5 on 32×32-padded digits, while 32×32 is unpadded; an 8×8
    image gets both convs padded (8→8→4→4→2, 64 flattened features). Larger images flatten to more.
    """

    def __init__(self, info: DatasetInfo):
        pad1 = 2 if info.image_size < 32 else 0
        pooled = (info.image_size + 2 * pad1 - 4) // 2  # side of the map after conv1 and pool1
        pad2 = 2 if pooled < 10 else 0
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        layers["conv1"] = nn.Conv2d(info.channels, 6, 5, padding=pad1)
        layers["relu1"] = nn.ReLU()
        layers["pool1"] = nn.MaxPool2d(2)
        layers["conv2"] = nn.Conv2d(6, 16, 5, padding=pad2)
        layers["relu2"] = nn.ReLU()
        layers["pool2"] = nn.MaxPool2d(2)
        layers["flatten"] = flatten = SizedFlatten(info)
        flat = flatten.features = output_dim(nn.Sequential(layers), info)
        layers["fc1"] = nn.Linear(flat, 120)
        layers["relu3"] = nn.ReLU()
        layers["fc2"] = nn.Linear(120, 84)
        layers["relu4"] = nn.ReLU()
        super().__init__(
            nn.Sequential(layers),
            nn.Linear(84, info.num_classes),
            feature_dim=84,
            num_classes=info.num_classes,
        )


def lenet_fedmdcg(info: DatasetInfo, norm: str = "batch", groups: int = 2) -> LeNetFedMDCG:
    """FedMD-CG's "Lenet"; widths picked by ``info.name`` (MNIST/digits, Fashion-MNIST, the rest)."""
    return LeNetFedMDCG(info, norm, groups)


def lenet5(info: DatasetInfo, norm: str = "batch", groups: int = 2) -> LeNet5:
    """Canonical LeNet-5 with ReLU; it has no norm layers, so ``norm`` and ``groups`` are unused."""
    return LeNet5(info)
