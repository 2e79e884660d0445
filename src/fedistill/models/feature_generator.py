"""The conditional feature generator G(y, ε) of FedMD-CG, also the shape FedGen and FedCG-in-FedMD-CG use.

G does not draw images: it draws the *latent features* h = extractor(x) of a model split into
``extractor`` and ``classifier`` (see :mod:`fedistill.models.base`), so its output goes straight into
the classifier head. In FedMD-CG it is what a client shares instead of its feature extractor.

Architecture (the released code's ``Generate``): input = concat(ε, label code), then per hidden width
a block Linear → BatchNorm1d → ReLU, then a Linear "representation layer" to ``feature_dim`` with no
output activation. The parameter names (``fc_layers.N.*``, ``representation_layer.*``,
``embedding_layer.*``) are the code's, so released generator weights load unchanged.

Where the methods and the code differ, the constructor has an option:

* ``noise``: ``"normal"`` (default; the paper's ε ~ N(0, I)) or ``"uniform"`` (U[0, 1), what the
  released FedMD-CG and FedGen codes draw, although their comments say Gaussian).
* ``label_input``: ``"one-hot"`` (default, all three codes) or ``"embedding"`` (a learned
  nn.Embedding; FedMD-CG's ``--embedding`` uses ``embedding_dim = noise_dim``, FedCG's original C).
* ``hidden_dims`` / ``noise_dim``: FedMD-CG uses (512, 128) / 64 for MNIST, (512, 256) / 128 for
  Fashion-MNIST, EMNIST and CIFAR-10, (1024, 512) / 256 for CIFAR-100 (see
  :func:`fedmdcg_generator_sizes`); FedGen uses (256,) / 32 with uniform noise.
* ``output_activation``: ``"none"`` (FedMD-CG, FedGen) or ``"sigmoid"`` (FedCG's original generator
  ends in a sigmoid; its convolutional feature-map layout is not reproduced here).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.models.base import Classifier, unknown_choice

NOISE_DISTRIBUTIONS: tuple[str, ...] = ("normal", "uniform")
LABEL_INPUTS: tuple[str, ...] = ("one-hot", "embedding")
OUTPUT_ACTIVATIONS: tuple[str, ...] = ("none", "sigmoid")


def _check_positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def _check_hidden_dims(hidden_dims: object) -> tuple[int, ...]:
    if isinstance(hidden_dims, str | bytes) or not isinstance(hidden_dims, Sequence):
        raise ConfigError(f"generator hidden_dims must be a list of positive integers, got {hidden_dims!r}")
    return tuple(_check_positive("each generator hidden width", h) for h in hidden_dims)


def fedmdcg_generator_sizes(dataset: str) -> tuple[tuple[int, ...], int]:
    """(hidden widths, noise dimension) of FedMD-CG's generator config for ``dataset``.

    The code's table: MNIST (512, 128) / 64; CIFAR-100 (1024, 512) / 256; Fashion-MNIST, EMNIST,
    CIFAR-10 and anything else (512, 256) / 128. The small "digits" set takes MNIST's sizes.
    """
    name = dataset.lower()
    if name in ("mnist", "digits"):
        return (512, 128), 64
    if name in ("cifar100", "cifar-100"):
        return (1024, 512), 256
    return (512, 256), 128


def sample_noise(
    batch: int,
    noise_dim: int,
    distribution: str = "normal",
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """ε of shape (batch, noise_dim): N(0, I) (paper) or U[0, 1) (released code, ``"uniform"``).

    Drawn on ``generator``'s device (CPU by default) and then moved, so a seeded CPU generator gives
    the same ε whatever device the model is on.
    """
    if distribution not in NOISE_DISTRIBUTIONS:
        raise unknown_choice("noise distribution", distribution, NOISE_DISTRIBUTIONS)
    draw = torch.randn if distribution == "normal" else torch.rand
    gen_device = generator.device if generator is not None else "cpu"
    eps = draw(batch, noise_dim, generator=generator, device=gen_device)
    return eps if device is None else eps.to(device)


class FeatureGenerator(nn.Module):
    """G(y, ε): labels (B,) int64 and noise (B, noise_dim) → features (B, feature_dim)."""

    def __init__(
        self,
        num_classes: int,
        feature_dim: int,
        *,
        noise_dim: int = 128,
        hidden_dims: Sequence[int] = (512, 256),
        noise: str = "normal",
        label_input: str = "one-hot",
        embedding_dim: int | None = None,
        output_activation: str = "none",
    ):
        super().__init__()
        self.num_classes = _check_positive("num_classes", num_classes)
        self.feature_dim = _check_positive("generator feature_dim", feature_dim)
        self.noise_dim = _check_positive("generator noise_dim", noise_dim)
        self.hidden_dims = _check_hidden_dims(hidden_dims)
        if noise not in NOISE_DISTRIBUTIONS:
            raise unknown_choice("noise distribution", noise, NOISE_DISTRIBUTIONS)
        if label_input not in LABEL_INPUTS:
            raise unknown_choice("generator label input", label_input, LABEL_INPUTS)
        if output_activation not in OUTPUT_ACTIVATIONS:
            raise unknown_choice("generator output activation", output_activation, OUTPUT_ACTIVATIONS)
        if embedding_dim is not None and label_input != "embedding":
            raise ConfigError(
                f"embedding_dim={embedding_dim!r} only applies to label_input='embedding' "
                f"(got label_input={label_input!r}); drop it or switch the label input"
            )
        self.noise = noise
        self.label_input = label_input
        self.output_activation = output_activation

        if label_input == "embedding":
            # The code's default embedding size is the noise size.
            code_dim = (
                self.noise_dim if embedding_dim is None else _check_positive("embedding_dim", embedding_dim)
            )
            self.embedding_layer = nn.Embedding(self.num_classes, code_dim)
        else:
            code_dim = self.num_classes
        self.label_code_dim = code_dim

        layers: list[nn.Module] = []
        width = self.noise_dim + code_dim
        for hidden in self.hidden_dims:
            layers += [nn.Linear(width, hidden), nn.BatchNorm1d(hidden), nn.ReLU()]
            width = hidden
        self.fc_layers = nn.ModuleList(layers)
        self.representation_layer = nn.Linear(width, self.feature_dim)

    def _device(self) -> torch.device:
        return self.representation_layer.weight.device

    def label_code(self, labels: torch.Tensor) -> torch.Tensor:
        """The label part of G's input: one-hot (B, C) floats or the learned embedding (B, E).

        The diversity losses div1/div2 use it as the label in their pair distances.
        """
        labels = labels.to(self._device())
        if labels.dtype != torch.int64 or labels.dim() != 1:
            raise ValueError(f"labels must be int64 of shape (B,), got {labels.dtype} {tuple(labels.shape)}")
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            raise ValueError(
                f"labels must be in 0..{self.num_classes - 1}, got {int(labels.min())}..{int(labels.max())}"
            )
        if self.label_input == "embedding":
            return self.embedding_layer(labels)
        return F.one_hot(labels, self.num_classes).to(self.representation_layer.weight.dtype)

    def sample_noise(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """ε for ``batch`` samples from this generator's noise distribution, on its device."""
        return sample_noise(batch, self.noise_dim, self.noise, generator=generator, device=self._device())

    def forward(
        self,
        labels: torch.Tensor,
        noise: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
        return_noise: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Features for ``labels``; fresh ε (from ``generator`` if given) unless ``noise`` is passed.

        With ``return_noise=True`` it returns ``(features, noise)``: the diversity losses compare pair
        distances of ε with pair distances of G's outputs, so the caller needs the ε that was used.
        """
        code = self.label_code(labels)
        if noise is None:
            noise = self.sample_noise(labels.shape[0], generator)
        elif noise.shape != (labels.shape[0], self.noise_dim):
            raise ValueError(
                f"noise must have shape ({labels.shape[0]}, {self.noise_dim}), got {tuple(noise.shape)}"
            )
        noise = noise.to(device=self._device(), dtype=code.dtype)
        h = torch.cat((noise, code), dim=1)
        for layer in self.fc_layers:
            h = layer(h)
        out = self.representation_layer(h)
        if self.output_activation == "sigmoid":
            out = torch.sigmoid(out)
        return (out, noise) if return_noise else out


def build_feature_generator(
    num_classes: int,
    feature_dim: int,
    *,
    dataset: str | None = None,
    hidden_dims: Sequence[int] | None = None,
    noise_dim: int | None = None,
    noise: str = "normal",
    label_input: str = "one-hot",
    embedding_dim: int | None = None,
    output_activation: str = "none",
) -> FeatureGenerator:
    """A feature generator; sizes not given explicitly come from FedMD-CG's table for ``dataset``.

    Raises ConfigError naming the bad value (non-positive sizes, unknown noise / label input /
    activation, an embedding size without the embedding input).
    """
    default_hidden, default_noise = fedmdcg_generator_sizes(dataset or "")
    return FeatureGenerator(
        num_classes,
        feature_dim,
        noise_dim=default_noise if noise_dim is None else noise_dim,
        hidden_dims=default_hidden if hidden_dims is None else hidden_dims,
        noise=noise,
        label_input=label_input,
        embedding_dim=embedding_dim,
        output_activation=output_activation,
    )


def feature_generator_for(model: Classifier, info: DatasetInfo, **options: object) -> FeatureGenerator:
    """The generator that imitates ``model.extractor`` on ``info``'s dataset (output = ``feature_dim``).

    ``options`` are :func:`build_feature_generator`'s keyword arguments (``noise``, ``hidden_dims``, ...).
    """
    if not isinstance(model, Classifier):
        raise ConfigError(
            "a feature generator needs a model split into extractor and classifier, "
            f"got {type(model).__name__}"
        )
    return build_feature_generator(info.num_classes, model.feature_dim, dataset=info.name, **options)  # type: ignore[arg-type]
