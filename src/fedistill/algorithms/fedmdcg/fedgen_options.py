"""FedGen's options and what its client and server both build from them: the feature generator (FedCG's
too) and the prefix of the model entries that travel."""

from __future__ import annotations

from dataclasses import dataclass

from fedistill.algorithms.shared.option_checks import (
    check_batchnorm_batch,
    check_choices,
    check_nonnegative,
    check_positive,
    parse_widths,
)
from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.models.base import CLASSIFIER_PREFIX, Classifier
from fedistill.models.feature_generator import (
    LABEL_INPUTS,
    NOISE_DISTRIBUTIONS,
    FeatureGenerator,
    feature_generator_for,
)
from fedistill.seeding import seeded

#: How the labels of a generator batch are drawn: the paper's p̂(y) (the summed label counts) or uniformly
#: (the released code)
LABEL_SAMPLINGS: tuple[str, ...] = ("counts", "uniform")


@dataclass(frozen=True)
class FedGenOptions:
    """FedGen's options: what the clients share, how the server weighs them, and the generator's inputs and
    training."""

    share: str = "model"  # model (FedGen's code: whole models averaged) | classifier (FedMD-CG's comparison)
    weighting: str = "samples"  # samples | uniform: how the server weighs the received parameters
    label_sampling: str = "counts"  # counts (the paper's p̂(y)) | uniform (the released code)
    generative_alpha: float = 10.0  # α₀: client CE on generated features of sampled labels
    generative_beta: float = 10.0  # β₀: client KL to the head's answer on generated features (EMNIST: 1)
    decay: float = 0.98  # α_t = max(min_weight, α₀·decay^t), same for β_t
    min_weight: float = 1e-4  # the floor of the decayed α_t and β_t
    generator_batch_size: int = 32  # labels per generated batch, on the server and in the client's CE
    generator_steps: int = 50  # server Adam steps on G per round (10 epochs × 5 iterations)
    generator_lr: float = 3e-4  # the server's Adam learning rate for G
    generator_weight_decay: float = 1e-2  # the server's Adam weight decay for G
    generator_lr_decay: float = 0.98  # ExponentialLR factor, one step per round
    teacher_weight: float = 1.0  # server: the label-weighted CE of the clients' heads on G(y)
    diversity_weight: float = 1.0  # server: exp(−mean d_ε·d_G)
    diversity_metric: str = "l1"  # distance on G's outputs: l1 (FedGen) | l2 (the FedMD-CG repo's FedGen)
    # server: minus this weight times KL(ensemble ‖ global head) on G(y), averaged over samples and classes
    # (not generative_beta, the clients' β); FedGen uses 0
    adversarial_weight: float = 0.0
    noise: str = "uniform"  # uniform (the code's U[0, 1)) | normal
    noise_dim: int = 32  # length of G's noise ε
    generator_hidden: str = "256"  # comma-separated hidden widths
    label_input: str = "one-hot"  # one-hot | embedding

    def validate(self) -> None:
        """Check the choices and the ranges of the weights, learning rates and sizes."""
        choices = {
            "share": ("model", "classifier"),
            "weighting": ("samples", "uniform"),
            "label_sampling": LABEL_SAMPLINGS,
            "diversity_metric": ("l1", "l2"),
            "noise": NOISE_DISTRIBUTIONS,
            "label_input": LABEL_INPUTS,
        }
        check_choices("fedgen", self, choices)
        check_nonnegative(
            "fedgen",
            self,
            "generative_alpha generative_beta min_weight generator_weight_decay teacher_weight "
            "diversity_weight adversarial_weight",
        )
        check_positive("fedgen", self, "generator_batch_size generator_steps generator_lr noise_dim")
        check_batchnorm_batch("fedgen", self, "generator_batch_size")  # the server's steps on G
        if not 0 < self.decay <= 1 or not 0 < self.generator_lr_decay <= 1:
            raise ConfigError(
                f"fedgen.decay and fedgen.generator_lr_decay must be in (0, 1], "
                f"got {self.decay} and {self.generator_lr_decay}"
            )
        parse_widths("fedgen.generator_hidden", self.generator_hidden)


def build_generator(
    config: RunConfig, info: DatasetInfo, model: Classifier, **options: object
) -> FeatureGenerator:
    """G for `model`'s features, initialised from the run seed: the server and every client start equal."""
    return seeded(
        config.seed, lambda: feature_generator_for(model, info, **options), "feature-generator-init"
    )


def shared_prefix(options: FedGenOptions) -> str:
    """'' shares every model entry; 'classifier.' only the head."""
    return "" if options.share == "model" else CLASSIFIER_PREFIX


def generator_options(options: FedGenOptions) -> dict[str, object]:
    """The generator's sizes, noise and label input from the options."""
    return {
        "hidden_dims": parse_widths("fedgen.generator_hidden", options.generator_hidden),
        "noise_dim": options.noise_dim,
        "noise": options.noise,
        "label_input": options.label_input,
    }
