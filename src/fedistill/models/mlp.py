"""McMahan et al. (2017)'s "2NN": a multilayer perceptron with two hidden layers of 200 ReLU units."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.models.base import Classifier, SizedFlatten


class MLP(Classifier):
    """flatten → Linear(C·H·W, 200) → ReLU → Linear(200, 200) → ReLU | Linear(200, classes)."""

    def __init__(self, info: DatasetInfo, hidden: int = 200):
        pixels = info.channels * info.image_size * info.image_size
        extractor = nn.Sequential(
            OrderedDict(
                flatten=SizedFlatten(info, pixels),
                fc1=nn.Linear(pixels, hidden),
                relu1=nn.ReLU(),
                fc2=nn.Linear(hidden, hidden),
                relu2=nn.ReLU(),
            )
        )
        super().__init__(
            extractor, nn.Linear(hidden, info.num_classes), feature_dim=hidden, num_classes=info.num_classes
        )


def mlp(info: DatasetInfo, norm: str = "batch", groups: int = 2) -> MLP:
    """The 2NN; it has no norm layers, so ``norm`` and ``groups`` are unused."""
    return MLP(info)
