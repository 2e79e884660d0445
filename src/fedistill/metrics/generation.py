"""Quality and diversity measures for synthetic (generated) transfer data.

* `inception_score`: ``exp(E_x KL(p(y|x) || p(y)))`` from any classifier's probabilities.
* `adapted_inception_score`: FedIOD Table 7's variant, scored by the local models themselves.
* `class_coverage`: the predicted-class histogram, to warn when the generator collapses onto few classes.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["adapted_inception_score", "class_coverage", "inception_score"]


def inception_score(probs: torch.Tensor) -> float:
    """Inception score ``exp(mean_x KL(p(y|x) || p(y)))`` with ``p(y) = mean_x p(y|x)``.

    ``probs`` is ``(N, C)``, rows summing to 1 (within 1e-3, for rounded float32 or float16 softmax
    output, or within bfloat16's step of 2^-7 for bfloat16; anything else, logits for one, is refused).
    Computed in float64; ``0 log 0`` terms count as 0. It is 1 when every sample has the same
    prediction and ``C`` for confident predictions spread evenly over C classes.
    """
    if probs.dim() != 2 or probs.shape[0] == 0:
        raise ValueError(f"probs must have shape (N, C) with N >= 1, got {tuple(probs.shape)}")
    p = probs.detach().to(torch.float64)
    if bool((~(p >= 0)).any()):
        raise ValueError("probs must be non-negative (and not NaN)")
    row_sums = p.sum(dim=1)
    worst = int((row_sums - 1).abs().nan_to_num(math.inf).argmax())
    tolerance = max(1e-3, torch.finfo(probs.dtype).eps) if probs.is_floating_point() else 1e-3
    if not abs(float(row_sums[worst]) - 1) <= tolerance:
        raise ValueError(
            f"probs rows must sum to 1 (probabilities, e.g. a softmax), row {worst} sums to "
            f"{float(row_sums[worst]):.6g}"
        )
    marginal = p.mean(dim=0, keepdim=True)
    # xlogy(p, q) = p * log q, and 0 where p == 0; wherever p > 0 the marginal is > 0 too.
    kl = (torch.xlogy(p, p) - torch.xlogy(p, marginal)).sum(dim=1)
    return float(math.exp(kl.mean().item()))


def adapted_inception_score(teacher_logits: torch.Tensor) -> float:
    """FedIOD's adapted inception score (Table 7), from the local models' logits ``(K, N, C)``.

    The inception score computed with each local model's softmax probabilities in place of an ImageNet
    InceptionNet, averaged over the K local models.
    """
    if teacher_logits.dim() != 3 or teacher_logits.shape[0] == 0:
        raise ValueError(f"teacher logits must have shape (K, N, C), got {tuple(teacher_logits.shape)}")
    probs = torch.softmax(teacher_logits.detach().to(torch.float64), dim=-1)
    scores = [inception_score(p) for p in probs]
    return sum(scores) / len(scores)


def class_coverage(logits: torch.Tensor, *, min_share: float = 0.01) -> dict[str, Any]:
    """Histogram of the predicted classes (argmax of ``logits``, ``(N, C)``) and summaries of it.

    Returns a dict with:

    * ``"shares"``: list of C floats, the fraction of samples predicted as each class;
    * ``"classes_covered"``: how many classes have ``share >= min_share``;
    * ``"normalised_entropy"``: entropy of the shares / ``log C`` (1 = perfectly balanced, 0 = one class;
      1.0 when C == 1);
    * ``"max_share"``: the largest share.
    """
    if logits.dim() != 2 or logits.shape[0] == 0 or logits.shape[1] == 0:
        raise ValueError(f"logits must have shape (N, C) with N, C >= 1, got {tuple(logits.shape)}")
    num_samples, num_classes = logits.shape
    counts = torch.bincount(logits.detach().argmax(dim=1).cpu(), minlength=num_classes).tolist()
    shares = [count / num_samples for count in counts]
    ent = -sum(s * math.log(s) for s in shares if s > 0)
    normalised = ent / math.log(num_classes) if num_classes > 1 else 1.0
    return {
        "shares": shares,
        "classes_covered": sum(1 for s in shares if s >= min_share),
        "normalised_entropy": normalised,
        "max_share": max(shares),
    }
