"""FedCG's options, and the generator's shape they set (the FedMD-CG repo's defaults, the original's
choices as options)."""

from __future__ import annotations

from dataclasses import dataclass

from fedistill.algorithms.shared.option_checks import (
    check_batchnorm_batch,
    check_choices,
    check_nonnegative,
    check_positive,
    parse_widths,
)
from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.models.feature_generator import (
    LABEL_INPUTS,
    NOISE_DISTRIBUTIONS,
    OUTPUT_ACTIVATIONS,
    fedmdcg_generator_sizes,
)

DISCRIMINATOR_ACTIVATIONS: tuple[str, ...] = ("none", "leaky-relu")
#: γ(t): the FedMD-CG repo's cubic ramp, the original's sigmoid ramp, or γ₀ throughout
GAMMA_SCHEDULES: tuple[str, ...] = ("cubic", "sigmoid", "constant")


@dataclass(frozen=True)
class FedCGOptions:
    """FedCG's options: the ramped MSE between features and the conditional generator, the GAN's sizes and
    training, and the aggregation."""

    gamma: float = 1.0  # γ₀: weight of MSE(F(x), Ĝ(y)) at full ramp
    gamma_schedule: str = "cubic"  # cubic (FedMD-CG repo: (t/(R−1))³) | sigmoid (original) | constant
    generator_hidden: str = ""  # comma-separated widths; empty: FedMD-CG's table for the dataset
    noise_dim: int = 0  # 0: FedMD-CG's table for the dataset
    noise: str = "uniform"  # uniform (the code's U[0, 1)) | normal (the original)
    label_input: str = "one-hot"  # one-hot | embedding (the original)
    output_activation: str = "none"  # none | sigmoid (the original)
    discriminator_hidden: int = 0  # 0: FedMD-CG's fc1 width (digits/MNIST 32, FMNIST 64, else 128)
    conditional_discriminator: bool = False  # the original's D also sees the label
    discriminator_activation: str = "none"  # none (the code: D linear in h) | leaky-relu
    generator_lr: float = 3e-4  # Adam learning rate of the client's feature generator G_k
    discriminator_lr: float = 3e-4  # Adam learning rate of the client's feature discriminator D_k
    gan_beta1: float = 0.9  # Adam beta1 of G and D (the original: 0.5)
    gan_weight_decay: float = 1e-4  # Adam weight decay of G_k and D_k
    gan_passes: int = 1  # passes over the round's batches in the GAN stage (the original: 20 epochs)
    weighting: str = "samples"  # samples | uniform: how the server averages classifiers and generators
    aggregation: str = "average"  # average (FedMD-CG repo default) | distill (average, then KD)
    distill_steps: int = 20  # aggregation = distill: server steps distilling the averaged pair
    distill_batch_size: int = 64  # aggregation = distill: labels per distillation batch
    distill_lr: float = 1e-3  # aggregation = distill: the server's Adam learning rate
    distill_temperature: float = 10.0  # aggregation = distill: the KL's temperature

    def validate(self) -> None:
        """Check the choices and the ranges of the weights, learning rates and sizes."""
        choices = {
            "gamma_schedule": GAMMA_SCHEDULES,
            "noise": NOISE_DISTRIBUTIONS,
            "label_input": LABEL_INPUTS,
            "output_activation": OUTPUT_ACTIVATIONS,
            "weighting": ("samples", "uniform"),
            "aggregation": ("average", "distill"),
            "discriminator_activation": DISCRIMINATOR_ACTIVATIONS,
        }
        check_choices("fedcg", self, choices)
        check_nonnegative("fedcg", self, "gamma gan_weight_decay noise_dim discriminator_hidden")
        check_positive(
            "fedcg",
            self,
            "generator_lr discriminator_lr gan_passes distill_steps distill_batch_size distill_lr "
            "distill_temperature",
        )
        check_batchnorm_batch("fedcg", self, "distill_batch_size")  # the server's steps on G
        if not 0 <= self.gan_beta1 < 1:
            raise ConfigError(f"fedcg.gan_beta1 must be in [0, 1), got {self.gan_beta1}")
        if self.generator_hidden:
            parse_widths("fedcg.generator_hidden", self.generator_hidden)


def generator_options(options: FedCGOptions, info: DatasetInfo) -> dict[str, object]:
    """The generator's sizes: `fedcg`'s keys where set, else FedMD-CG's table for the dataset."""
    hidden, noise_dim = fedmdcg_generator_sizes(info.name)
    if options.generator_hidden:
        hidden = parse_widths("fedcg.generator_hidden", options.generator_hidden)
    return {
        "hidden_dims": hidden,
        "noise_dim": options.noise_dim or noise_dim,
        "noise": options.noise,
        "label_input": options.label_input,
        "output_activation": options.output_activation,
    }
