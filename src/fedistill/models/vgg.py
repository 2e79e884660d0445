"""VGG-9 (Wang et al. 2020, FedMA), the VGG that FedDF's Table 3 trains without normalisation.

FedDF's code builds it as ``moderate_cnn`` (not its ``vgg.py``, whose VGGs start at 11 layers): six
3×3 convs and three linear layers, no normalisation, conv biases off (``--w_conv_bias False``, the
code default; FedMA's own net has them: ``conv_bias=True``), default PyTorch init.

    extractor  conv(32) ReLU conv(64) ReLU max-pool
               conv(128) ReLU conv(128) ReLU max-pool Dropout2d(0.05)
               conv(256) ReLU conv(256) ReLU max-pool flatten
    classifier Dropout(0.1) fc(512) ReLU fc(512) ReLU Dropout(0.1) fc(classes)

The extractor ends at the flatten, as in the other conv nets here: 256·4·4 = 4096 features on 32×32,
256·3·3 on 28×28, 256 on 8×8. ``norm="batch"`` or ``"group"`` puts a norm layer after every conv.

Parameters for 3×32×32 inputs and 10 classes, without conv biases:
convs 3·32·9 + 32·64·9 + 64·128·9 + 128·128·9 + 128·256·9 + 256·256·9
      = 864 + 18,432 + 73,728 + 147,456 + 294,912 + 589,824 = 1,125,216;
fcs   (4096·512 + 512) + (512·512 + 512) + (512·10 + 10) = 2,097,664 + 262,656 + 5,130 = 2,365,450;
total 3,490,666 (3,491,530 with the 864 conv biases of FedMA's net).
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.models.base import Classifier, SizedFlatten, output_dim
from fedistill.models.norm import make_norm2d

# (output channels, max-pool after it, Dropout2d p after the pool)
VGG9_CONVS: tuple[tuple[int, bool, float], ...] = (
    (32, False, 0.0),
    (64, True, 0.0),
    (128, False, 0.0),
    (128, True, 0.05),
    (256, False, 0.0),
    (256, True, 0.0),
)


class VGG9(Classifier):
    """VGG-9 as FedMA and FedDF train it: six 3×3 convs and three linear layers, no normalisation by
    default."""

    def __init__(self, info: DatasetInfo, norm: str = "none", groups: int = 2, *, conv_bias: bool = False):
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        channels = info.channels
        for i, (out, pool, drop) in enumerate(VGG9_CONVS, start=1):
            layers[f"conv{i}"] = nn.Conv2d(channels, out, 3, padding=1, bias=conv_bias)
            layers[f"norm{i}"] = make_norm2d(norm, out, groups=groups)
            layers[f"relu{i}"] = nn.ReLU()
            if pool:
                layers[f"pool{i}"] = nn.MaxPool2d(2)
            if drop:
                layers[f"drop{i}"] = nn.Dropout2d(drop)
            channels = out
        layers["flatten"] = flatten = SizedFlatten(info)
        extractor = nn.Sequential(layers)
        features = flatten.features = output_dim(extractor, info)
        classifier = nn.Sequential(
            OrderedDict(
                drop1=nn.Dropout(0.1),
                fc1=nn.Linear(features, 512),
                relu1=nn.ReLU(),
                fc2=nn.Linear(512, 512),
                relu2=nn.ReLU(),
                drop2=nn.Dropout(0.1),
                fc3=nn.Linear(512, info.num_classes),
            )
        )
        super().__init__(extractor, classifier, feature_dim=features, num_classes=info.num_classes)


def vgg9(info: DatasetInfo, norm: str = "none", groups: int = 2, *, conv_bias: bool = False) -> VGG9:
    """FedDF's VGG-9: 3,490,666 parameters for 3×32×32 inputs and 10 classes (see the module docstring)."""
    if not isinstance(conv_bias, bool):
        raise ConfigError(f"vgg9 option conv_bias must be true or false, got {conv_bias!r}")
    return VGG9(info, norm, groups, conv_bias=conv_bias)
