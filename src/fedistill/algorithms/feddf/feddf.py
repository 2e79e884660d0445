"""FedDF (Lin et al. 2020, "Ensemble Distillation for Robust Model Fusion in Federated Learning").

Round t (Algorithms 1 and 3 of the paper):

1. server -> sampled clients `train`: the current model of the client's architecture group.
   Each client trains it locally (as in FedAvg) and returns its parameters and sample count.
2. The server (optionally) drops the received models that predict at random on its validation
   split (`drop_worst`), then, per architecture group, averages that group's models: the student
   initialisation.
3. Each group's student is distilled from the ensemble of ALL received models (every architecture)
   on unlabeled server-side inputs (`source`): Adam with a cosine schedule, gradient clipping,
   validation every `eval_every_steps` steps, early stopping after `patience` evaluations without
   improvement, and the best-on-validation student is kept. It goes back to that group next round.

Defaults follow the paper where it says (AVGLOGITS, Adam 1e-3 with cosine annealing) and the released
code where it is silent (notes section 3): temperature 1 and no T^2 factor, clipping at 5. The
distillation batch is the README runs' 64, where the paper says 128 in all experiments (its footnote 6).
One default departs from the code, measured: the student's BatchNorm (`student_bn`, below). Two
defaults are scaled for a CPU and say so: `steps` = 500 (the paper: 10^4, early stop after 10^3) and
`source` = `noise` (the paper distils on another real dataset, e.g. CIFAR-100 for CIFAR-10; noise is
its worst case, chosen here only because it needs no files; use `dataset:fashion-mnist` for MNIST-size
federations).

The student initialisation weights client models by sample count, as Algorithm 1 line 6 says; the
released code averages uniformly (`weighting = "uniform"`). Drop-worst (off by default) removes models
before both the averaging and the ensemble, as the paper says; its `weighted` variant weighs the
ensemble by validation accuracy, not the average. A group none of whose clients answered this round
starts from its previous model and is still distilled from this round's ensemble.

The student's BatchNorm layers keep the averaged clients' statistics by default (`student_bn =
"frozen"`): when they follow the distillation data (`"adapt"`, the released code) a student distilled on
noise loses what its clients learned (docs/results/tuning-history.md has the measurements).

Text (AG News, SST-2; token ids and a DistilBERT): `source = "holdout"` is the paper's protocol (Figure
3): with `val_fraction = 0.5` the clients fine-tune on half of the training set and the server distils
on the other half's texts without their labels, keeping `holdout_val_share` of them (default 2%: 1% of
the training set, the paper's SST-2 validation split) labelled for model selection. `dataset:<another
text dataset>` works too; noise and generators, which make images, are refused for text. The
student's dropout, like every random draw, follows the run seed (`global_rng` per step), so a resumed
run is exact.

Binary clients (FedDF Table 4): with `fuse_precision = "full"` a group of binary models (resnet8-binary)
starts from the average of their latent float weights and is distilled as the full-precision network
of those weights (real convolutions, models/binary.py `full_precision`); the result goes back as the
clients' latent weights, which they binarize again. Summaries then also report
`test_accuracy_full_precision` (the fused network) beside `test_accuracy` (as the clients compute).

Differential privacy: the ``dp_*`` options clip and noise each client's update exactly as for FedAvg
(user-level, at the client; see `fedistill.algorithms.classic.fedavg`). The ensemble the server distils is
then made of the noisy models, and each client's epsilon is in the run's summary.
"""

from __future__ import annotations

from fedistill.algorithms.base import TEXT_TASKS, Algorithm, ClientContext, register
from fedistill.algorithms.classic import FedAvgClient
from fedistill.algorithms.feddf.fusion import DistillationReport, distill, ensemble_loss
from fedistill.algorithms.feddf.options import DROP_WORST, LOSSES, FedDFOptions, group_names, group_of
from fedistill.algorithms.feddf.server import FedDFServer

__all__ = [
    "DROP_WORST",
    "LOSSES",
    "DistillationReport",
    "FedDFClient",
    "FedDFOptions",
    "FedDFServer",
    "distill",
    "ensemble_loss",
    "group_names",
    "group_of",
]


class FedDFClient(FedAvgClient):
    """Trains the received model of its group on private data and returns the trained parameters."""

    def __init__(self, ctx: ClientContext) -> None:
        super().__init__(ctx, model_name=group_of(ctx.options, ctx.config, ctx.client_id))


register(
    Algorithm(
        "feddf",
        "FedDF: average per architecture, then distil the ensemble of all client models on unlabeled data",
        FedDFClient,
        FedDFServer,
        FedDFOptions,
        tasks=("classification", *TEXT_TASKS),
    )
)
