"""Binary segmentation metrics per image (Dice, sensitivity, specificity, HD95) and their aggregation.

FedIOD's brain-tumour table (BraTS whole tumour) reports Dice, sensitivity, specificity and HD95; its nuclei
tables report Dice and HD95 of the foreground next to the instance metrics of
:mod:`fedistill.metrics.instances`. Masks are ``(H, W)`` (or ``(D, H, W)``) numpy arrays or torch tensors
holding booleans or 0/1; probabilities must be thresholded first, so that a metric never guesses a threshold.

Who computes what:

- Dice, sensitivity, specificity: pixel counts with numpy, exactly the paper's formulas (appendix,
  "Magnetic resonance image segmentation").
- HD95: MONAI's ``compute_hausdorff_distance(..., percentile=95)``. Boundaries are the mask pixels with a
  4-neighbour (a voxel with a 6-neighbour, in a volume) outside the mask or outside the image (mask XOR its
  binary erosion); distances are Euclidean, in pixels unless ``spacing`` is given. MONAI takes the 95th
  percentile of each directed set of boundary distances (truth to prediction, prediction to truth) and
  reports the larger one, which is the paper's Eq. 13 with each ``sup`` replaced by a 95 % quantile
  (medpy's ``hd95`` instead pools both directions before taking the percentile: on random blob pairs it
  came out lower on nearly every pair, by a median of about 4 %, and by far more where a small false
  positive lies far off, whose distances fill one direction's top 5 % but not the pooled one's; on a
  few pairs a little higher, the percentile interpolating between few boundary distances).

Empty-mask conventions (those of the BraTS evaluation, so that every image gets a number and means are
over all images):

- truth and prediction both empty: Dice 1, HD95 0 (nothing to find, nothing found);
- exactly one empty: Dice 0, HD95 = the image diagonal ``sqrt(sum((shape * spacing)²))``, the largest
  distance possible inside the image (BraTS's 373.13 is the diagonal of its 240 x 240 x 155 volume).
  ``empty_hd95="nan"`` gives NaN instead, and the aggregates then leave those images out of the HD95 mean
  (and say how many they kept);
- sensitivity with an empty truth is 1 (no foreground pixel can be missed; false positives show in Dice and
  specificity), specificity with an all-foreground truth is 1 likewise. These are the limits of the
  ``(x + eps) / (y + eps)`` smoothing common in released evaluation code.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from fedistill.metrics.arrays import as_numpy
from fedistill.metrics.batch_names import Names, names_for_batch

__all__ = ["SegmentationScores", "dice", "hd95", "sensitivity", "specificity"]

Mask = np.ndarray | torch.Tensor
EmptyHD95 = Literal["diagonal", "nan"]


def dice(truth: Mask, prediction: Mask) -> float:
    """``2 |y ∩ ŷ| / (|y| + |ŷ|)``; 1 when both masks are empty."""
    tp, fp, fn, _ = _confusion(*_binary_pair(truth, prediction))
    return _dice_from_counts(tp, fp, fn)


def sensitivity(truth: Mask, prediction: Mask) -> float:
    """True-positive rate ``|y ∩ ŷ| / |y|``; 1 when the truth is empty (nothing could be missed)."""
    tp, _, fn, _ = _confusion(*_binary_pair(truth, prediction))
    return _ratio_or_one(tp, tp + fn)


def specificity(truth: Mask, prediction: Mask) -> float:
    """True-negative rate ``|(1-y) ∩ (1-ŷ)| / |1-y|``; 1 when the truth covers the whole image."""
    _, fp, _, tn = _confusion(*_binary_pair(truth, prediction))
    return _ratio_or_one(tn, tn + fp)


def hd95(
    truth: Mask,
    prediction: Mask,
    *,
    spacing: float | Sequence[float] | None = None,
    empty_hd95: EmptyHD95 = "diagonal",
) -> float:
    """95 % Hausdorff distance between the boundaries of two masks, in pixels (or ``spacing`` units).

    Computed by MONAI (max of the two directed 95th percentiles); see the module docstring for the
    boundary definition and for what empty masks give.
    """
    y, y_hat = _binary_pair(truth, prediction)
    _check_empty_hd95(empty_hd95)
    spacing_per_axis = _spacing(spacing, y.ndim)
    truth_empty, prediction_empty = not y.any(), not y_hat.any()
    if truth_empty and prediction_empty:
        return 0.0
    if truth_empty or prediction_empty:
        if empty_hd95 == "nan":
            return math.nan
        return math.sqrt(sum((n * s) ** 2 for n, s in zip(y.shape, spacing_per_axis, strict=True)))
    # MONAI costs seconds to import; only HD95 needs it.
    from monai.metrics import compute_hausdorff_distance

    with warnings.catch_warnings():
        # MONAI 1.6 trips over its own deprecated argument inside this call; nothing for callers to change.
        warnings.filterwarnings("ignore", message=".*always_return_as_numpy.*", category=FutureWarning)
        distance = compute_hausdorff_distance(
            torch.from_numpy(y_hat)[None, None],
            torch.from_numpy(y)[None, None],
            include_background=True,
            distance_metric="euclidean",
            percentile=95,
            spacing=list(spacing_per_axis),
        )
    return float(distance.reshape(-1)[0])


class SegmentationScores:
    """Scores of many images, fed a batch at a time, summarised over all images and per group (site).

    Two Dice summaries, because papers use both and they differ a lot when many images hold little or no
    foreground (tumour-free BraTS slices):

    - ``mean_dice``: Dice per image, then the mean over images (the paper's per-slice protocol);
    - ``pooled_dice``: one Dice over all pixels of all images (true positives etc. summed first).

    Sensitivity, specificity and HD95 are always means of per-image values.
    """

    def __init__(
        self,
        *,
        compute_hd95: bool = True,
        spacing: float | Sequence[float] | None = None,
        empty_hd95: EmptyHD95 = "diagonal",
    ) -> None:
        _check_empty_hd95(empty_hd95)
        self.compute_hd95 = compute_hd95
        self.spacing = spacing
        self.empty_hd95: EmptyHD95 = empty_hd95
        self._counts: list[tuple[int, int, int, int]] = []  # (tp, fp, fn, tn) per image
        self._hd95: list[float] = []
        self._groups: list[str | None] = []

    def update(self, truth: Mask, prediction: Mask, groups: Names = None) -> None:
        """Add a batch: masks ``(N, H, W)`` or ``(N, 1, H, W)`` (one ``(H, W)`` image is a batch of one).

        ``groups`` names each image's site (one name for the whole batch, or one per image; numbers are
        names too, turned into strings: site 3 is group ``"3"``); images without a group count in
        :meth:`summary` but not in :meth:`by_group`.
        """
        truth_batch, prediction_batch = _binary_batch(truth, "truth"), _binary_batch(prediction, "prediction")
        if truth_batch.shape != prediction_batch.shape:
            raise ValueError(
                f"truth and prediction batches differ in shape: "
                f"{truth_batch.shape} vs {prediction_batch.shape}"
            )
        batch_groups = names_for_batch(groups, truth_batch.shape[0], "group names", "images")
        for y, y_hat, group in zip(truth_batch, prediction_batch, batch_groups, strict=True):
            self._counts.append(_confusion(y, y_hat))
            if self.compute_hd95:
                self._hd95.append(hd95(y, y_hat, spacing=self.spacing, empty_hd95=self.empty_hd95))
            self._groups.append(group)

    def __len__(self) -> int:
        return len(self._counts)

    def per_image(self) -> dict[str, np.ndarray]:
        """Every image's scores, in the order they came: dice, sensitivity, specificity (and hd95)."""
        scores = {
            "dice": np.array([_dice_from_counts(tp, fp, fn) for tp, fp, fn, _ in self._counts]),
            "sensitivity": np.array([_ratio_or_one(tp, tp + fn) for tp, _, fn, _ in self._counts]),
            "specificity": np.array([_ratio_or_one(tn, tn + fp) for _, fp, _, tn in self._counts]),
        }
        if self.compute_hd95:
            scores["hd95"] = np.array(self._hd95)
        return scores

    def summary(self) -> dict[str, float]:
        """Means over all images (see the class docstring for ``mean_dice`` vs ``pooled_dice``)."""
        if not self._counts:
            raise ValueError("no images scored yet: call update() with at least one batch first")
        return self._summarise(np.ones(len(self._counts), dtype=bool))

    def by_group(self) -> dict[str, dict[str, float]]:
        """The :meth:`summary` of each group's images, groups in sorted order."""
        named = {g for g in self._groups if g is not None}
        return {
            name: self._summarise(np.array([g == name for g in self._groups], dtype=bool))
            for name in sorted(named)
        }

    def _summarise(self, selected: np.ndarray) -> dict[str, float]:
        counts = np.array(self._counts, dtype=np.int64)[selected]
        tp, fp, fn, _ = counts.sum(axis=0)
        per_image = {name: values[selected] for name, values in self.per_image().items()}
        result = {
            "images": float(selected.sum()),
            "mean_dice": float(per_image["dice"].mean()),
            "pooled_dice": _dice_from_counts(int(tp), int(fp), int(fn)),
            "mean_sensitivity": float(per_image["sensitivity"].mean()),
            "mean_specificity": float(per_image["specificity"].mean()),
        }
        if self.compute_hd95:
            distances = per_image["hd95"]
            defined = ~np.isnan(distances)
            result["mean_hd95"] = float(distances[defined].mean()) if defined.any() else math.nan
            result["hd95_images"] = float(defined.sum())
        return result


def _confusion(y: np.ndarray, y_hat: np.ndarray) -> tuple[int, int, int, int]:
    tp = int(np.count_nonzero(y & y_hat))
    fp = int(np.count_nonzero(y_hat)) - tp
    fn = int(np.count_nonzero(y)) - tp
    tn = y.size - tp - fp - fn
    return tp, fp, fn, tn


def _dice_from_counts(tp: int, fp: int, fn: int) -> float:
    return _ratio_or_one(2 * tp, 2 * tp + fp + fn)


def _ratio_or_one(numerator: int, denominator: int) -> float:
    return 1.0 if denominator == 0 else numerator / denominator


def _as_binary(mask: Mask, name: str) -> np.ndarray:
    """A boolean numpy copy of a mask, refusing anything but booleans and 0/1 values."""
    array = as_numpy(mask)
    if array.dtype == bool:
        return array
    if not (np.issubdtype(array.dtype, np.number) and np.isin(array, (0, 1)).all()):
        shown = np.unique(array)[:6] if np.issubdtype(array.dtype, np.number) else array.dtype
        raise ValueError(
            f"{name} must be a binary mask (booleans or 0/1), got values {shown}; "
            "threshold probabilities first, e.g. probabilities > 0.5"
        )
    return array.astype(bool)


def _binary_pair(truth: Mask, prediction: Mask) -> tuple[np.ndarray, np.ndarray]:
    y, y_hat = _as_binary(truth, "truth"), _as_binary(prediction, "prediction")
    if y.shape != y_hat.shape:
        raise ValueError(f"truth and prediction differ in shape: {y.shape} vs {y_hat.shape}")
    if y.ndim not in (2, 3) or y.size == 0:
        raise ValueError(f"masks must be non-empty (H, W) images or (D, H, W) volumes, got shape {y.shape}")
    return y, y_hat


def _binary_batch(masks: Mask, name: str) -> np.ndarray:
    batch = _as_binary(masks, name)
    if batch.ndim == 2:
        batch = batch[None]
    elif batch.ndim == 4 and batch.shape[1] == 1:
        batch = batch[:, 0]
    if batch.ndim != 3 or batch.shape[0] == 0:
        raise ValueError(
            f"{name} must be a batch (N, H, W) or (N, 1, H, W) of masks, got shape {batch.shape}"
        )
    return batch


def _spacing(spacing: float | Sequence[float] | None, ndim: int) -> tuple[float, ...]:
    if spacing is None:
        values = (1.0,) * ndim
    elif isinstance(spacing, numbers.Real):  # numpy scalars too (a header's np.float32 voxel size)
        values = (float(spacing),) * ndim
    else:
        values = tuple(float(s) for s in spacing)
    if len(values) != ndim or not all(s > 0 and math.isfinite(s) for s in values):
        raise ValueError(f"spacing must be one positive number or one per axis ({ndim}), got {spacing}")
    return values


def _check_empty_hd95(empty_hd95: str) -> None:
    if empty_hd95 not in ("diagonal", "nan"):
        raise ValueError(f"empty_hd95 must be 'diagonal' or 'nan', got {empty_hd95!r}")
