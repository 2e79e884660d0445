"""The shape every model in the registry shares: a feature extractor followed by a classifier head.

Decoupling methods (FedPer, LG-FedAvg, FedMD-CG) exchange only one of the two parts, so the split must
be visible in the parameter names: every ``state_dict`` key starts with ``extractor.`` or
``classifier.``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError, unknown_name

EXTRACTOR_PREFIX = "extractor."
CLASSIFIER_PREFIX = "classifier."


class Classifier(nn.Module):
    """``forward(x) = classifier(extractor(x))``.

    ``extractor`` maps an image batch (B, C, H, W) to flat features (B, feature_dim); ``classifier``
    maps features to logits (B, num_classes).
    """

    def __init__(self, extractor: nn.Module, classifier: nn.Module, *, feature_dim: int, num_classes: int):
        super().__init__()
        self.extractor = extractor
        self.classifier = classifier
        self.feature_dim = int(feature_dim)
        self.num_classes = int(num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.extractor(x))


class SizedFlatten(nn.Flatten):
    """nn.Flatten(1) in a model whose next Linear has a fixed width, set by the image size it was built
    for: a batch of other-sized images is refused here, naming that size, instead of failing in the
    Linear with torch's "mat1 and mat2 shapes cannot be multiplied", which names no image size.

    ``features`` stays None (no check) until the model's constructor knows the width (`output_dim`)."""

    def __init__(self, info: DatasetInfo, features: int | None = None):
        super().__init__(1)
        self.image_shape = f"{info.channels}×{info.image_size}×{info.image_size}"
        self.features = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.features is not None and out.shape[1] != self.features:
            raise ValueError(
                f"this model was built for images of {self.image_shape} (they flatten to {self.features} "
                f"features here): got a batch of shape {tuple(x.shape)} at this point, which flattens to "
                f"{out.shape[1]}; resize the images to {self.image_shape} or build the model for their size"
            )
        return out


def count_parameters(model: nn.Module) -> int:
    """Number of parameters (trainable or not); buffers such as BatchNorm running stats are excluded."""
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def output_dim(module: nn.Module, info: DatasetInfo) -> int:
    """Flat output size of ``module`` on one image of ``info``'s shape.

    Runs in eval mode so that BatchNorm running statistics are left untouched (and a 1×1 map with a
    batch of one is allowed); the module's training flag is restored afterwards. Images its pooling
    shrinks to nothing are a ConfigError naming the size, not torch's shape error from deep inside.
    """
    was_training = module.training
    module.eval()
    try:
        out = module(torch.zeros(1, info.channels, info.image_size, info.image_size))
    except RuntimeError as exc:
        raise ConfigError(
            f"images of {info.channels}×{info.image_size}×{info.image_size} (dataset {info.name!r}) are "
            f"too small for this model: its layers shrink them to nothing ({str(exc).splitlines()[0]}); "
            "use larger images or another model"
        ) from exc
    finally:
        module.train(was_training)
    return int(out[0].numel())


def unknown_choice(kind: str, value: object, valid: Iterable[str]) -> ConfigError:
    """A ConfigError naming the valid choices and, when one is close, the likely intended one."""
    return unknown_name(kind, value, list(valid), ConfigError)  # type: ignore[return-value]
