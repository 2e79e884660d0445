"""A small stride-1 CNN for small images (8×8 digits, 28×28 MNIST-like): the model a user would pick there.

FedMD-CG's "Lenet" halves the resolution in every layer (8×8 digits reach a 1×1 map after the first
block) and tops out near 93% on pooled digits; this net keeps the resolution through two 3×3 convs
before pooling and reaches about 99% on pooled digits in 30 epochs (measured with SGD 0.05, seed 0).

conv3×3(w) → norm → ReLU → conv3×3(2w) → norm → ReLU → pool → conv3×3(2w) → norm → ReLU → pool →
flatten | fc(128) → ReLU → fc(classes). The extractor ends at the flatten; 8×8 images give 2w·2·2
features, 28×28 give 2w·7·7, 32×32 give 2w·8·8.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.models.base import Classifier, SizedFlatten, output_dim
from fedistill.models.norm import make_norm2d


class SmallCNN(Classifier):
    """A small stride-1 CNN for small images, `width` channels wide; the model to pick for digits and
    MNIST-like data."""

    def __init__(self, info: DatasetInfo, norm: str = "batch", groups: int = 2, *, width: int = 16):
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        channels = info.channels
        for i, (out, pool) in enumerate(((width, False), (2 * width, True), (2 * width, True)), start=1):
            layers[f"conv{i}"] = nn.Conv2d(channels, out, 3, padding=1)
            layers[f"norm{i}"] = make_norm2d(norm, out, groups=groups)
            layers[f"relu{i}"] = nn.ReLU()
            if pool:
                layers[f"pool{i}"] = nn.MaxPool2d(2)
            channels = out
        layers["flatten"] = flatten = SizedFlatten(info)
        extractor = nn.Sequential(layers)
        features = flatten.features = output_dim(extractor, info)
        classifier = nn.Sequential(
            OrderedDict(fc1=nn.Linear(features, 128), relu=nn.ReLU(), fc2=nn.Linear(128, info.num_classes))
        )
        super().__init__(extractor, classifier, feature_dim=features, num_classes=info.num_classes)


def small_cnn(info: DatasetInfo, norm: str = "batch", groups: int = 2) -> SmallCNN:
    """A stride-1 CNN for small images (8x8 digits, 28x28 MNIST-like): about 99% on pooled digits."""
    return SmallCNN(info, norm, groups)
