"""FedMD-CG loss terms, weight schedule and server helpers as pure functions on tensors, in one namespace.

Notation: a client i has a feature extractor F_i, a classifier head D_i (= C_i on the server) and a
local feature generator G_i; the server holds the global pair (G_g, C_g), and Ĝ is the global
generator a client received. ``B`` samples, ``C`` classes, ``K`` clients.

Equation numbers are the FedMD-CG paper's as its surviving prose places them (the formulas themselves
were lost in extraction; every formula here is the released code's, read from the reference notes):

* client, stage 1 (local model): Eq. 1 CE, Eq. 2 the feature-level MSE to Ĝ and the logit-level KL
  through the local head, Eq. 3 the extra CE on Ĝ's features for sampled labels, Eq. 4 their sum;
* client, stage 2 (local generator): Eq. 5 the logit-level KL and feature-level MSE from the local
  model, Eq. 6 the generator CE, Eq. 7 the diversity loss div0 (div1 is defined just after it),
  Eq. 8 div2, Eq. 9 their sum;
* server: Eq. 10 L1, Eq. 11 L2 and L3, Eq. 12 their sum.

They live by concern in :mod:`local_model_losses` (Eq. 1-4 and the ramp), :mod:`generator_losses`
(Eq. 5-9 and the diversity constraints), :mod:`server_losses` (Eq. 10-12) and :mod:`label_statistics`
(label counts, label sampling, client weights, the weighted average); this module gathers them so that
the algorithm code reads ``L.local_ce``, ``L.crossed_distillation`` and so on.

Where the released code differs from its evident intent, the code's form is an explicit argument that
is off by default:

* ``server_l3(..., official_softmax_bug=True)``: the code feeds a softmax where KLDivLoss expects a
  log-softmax;
* uniform noise ε ~ U[0, 1) instead of N(0, I): ``noise="uniform"`` of
  :class:`fedistill.models.feature_generator.FeatureGenerator`.

Two more of the code's behaviours belong to the client loop, not to these functions, and become
options of FedMD-CG (fedmdcg_options.py): its cache of real batches is never cleared (a typo clears
the noise cache twice), so G_i's steps per round and the uploaded label counts grow with every round
(``clear_cache``); and the uploaded label counts start from a floor of 0 in round 0 and 1 afterwards.
"""

from __future__ import annotations

from fedistill.algorithms.fedmdcg.generator_losses import (
    DIVERSITY_TYPES,
    GeneratorLambdas,
    diversity_div0,
    diversity_div1,
    diversity_div2,
    diversity_loss,
    feature_kd_from_local,
    generator_ce,
    generator_objective,
    logit_kd_from_local,
    pairwise_distance,
)
from fedistill.algorithms.fedmdcg.label_statistics import (
    label_distribution,
    label_weights,
    per_sample_label_weights,
    sample_labels,
    weighted_average,
)
from fedistill.algorithms.fedmdcg.local_model_losses import (
    CLIENT_TEMPERATURE,
    RAMP_SCHEDULES,
    LocalModelLambdas,
    distillation_active,
    feature_kd_to_global,
    generated_ce,
    local_ce,
    local_model_objective,
    logit_kd_from_global,
    ramp_factor,
)
from fedistill.algorithms.fedmdcg.server_losses import (
    SERVER_TEMPERATURE,
    CrossedDistillation,
    crossed_distillation,
    server_kd_term,
    server_l1,
    server_l2,
    server_l3,
)

__all__ = [
    "CLIENT_TEMPERATURE",
    "DIVERSITY_TYPES",
    "RAMP_SCHEDULES",
    "SERVER_TEMPERATURE",
    "CrossedDistillation",
    "GeneratorLambdas",
    "LocalModelLambdas",
    "crossed_distillation",
    "distillation_active",
    "diversity_div0",
    "diversity_div1",
    "diversity_div2",
    "diversity_loss",
    "feature_kd_from_local",
    "feature_kd_to_global",
    "generated_ce",
    "generator_ce",
    "generator_objective",
    "label_distribution",
    "label_weights",
    "local_ce",
    "local_model_objective",
    "logit_kd_from_global",
    "logit_kd_from_local",
    "pairwise_distance",
    "per_sample_label_weights",
    "ramp_factor",
    "sample_labels",
    "server_kd_term",
    "server_l1",
    "server_l2",
    "server_l3",
    "weighted_average",
]
