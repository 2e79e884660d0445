"""Model names → constructors. Every constructor takes ``(info, norm, groups)`` and returns a Classifier.

Models without norm layers (``mlp``, ``lenet5``) accept ``norm="batch"`` (the default, so that a
run-wide setting can stay at its default) and ``"none"``, and reject ``"group"``: an explicit request
for GroupNorm that the model cannot honour is an error, not something to ignore silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.models.base import Classifier, unknown_choice
from fedistill.models.lenet import lenet5, lenet_fedmdcg
from fedistill.models.mlp import mlp
from fedistill.models.norm import check_norm
from fedistill.models.resnet import resnet8, resnet8_wide, resnet20, resnet32
from fedistill.models.small_cnn import small_cnn

ModelFactory = Callable[[DatasetInfo, str, int], Classifier]


@dataclass(frozen=True)
class ModelSpec:
    factory: ModelFactory
    has_norm: bool = True


_MODELS: dict[str, ModelSpec] = {
    "resnet8": ModelSpec(resnet8),
    "resnet20": ModelSpec(resnet20),
    "resnet32": ModelSpec(resnet32),
    "resnet8-wide": ModelSpec(resnet8_wide),
    "lenet-fedmdcg": ModelSpec(lenet_fedmdcg),
    "lenet5": ModelSpec(lenet5, has_norm=False),
    "mlp": ModelSpec(mlp, has_norm=False),
    "small-cnn": ModelSpec(small_cnn),
}


def register_model(name: str, factory: ModelFactory, *, has_norm: bool = True) -> None:
    """Add a model under ``name``; ``factory(info, norm, groups)`` must return a Classifier."""
    if name in _MODELS:
        raise ValueError(f"model {name!r} is already registered")
    _MODELS[name] = ModelSpec(factory, has_norm)


def model_names() -> list[str]:
    """The registered model names, sorted."""
    return sorted(_MODELS)


def build_model(
    name: str, info: DatasetInfo, *, norm: str = "batch", group_norm_groups: int = 2
) -> Classifier:
    """Build model ``name`` for ``info``'s image shape and class count.

    ``norm`` is ``"batch"``, ``"group"`` (GroupNorm with ``group_norm_groups`` groups) or ``"none"``.
    """
    if name not in _MODELS:
        raise unknown_choice("model", name, model_names())
    check_norm(norm)
    spec = _MODELS[name]
    if not spec.has_norm and norm == "group":
        raise ConfigError(
            f"model {name!r} has no norm layers, so norm='group' cannot apply; use 'batch' or 'none'"
        )
    model = spec.factory(info, norm, group_norm_groups)
    if not isinstance(model, Classifier):
        raise TypeError(f"model {name!r} must build a Classifier, got {type(model).__name__}")
    return model
