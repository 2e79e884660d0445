"""FedMD-CG's options, the ``official-code`` preset that rewrites them, and what both sides build from
them: the feature generator, and the guards of their training loops."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedistill.algorithms.fedmdcg import losses as L
from fedistill.algorithms.shared.option_checks import (
    check_batchnorm_batch,
    check_choices,
    check_nonnegative,
    check_positive,
)
from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError, FederationError
from fedistill.models.base import Classifier
from fedistill.models.feature_generator import FeatureGenerator, feature_generator_for
from fedistill.seeding import seeded

PRESETS = ("paper", "official-code")
LABEL_COUNTS = ("data", "cache")
BATCH_ORDERS = ("shuffled", "cycled")  # stage 1: a fresh shuffle per round | one order read in a cycle
GENERATOR_GRADS = ("per-batch", "accumulated")  # stage 2: G_i's gradients cleared per batch | per pass
LAMBDAS = (  # stage 1 (ramped), then stage 2
    "lambda_kl", "lambda_ce_gen", "lambda_mse",
    "gen_lambda_ce", "gen_lambda_kl", "gen_lambda_mse", "gen_lambda_div",
)  # fmt: skip


@dataclass(frozen=True)
class FedMDCGOptions:
    """Defaults: the paper's method with the released code's hyper-parameters (reference notes §4.2).

    The common run keys carry the local model's training: the paper's setting is ``optimizer = "sgd"``,
    ``lr = 0.05``, ``batch_size = 64``, ``local_steps = 20`` (mini-batch steps, not epochs), K = 10
    clients, 100 rounds, model ``lenet-fedmdcg``.
    """

    preset: str = "paper"  # paper | official-code (switches noise, clear_cache, dedup, label counts, L3)
    # stage 1: weights of the ramped terms, the ramp, and T_c
    lambda_kl: float = 1.0  # λ1: KL from the local head's reading of Ĝ(y) to its reading of F_i(x)
    lambda_ce_gen: float = 1.0  # λ2: CE of the local head on Ĝ's features for sampled labels
    lambda_mse: float = 0.1  # λ3: MSE between the local extractor's features and Ĝ's
    # cubic: λ⁰·(t/(R−1))^power in round t + 1 of R | none: λ⁰ from the second round on (the first, before
    # any global pair exists, is CE only)
    ramp: str = "cubic"
    ramp_power: float = 3.0  # the power of the cubic ramp
    client_temperature: float = 10.0  # T_c of the stage-1 KL
    generated_batch_size: int = 64  # labels ŷ drawn per step for the CE on Ĝ's features
    batch_order: str = "shuffled"
    """shuffled: each round's local steps draw batches from a fresh shuffle (a short last batch left out)
    | cycled: the released code's persistent loader, one order drawn once per client and read batch
    after batch, the short last batch kept (unless it holds one sample), each round going on where the
    last one stopped (not switched by the preset)."""
    # stage 2: the local generator
    generator_hidden: str = ""  # comma list of hidden widths; "" = FedMD-CG's table for the dataset
    noise_dim: int = 0  # 0 = FedMD-CG's table for the dataset
    noise: str = "normal"  # normal (paper) | uniform (the code's torch.rand)
    diversity: str = "div2"  # stage 2: the generator's diversity term, Eq. 8 div2 | div1 | Eq. 7 div0 | none
    gen_lambda_ce: float = 1.0  # stage 2: the generator's CE through the local head (Eq. 6)
    gen_lambda_kl: float = 1.0  # stage 2: the logit-level KL from the local model (Eq. 5)
    gen_lambda_mse: float = 1.0  # stage 2: the feature-level MSE to the local extractor (Eq. 5)
    gen_lambda_div: float = 1.0  # stage 2: the diversity term (Eq. 7-8)
    generator_passes: int = 1  # Adam steps per cached batch and round (the code's I_gg)
    generator_lr: float = 3e-4  # Adam learning rate of the local generator
    generator_weight_decay: float = 1e-4  # Adam weight decay of the local generator
    generator_grads: str = "per-batch"
    """per-batch: G_i's gradients are cleared before each cached batch, so each Adam step follows its own
    batch | accumulated: the released code's, cleared once per pass, so the step at the k-th batch follows
    the sum of the gradients of batches 1..k of that pass (not switched by the preset)."""
    # The code's cache of real batches: never cleared (a typo) and de-duplicated by label sum.
    clear_cache: bool = True  # empty the cache after each round (False: the code's, never emptied)
    dedup_label_sum: bool = False  # de-duplicate the cached batches by their label sum (the code)
    label_counts: str = "data"  # data: the training split's class counts | cache: the code's (§4.3)
    # server
    server_distillation: bool = True  # the code's distill_aggregation; False: plain weighted average
    server_steps: int = 50  # Adam steps of the server's crossed distillation per round
    server_lr: float = 3e-4  # Adam learning rate of the server's distillation
    server_weight_decay: float = 1e-4
    """Adam's coupled L2 (the code's): it outweighs the tiny KD gradient and shrinks C_g ~20 % a round
    early on (metrics classifier_norm*; benchmarks/fedmdcg_variants.py)."""
    server_batch_size: int = 64  # labels drawn per step of the server's distillation
    server_temperature: float = 10.0  # temperature of the server's KL terms
    softmax_bug: bool = False  # L3 feeds a softmax where KLDivLoss wants a log-softmax (the code)

    def validate(self) -> None:
        """Check the choices, the positive and non-negative keys, and the generator's hidden widths."""
        choices = {
            "preset": PRESETS,
            "ramp": L.RAMP_SCHEDULES,
            "noise": ("normal", "uniform"),
            "diversity": L.DIVERSITY_TYPES,
            "label_counts": LABEL_COUNTS,
            "generator_grads": GENERATOR_GRADS,
            "batch_order": BATCH_ORDERS,
        }
        check_choices("fedmdcg", self, choices)
        check_positive(
            "fedmdcg",
            self,
            "generated_batch_size generator_passes server_steps server_batch_size "
            "ramp_power client_temperature generator_lr server_lr server_temperature",
        )
        check_batchnorm_batch("fedmdcg", self, "server_batch_size")  # G_g's steps
        check_nonnegative("fedmdcg", self, "generator_weight_decay server_weight_decay")
        if self.noise_dim < 0:
            raise ConfigError(
                f"fedmdcg.noise_dim must be >= 0 (0: the dataset's default), got {self.noise_dim}"
            )
        check_nonnegative("fedmdcg", self, " ".join(LAMBDAS))
        self.hidden_dims()

    def local_lambdas(self) -> L.LocalModelLambdas:
        """The weights of the local model's loss terms (KL, CE on generated data, MSE)."""
        return L.LocalModelLambdas(self.lambda_kl, self.lambda_ce_gen, self.lambda_mse)

    def generator_lambdas(self) -> L.GeneratorLambdas:
        """The weights of the generator's loss terms (CE, KL, MSE, diversity)."""
        return L.GeneratorLambdas(
            self.gen_lambda_ce, self.gen_lambda_kl, self.gen_lambda_mse, self.gen_lambda_div
        )

    def hidden_dims(self) -> tuple[int, ...] | None:
        """The generator's hidden widths from `generator_hidden`; None when it is empty (the default net)."""
        if not self.generator_hidden.strip():
            return None
        try:
            dims = tuple(int(w) for w in self.generator_hidden.split(","))
        except ValueError:
            dims = ()
        if not dims or min(dims) < 1:
            raise ConfigError(
                "fedmdcg.generator_hidden must be a comma list of positive widths, "
                f"got {self.generator_hidden!r}"
            )
        return dims


#: What `preset = "official-code"` changes (notes §4.3, §4.7): only keys the user did not set.
OFFICIAL_CODE = {
    "noise": "uniform",
    "clear_cache": False,
    "dedup_label_sum": True,
    "label_counts": "cache",
    "softmax_bug": True,
}


def resolve_options(
    config: RunConfig, options: FedMDCGOptions, info: DatasetInfo | None = None
) -> FedMDCGOptions:
    """With preset "official-code", the official code's values for every key the config does not set
    (`Algorithm.resolve_options`; `info` is unused here)."""
    if options.preset != "official-code":
        return options
    explicit = set(config.options.get("fedmdcg", {}))
    return dataclasses.replace(options, **{k: v for k, v in OFFICIAL_CODE.items() if k not in explicit})


def new_generator(
    config: RunConfig, info: DatasetInfo, options: FedMDCGOptions, model: Classifier
) -> FeatureGenerator:
    """G imitating ``model.extractor``; seeded from the run seed, so every site and the server start equal."""
    sizes: dict[str, Any] = {"noise": options.noise}
    if options.hidden_dims() is not None:
        sizes["hidden_dims"] = options.hidden_dims()
    if options.noise_dim:
        sizes["noise_dim"] = options.noise_dim
    return seeded(
        config.seed, lambda: feature_generator_for(model, info, **sizes), "model-init", "fedmdcg-generator"
    )


# --- guards of both sides' training loops ---------------------------------------------------------


def finite_loss(value: torch.Tensor, what: str) -> float:
    """The loss as a float; a NaN or infinite loss stops the run, naming the stage that diverged."""
    number = float(value.detach())
    if not math.isfinite(number):
        raise FederationError(f"FedMD-CG {what} diverged: loss is {number} (lower the learning rates)")
    return number


def frozen(module: nn.Module) -> nn.Module:
    """``module`` in eval mode without gradients: a teacher (the received Ĝ, the server's local pairs)."""
    module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module
