"""Co-Boosting (Dai et al., ICLR 2024, "Enhancing One-Shot Federated Learning Through Data and Ensemble
Co-Boosting"): DENSE's pipeline (algorithms/one_shot/dense/) on the same local models, uploaded once, with the
data and the ensemble improving each other at the server. Its own steps follow the released code
(`datafree_kd.py`, `co_boosting.sh`, `datafree/synthesis/coboost.py`):

* Hard samples in synthesis. The generator's cross-entropy is weighted per sample by
  (1 - p_E(y_i | x_i))^h (`hard_power` h = 1, the code's ``--hs``; the weight carries no gradient), so G
  works hardest on the samples the ensemble finds hard.
* Ensemble re-weighting (`reweight`). The ensemble is sum_k w_k f_k(x) / sum_k w_k with w_k = 1/K at
  the start. From the second epoch on, after synthesis, one pass over the pool (`reweight_passes`; the
  student's `kd_steps` does not change it) takes one signed-gradient step per batch on the pool's samples
  and their sampled labels (the pool includes the epoch's new batch; the released code re-weights before
  adding it):
  w <- clip(w - mu * decay^e * sign(d CE(sum_k w_k f_k(x) / sum_k w_k, y) / dw), 0, 1)
  (e the 0-based epoch; `reweight_lr` mu = 0.01, `reweight_decay` 0.99). Weights that help the ensemble
  on the synthetic (hard) samples grow. The code's extra bound |w - w_start| <= 1 is implied by [0, 1].
  The re-weighted ensemble generates the next batches and teaches the student.
* Perturbed samples in distillation (`perturbation`), one signed-gradient step of size `perturb_eps`
  on each pool batch before the student sees it (in the normalised input space, as the code):
  ``ods`` (the code's): x + eps sign(grad_x sum(r * softmax(E(x) / 4))), r ~ U(-1, 1) per batch,
  output-diversified sampling; ``discrepancy``: x + eps sign(grad_x KL(E(x) || S(x))) at
  `adv_temperature`, the hard-sample step that raises the student-ensemble discrepancy (S in eval mode);
  ``none``. `ods_temperature` is read by ``ods`` only.

Everything else is DENSE's, with DENSE's defaults (`preset = "dense"`), so a comparison with `dense`
isolates these three steps. `preset = "official-code"` takes the released code's values of the shared
keys instead (`OFFICIAL_CODE`: no batch-norm term, the adversarial KL at T = 3 on every sample, G's
gradient clipped at 10, the student's SGD at lr 0.01 with weight decay 1e-4, a cosine schedule, KL at
T = 4 and clipping at 10, batches of 128). It leaves `reset_generator` false (one G throughout), though
the released code re-initialises G before every synthesis: set `reset_generator = true` for that too.
DENSE's values stay the default: on digits the code's left the student lower
(docs/results/tuning-history.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedistill.algorithms.base import Algorithm, ServerContext, register
from fedistill.algorithms.one_shot.dense import losses as L
from fedistill.algorithms.one_shot.dense.client import OneShotClient
from fedistill.algorithms.one_shot.dense.options import DenseOptions
from fedistill.algorithms.one_shot.dense.server import DenseServer
from fedistill.algorithms.shared.option_checks import check_choices, check_nonnegative
from fedistill.algorithms.shared.stage1 import STAGE1_UNUSED_KEYS
from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.federation.fleet import Fleet
from fedistill.seeding import torch_generator

PERTURBATIONS = ("ods", "discrepancy", "none")


PRESETS = ("dense", "official-code")


@dataclass(frozen=True)
class CoBoostingOptions(DenseOptions):
    """DENSE's options and defaults (`preset = "dense"`) plus Co-Boosting's hard samples and ensemble
    weights; `preset = "official-code"` takes the released code's values of the shared keys."""

    preset: str = "dense"  # dense: DENSE's values of the shared keys | official-code: the released code's
    # h of the hard-sample weight (1 - p_E(y | x))^h on G's cross-entropy (0: DENSE's plain CE); --hs
    hard_power: float = 1.0
    # the step on each pool batch before the student sees it: ods (the code's, a random output direction)
    # | discrepancy (towards more student-ensemble KL) | none
    perturbation: str = "ods"
    perturb_eps: float = 8 / 255  # that step's size (normalised inputs); --odseta 8, divided by 255 there
    ods_temperature: float = 4.0  # ods: the temperature of the ensemble's softmax in the perturbation
    # re-weight the ensemble's clients by signed-gradient steps on the pool from the second epoch on
    # (false: uniform weights, DENSE's); --weighted
    reweight: bool = True
    reweight_lr: float = 0.01  # mu, the re-weighting step at epoch 0, times reweight_decay per epoch; --mu
    reweight_decay: float = 0.99  # the re-weighting step's factor per epoch; --wdc
    reweight_passes: int = 1  # passes over the pool per epoch, one re-weighting step a batch; --wa_steps

    section = "coboosting"

    def validate(self) -> None:
        """DENSE's checks, then Co-Boosting's choices and ranges."""
        super().validate()
        check_choices(self.section, self, {"perturbation": PERTURBATIONS, "preset": PRESETS})
        check_nonnegative(self.section, self, "hard_power perturb_eps reweight_lr")
        if not 0 < self.reweight_decay <= 1:
            raise ConfigError(f"coboosting.reweight_decay must be in (0, 1], got {self.reweight_decay!r}")
        if self.ods_temperature <= 0:
            raise ConfigError(f"coboosting.ods_temperature must be > 0, got {self.ods_temperature!r}")
        if self.reweight_passes < 1:
            raise ConfigError(f"coboosting.reweight_passes must be >= 1, got {self.reweight_passes!r}")
        self._check_switched_off()

    def _check_switched_off(self) -> None:
        """A key that its own switch turns off would be ignored: refused, naming the switch."""
        defaults = CoBoostingOptions()
        off = {"perturb_eps": self.perturbation == "none", "ods_temperature": self.perturbation != "ods"}
        off |= dict.fromkeys(("reweight_lr", "reweight_decay", "reweight_passes"), not self.reweight)
        for key, ignored in off.items():
            if ignored and getattr(self, key) != getattr(defaults, key):
                switch = (
                    f"perturbation = {self.perturbation!r}" if key in ("perturb_eps", "ods_temperature")
                    else "reweight = false"
                )  # fmt: skip
                raise ConfigError(
                    f"coboosting.{key} = {getattr(self, key)!r} has no effect with coboosting.{switch} "
                    f"(it would be ignored); leave it at {getattr(defaults, key)!r} or change the switch"
                )


#: What `preset = "official-code"` changes: the released code's values (`datafree_kd.py` defaults and
#: `co_boosting.sh`) of the keys it shares with DENSE; only keys the user did not set. Not
#: `reset_generator` (the code resets G every epoch): the preset keeps one G, as it was measured.
OFFICIAL_CODE = {
    "synthetic_batch_size": 128,
    "kd_batch_size": 128,
    "w_bn": 0.0,
    "adv_temperature": 3.0,
    "adv_mask": False,
    "generator_clip": 10.0,
    "kd_temperature": 4.0,
    "lr_student": 0.01,
    "student_weight_decay": 1e-4,
    "schedule": "cosine",
    "student_clip": 10.0,
}


def resolve_options(
    config: RunConfig, options: CoBoostingOptions, info: DatasetInfo | None = None
) -> CoBoostingOptions:
    """With preset "official-code", the released code's values for every key the config does not set
    (`Algorithm.resolve_options`; `info` is unused here)."""
    if options.preset != "official-code":
        return options
    explicit = set(config.options.get(options.section, {}))
    resolved = dataclasses.replace(options, **{k: v for k, v in OFFICIAL_CODE.items() if k not in explicit})
    resolved.validate()
    return resolved


def ods_perturbation(
    x: torch.Tensor, ensemble: L.Logits, eps: float, temperature: float, rng: torch.Generator
) -> torch.Tensor:
    """x + eps sign(grad_x sum(r * softmax(E(x) / T))) with r ~ U(-1, 1): a step in a random output
    direction (output-diversified sampling), the code's diversification of the pool's samples."""
    x = x.detach().requires_grad_(True)
    out = ensemble(x)
    r = (torch.rand(out.shape, generator=rng) * 2 - 1).to(out.device)
    (grad,) = torch.autograd.grad((r * F.softmax(out / temperature, dim=1)).sum(), x)
    return (x + eps * grad.sign()).detach()


def discrepancy_perturbation(
    x: torch.Tensor, ensemble: L.Logits, student: L.Logits, eps: float, temperature: float
) -> torch.Tensor:
    """x + eps sign(grad_x sum_i KL(E(x_i) || S(x_i))): one signed ascent step on the student-ensemble
    discrepancy, which makes each sample harder for the student."""
    x = x.detach().requires_grad_(True)
    kl = L.kl_to_ensemble(student(x), ensemble(x), temperature).sum()
    (grad,) = torch.autograd.grad(kl, x)
    return (x + eps * grad.sign()).detach()


def reweight_step(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, step: float
) -> torch.Tensor:
    """One signed-gradient step on the ensemble weights: w - step sign(dCE/dw), clipped to [0, 1].

    `logits` (K, B, C) are the teachers' (they do not depend on w). CE is invariant to scaling w, so
    sum_k w_k dCE/dw_k = 0 and a step never zeroes every weight; should rounding do it, w stays."""
    w = weights.detach().clone().requires_grad_(True)
    loss = F.cross_entropy(L.weighted_logits(logits, w), labels)
    (grad,) = torch.autograd.grad(loss, w)
    new = (weights - step * grad.sign()).clamp(0.0, 1.0)
    return new if float(new.sum()) > 0 else weights.clone()


class CoBoostingServer(DenseServer):
    """DENSE's one-shot server with Co-Boosting's hard samples, perturbed inputs and reweighted ensemble."""

    def __init__(self, ctx: ServerContext) -> None:
        options = resolve_options(ctx.config, ctx.options)
        super().__init__(dataclasses.replace(ctx, options=options))
        self.options: CoBoostingOptions = options
        self.hard_power = options.hard_power

    def _after_synthesis(self, epoch: int) -> dict[str, float]:
        o = self.options
        if o.reweight and epoch > 0:
            rng = torch_generator(self.ctx.config.seed, "coboosting-reweight", epoch)
            step = o.reweight_lr * o.reweight_decay**epoch
            for _ in range(o.reweight_passes):  # whole passes, whatever the student's `kd_steps`
                for index in self.one_pass(rng):
                    x, targets = self.pool.take(index)
                    with torch.no_grad():
                        logits = self.teacher_logits(x)
                    self.weights = reweight_step(logits, targets, self.weights, step)
        return {f"ensemble_weight_{cid}": float(w) for cid, w in zip(self.clients, self.weights, strict=True)}

    def _kd_inputs(self, x: torch.Tensor, labels: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
        o = self.options
        if o.perturbation == "ods":
            return ods_perturbation(x, self.ensemble, o.perturb_eps, o.ods_temperature, rng)
        if o.perturbation == "discrepancy":
            self.student.eval()  # the step must not move S's BatchNorm statistics
            return discrepancy_perturbation(x, self.ensemble, self.student, o.perturb_eps, o.adv_temperature)
        return x

    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        metrics = super().evaluate(fleet, round)
        return metrics | {"ensemble_reweighted_accuracy": self._reweighted_accuracy()}

    def final_evaluate(self, fleet: Fleet, last: dict[str, float]) -> dict[str, float]:
        final = super().final_evaluate(fleet, last)
        return final | {"ensemble_reweighted_accuracy": self._reweighted_accuracy()}

    def _reweighted_accuracy(self) -> float:
        """The re-weighted ensemble on the test set (evaluation only: nothing selects on it)."""
        return float(self.ctx.evaluate(L.Ensemble(self.teachers, self.weights))["accuracy"])


register(
    Algorithm(
        "coboosting",
        "Co-Boosting: DENSE with hard samples and a re-weighted ensemble (models uploaded once)",
        OneShotClient,
        CoBoostingServer,
        CoBoostingOptions,
        unused_keys=STAGE1_UNUSED_KEYS,
        resolve_options=resolve_options,
    )
)
