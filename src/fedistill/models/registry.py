"""Model names → constructors, and the tasks each model serves.

Every constructor takes ``(info, norm, groups, **options)``. Classifiers (task ``classification``)
return a Classifier; segmentation nets (``semantic-segmentation``, ``instance-segmentation``) map images
(B, channels, H, W) to per-pixel logits (B, num_classes, H, W); reconstruction nets (``reconstruction``)
map them to images (B, channels, H, W); text classifiers (``text-classification``) map token ids (B, L) to
logits (B, num_classes). ``build_model`` refuses a model for a dataset whose task it
does not serve.

Each model offers a set of norms and has a default one, used when ``norm`` is not given: BatchNorm for
the classifiers and the segmentation U-Nets, none for ``vgg9`` (FedDF's Table 3 trains it without
normalisation), InstanceNorm for fastMRI's U-Net. Models without norm layers (``mlp``, ``lenet5``) accept
``norm="batch"`` (the default, so that a run-wide setting can stay at its default) and ``"none"``, and
reject ``"group"``: an explicit request for GroupNorm that the model cannot honour is an error, not
something to ignore silently. ``distilbert`` has its own LayerNorms and refuses any other norm.

Per-model options are the constructor's keyword-only parameters (``options={"width": 32}``); any other
name is refused, and the constructor checks the values.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.models.base import Classifier, unknown_choice
from fedistill.models.binary import resnet8_binary
from fedistill.models.distilbert import distilbert
from fedistill.models.fastmri_unet import unet_fastmri
from fedistill.models.inversion_lenets import lenet_fedmdcg_dlg, lenet_fedmdcg_sigmoid
from fedistill.models.lenet import lenet5, lenet_fedmdcg
from fedistill.models.mlp import mlp
from fedistill.models.norm import DENSE_NORMS, NORMS, check_norm
from fedistill.models.resnet import resnet8, resnet8_wide, resnet20, resnet32
from fedistill.models.shufflenet import shufflenetv2
from fedistill.models.small_cnn import small_cnn
from fedistill.models.unet import unet, unet_chang
from fedistill.models.vgg import vgg9

CLASSIFICATION = ("classification",)
SEGMENTATION = ("semantic-segmentation", "instance-segmentation")
RECONSTRUCTION = ("reconstruction",)
TEXT = ("text-classification",)

ModelFactory = Callable[..., nn.Module]


@dataclass(frozen=True)
class ModelSpec:
    """A registered model: its factory, whether it has normalisation layers, and the tasks and norms it
    supports."""

    factory: ModelFactory
    has_norm: bool = True
    tasks: tuple[str, ...] = CLASSIFICATION
    norms: tuple[str, ...] = NORMS
    default_norm: str = "batch"

    @property
    def options(self) -> tuple[str, ...]:
        """The factory's keyword-only parameters: the options a user may set."""
        params = inspect.signature(self.factory).parameters.values()
        return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


_MODELS: dict[str, ModelSpec] = {
    "resnet8": ModelSpec(resnet8),
    "resnet20": ModelSpec(resnet20),
    "resnet32": ModelSpec(resnet32),
    "resnet8-wide": ModelSpec(resnet8_wide),
    "resnet8-binary": ModelSpec(resnet8_binary),
    "shufflenetv2": ModelSpec(shufflenetv2),
    "vgg9": ModelSpec(vgg9, default_norm="none"),
    "lenet-fedmdcg": ModelSpec(lenet_fedmdcg),
    "lenet-fedmdcg-sigmoid": ModelSpec(lenet_fedmdcg_sigmoid),  # for gradient-inversion studies
    "lenet-fedmdcg-dlg": ModelSpec(lenet_fedmdcg_dlg),
    "lenet5": ModelSpec(lenet5, has_norm=False),
    "mlp": ModelSpec(mlp, has_norm=False),
    "small-cnn": ModelSpec(small_cnn),
    "unet": ModelSpec(unet, tasks=SEGMENTATION, norms=DENSE_NORMS),
    "unet-chang": ModelSpec(unet_chang, tasks=SEGMENTATION, norms=DENSE_NORMS),
    "unet-fastmri": ModelSpec(unet_fastmri, tasks=RECONSTRUCTION, norms=DENSE_NORMS, default_norm="instance"),
    # LayerNorm is part of the transformer, not a choice
    "distilbert": ModelSpec(distilbert, tasks=TEXT, norms=("layer",), default_norm="layer"),
}


def register_model(
    name: str,
    factory: ModelFactory,
    *,
    has_norm: bool = True,
    tasks: tuple[str, ...] = CLASSIFICATION,
    norms: tuple[str, ...] = NORMS,
    default_norm: str = "batch",
) -> None:
    """Add a model under ``name``; ``factory(info, norm, groups, **options)`` must return a Classifier
    for classification, and a module of the output shape the registry describes for the other tasks."""
    if name in _MODELS:
        raise ValueError(f"model {name!r} is already registered")
    if default_norm not in norms:
        raise ValueError(f"default norm {default_norm!r} of model {name!r} is not among its norms {norms}")
    _MODELS[name] = ModelSpec(factory, has_norm, tuple(tasks), tuple(norms), default_norm)


def model_names(task: str | None = None) -> list[str]:
    """The registered model names, sorted; only those serving ``task`` when it is given."""
    return sorted(name for name, spec in _MODELS.items() if task is None or task in spec.tasks)


def model_options(name: str) -> tuple[str, ...]:
    """The options model ``name`` accepts in ``build_model(..., options=...)``."""
    if name not in _MODELS:
        raise unknown_choice("model", name, model_names())
    return _MODELS[name].options


def resolved_norm(name: str, norm: str | None) -> str:
    """The normalisation `build_model(name, norm=...)` uses: `norm`, or the model's default for None or
    "auto" (what a file records, so that a reader need not know each model's default)."""
    if name not in _MODELS:
        raise unknown_choice("model", name, model_names())
    return _MODELS[name].default_norm if norm in (None, "auto") else norm


def builds_batchnorm(name: str, norm: str | None) -> bool:
    """Whether `build_model(name, norm=...)` gives BatchNorm layers (their running statistics are state a
    model carries beside its weights): for checks a run's setup makes before anything is built."""
    return name in _MODELS and _MODELS[name].has_norm and resolved_norm(name, norm) == "batch"


def build_model(
    name: str,
    info: DatasetInfo,
    *,
    norm: str | None = None,
    group_norm_groups: int = 2,
    options: Mapping[str, object] | None = None,
) -> nn.Module:
    """Build model ``name`` for ``info``'s task, image shape and class count.

    ``norm`` is ``"batch"``, ``"group"`` (GroupNorm with ``group_norm_groups`` groups), ``"none"`` or, for
    the dense-prediction nets, ``"instance"``; None or ``"auto"`` (the config's value for it) means the
    model's default. ``options`` sets the model's own options (``model_options(name)``).
    """
    if name not in _MODELS:
        raise unknown_choice("model", name, model_names())
    spec = _MODELS[name]
    _check_task(name, spec, info)
    norm = resolved_norm(name, norm)
    _check_norm(name, spec, norm)
    kwargs = _check_options(name, spec, options)
    model = spec.factory(info, norm, group_norm_groups, **kwargs)
    if info.task in CLASSIFICATION and not isinstance(model, Classifier):
        raise TypeError(f"model {name!r} must build a Classifier, got {type(model).__name__}")
    return model


def _check_task(name: str, spec: ModelSpec, info: DatasetInfo) -> None:
    if info.task in spec.tasks:
        return
    serving = model_names(info.task)
    which = f"models for it: {', '.join(serving)}" if serving else "no registered model serves it"
    raise ConfigError(
        f"model {name!r} serves {', '.join(spec.tasks)}, not the {info.task!r} task of dataset "
        f"{info.name!r}; {which}"
    )


def check_model_norm(name: str, norm: str | None) -> None:
    """ConfigError unless model `name` offers `norm` (None or "auto": its default), as `build_model` checks:
    for a run's setup, to refuse it before anything is written."""
    if name in _MODELS and norm not in (None, "auto"):
        _check_norm(name, _MODELS[name], norm)


def check_model_options(name: str, options: Mapping[str, object] | None) -> None:
    """ConfigError unless model `name` takes every key of `options` (`[model_options]`), as `build_model`
    checks: for a run's setup, to refuse it before anything is written."""
    if name in _MODELS:
        _check_options(name, _MODELS[name], options)


def _check_norm(name: str, spec: ModelSpec, norm: str) -> None:
    if spec.norms == ("layer",) and norm != "layer":  # a transformer: its LayerNorms are the architecture
        raise ConfigError(
            f"model {name!r} has its own layer norm (LayerNorm in every transformer block), so norm = "
            f"{norm!r} cannot apply; leave norm at 'auto'"
        )
    if norm not in DENSE_NORMS:
        check_norm(norm, spec.norms)  # an unknown name: the error lists the model's norms
    if norm not in spec.norms:
        raise ConfigError(f"model {name!r} offers norm {', '.join(spec.norms)}, not {norm!r}")
    if not spec.has_norm and norm == "group":
        raise ConfigError(
            f"model {name!r} has no norm layers, so norm='group' cannot apply; use 'batch' or 'none'"
        )


def _check_options(name: str, spec: ModelSpec, options: Mapping[str, object] | None) -> dict[str, object]:
    options = dict(options or {})
    valid = spec.options
    for key in options:
        if key not in valid:
            if not valid:
                raise ConfigError(f"model {name!r} takes no options, got {key!r}")
            raise unknown_choice(f"option of model {name!r}", key, valid)
    return options
