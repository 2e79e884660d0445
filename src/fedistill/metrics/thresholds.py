"""A binary segmentation's decision threshold chosen from pixel counts.

A two-class net's argmax calls a pixel foreground where its foreground probability passes 0.5. A
distilled student trained on soft targets can rank the foreground well and still stay below 0.5 on it;
`decision_threshold = "validation"` (the `[task]` table) then picks the threshold on the sites'
validation splits. Each site counts, at every threshold of `THRESHOLDS`, the true-positive,
false-positive and false-negative pixels of its split (`threshold_counts`: a few numbers, no image);
the server adds them up and takes the threshold whose pooled Dice 2 TP / (2 TP + FP + FN) is highest
(`chosen_threshold`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

#: The thresholds a site counts at: 0.05, 0.10, ..., 0.95 (0.5 among them).
THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(1, 20))


def logit_margin(threshold: float) -> float:
    """The logit difference z_1 - z_0 at which softmax's p_1 equals `threshold`: log(t / (1 - t))."""
    return math.log(threshold / (1.0 - threshold))


def foreground_above(outputs: torch.Tensor, threshold: float) -> torch.Tensor:
    """Where two-class per-pixel logits (N, 2, H, W) give the foreground a probability above `threshold`:
    softmax's p_1 > t is z_1 - z_0 > `logit_margin(t)`, so at 0.5 it is argmax's answer, ties included."""
    return outputs[:, 1] - outputs[:, 0] > logit_margin(threshold)


def threshold_counts(outputs: torch.Tensor, truth: torch.Tensor) -> np.ndarray:
    """(3, len(THRESHOLDS)) int64: the true-positive, false-positive and false-negative pixels of two-class
    logits (N, 2, H, W) against the masks `truth` (N, H, W), foreground any class > 0, at each threshold."""
    fore = (truth > 0).to(outputs.device)
    counts = np.zeros((3, len(THRESHOLDS)), dtype=np.int64)
    for i, t in enumerate(THRESHOLDS):
        called = foreground_above(outputs, t)
        counts[0, i] = int((called & fore).sum())
        counts[1, i] = int((called & ~fore).sum())
        counts[2, i] = int((~called & fore).sum())
    return counts


def chosen_threshold(counts: np.ndarray) -> float:
    """The threshold of THRESHOLDS whose pooled Dice over `counts` (the sites' sum) is highest, the one
    nearest 0.5 among equals; 0.5 when no pixel was foreground in truth or prediction at any."""
    tp, fp, fn = (np.asarray(counts, dtype=np.float64)[k] for k in range(3))
    denominator = 2 * tp + fp + fn
    if not denominator.any():
        return 0.5
    dice = np.where(denominator > 0, 2 * tp / np.maximum(denominator, 1), 0.0)
    best = [t for t, d in zip(THRESHOLDS, dice, strict=True) if d == dice.max()]
    return min(best, key=lambda t: (abs(t - 0.5), t))
