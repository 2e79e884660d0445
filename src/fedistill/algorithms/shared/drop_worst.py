"""FedDF's "drop-worst" filter (paper section 4.2, released code `server_teaching_scheme=drop_worst`):
received models that predict at random on the server's validation split are left out of the
average and the ensemble. Shared by FedDF and FedAvg (`fedavg.drop_worst`).

The rule, as in the released code (`noise_knowledge_transfer._get_client_weights` and
`aggregation/utils.detect_outlier_and_remain_v1`):

1. a model below 1.2 x the random-guess accuracy (1.2 / num_classes) is dropped;
2. only if none was dropped that way: leave out the single best accuracy, take the mean mu and the
   (population) standard deviation sigma of the others, and drop every model below mu - 1.5 sigma;
3. the kept models get uniform weights, or weights proportional to their validation accuracy
   (`weighted`).

The released code's plain FedAvg applies step 1 only; here FedAvg uses the same full rule.
If every model would be dropped, none is (there would be nothing to average) and a warning is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.transforms import batches

log = logging.getLogger(__name__)

RANDOM_GUESS_FACTOR = 1.2
OUTLIER_STDS = 1.5


def drop_worst_weights(
    accuracies: Sequence[float], num_classes: int, *, weighted: bool = False
) -> list[float]:
    """Ensemble weights for models with these validation accuracies: 0 for a dropped model."""
    acc = np.asarray(accuracies, dtype=np.float64)
    if acc.size == 0:
        return []
    keep = acc >= RANDOM_GUESS_FACTOR / num_classes
    if keep.all() and acc.size > 1:
        rest = np.delete(acc, int(np.argmax(acc)))
        keep = acc >= rest.mean() - OUTLIER_STDS * rest.std()
    if not keep.any():
        log.warning(
            "drop-worst: every received model is below %.1fx random guess on the validation split "
            "(accuracies %s); keeping them all",
            RANDOM_GUESS_FACTOR,
            np.round(acc, 4).tolist(),
        )
        keep = np.ones_like(keep)
    raw = np.where(keep, acc if weighted else 1.0, 0.0)
    if raw.sum() <= 0:  # weighted, and every kept model has accuracy 0
        raw = keep.astype(np.float64)
    return (raw / raw.sum()).tolist()


@torch.no_grad()
def predict_logits(
    model: nn.Module, data: ImageSet, info: DatasetInfo, batch_size: int = 512
) -> torch.Tensor:
    """The model's logits (N, num_classes) on `data`, in eval mode (the training flag is restored)."""
    was_training = model.training
    model.eval()
    out = [model(x) for x, _ in batches(data, info, batch_size, shuffle=False, generator=None, augment=False)]
    model.train(was_training)
    return torch.cat(out) if out else torch.empty(0)


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The share of rows whose highest logit is the label; NaN for no rows."""
    if not len(labels):
        return float("nan")
    return float((logits.argmax(-1) == labels.to(logits.device)).float().mean())
