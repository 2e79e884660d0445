"""Instance segmentation of nuclei: object-level Dice, AJI, and the post-processing that makes instances.

FedIOD's nuclei tables (TCGA/MoNuSeg, Cell17, TNBC) report object-level Dice and AJI of the instances that a
semantic U-Net's output becomes after post-processing. Instance maps are ``(H, W)`` integer arrays (numpy or
torch): 0 is background, every other value one instance; label values carry no meaning beyond identity.

- :func:`object_dice`: Chen et al. 2016 (DCAN) / Sirinukunwattana et al. 2017 (GlaS). Each object is
  matched to the object of the other map that it overlaps most (largest intersection; ties go to the
  partner giving the higher Dice), its Dice weighted by its share of its map's total object area; the
  truth-side and prediction-side sums are averaged. A prediction may serve several true objects.
- :func:`aji`: the paper's Eq. 12 (Kumar et al. 2017, as Vu et al. 2019 use it), with the paper's
  "sorted and non-repeated" matching: true instances are visited in ascending label order, each takes the
  still unused predicted instance of highest IoU (equal IoU: the larger intersection, then the lower
  label), and a predicted instance once taken is not offered again. Kumar et al.'s original lets one
  prediction match several true instances; where a prediction merges two nuclei the two rules differ (by
  a few AJI points on merged pairs), so these numbers compare with the paper's, not necessarily with
  MoNuSeg's. A true instance left with no overlapping unused prediction adds only its own area to the
  union; predicted instances never taken add their areas to the union. So AJI depends on how predictions
  are numbered only on an exact tie in IoU and intersection, and on the numbering of the truth when two
  true instances want the same prediction (a merge): the lower label wins it.
- :func:`instances_from_semantic`: foreground probability (or mask) to instances, by connected components
  or by a watershed of the distance transform (touching nuclei become separate instances).
- :func:`instances_from_three_class`: background / inside / contour probabilities (DCAN-style three-class
  output) to instances: pixels where "inside" wins are seeds, grown over the foreground.

Both metrics give 1 when neither map holds an instance and 0 when exactly one does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from scipy import ndimage
from skimage.feature import peak_local_max
from skimage.morphology import h_maxima
from skimage.segmentation import expand_labels, relabel_sequential, watershed

from fedistill.metrics.arrays import as_numpy

__all__ = ["aji", "instances_from_semantic", "instances_from_three_class", "object_dice"]

InstanceMap = np.ndarray | torch.Tensor
ProbabilityMap = np.ndarray | torch.Tensor


def object_dice(true_instances: InstanceMap, pred_instances: InstanceMap) -> float:
    """Object-level Dice: area-weighted Dice of every object with its best-overlapping partner, both ways."""
    overlap = _Overlap.of(true_instances, pred_instances)
    if overlap.true_area.size == 0 and overlap.pred_area.size == 0:
        return 1.0
    if overlap.true_area.size == 0 or overlap.pred_area.size == 0:
        return 0.0
    truth_side = _weighted_best_dice(overlap.intersection, overlap.true_area, overlap.pred_area)
    prediction_side = _weighted_best_dice(overlap.intersection.T, overlap.pred_area, overlap.true_area)
    return (truth_side + prediction_side) / 2


def aji(true_instances: InstanceMap, pred_instances: InstanceMap) -> float:
    """Aggregated Jaccard Index, Eq. 12: matched intersections over matched unions plus unused predictions.

    See the module docstring for the matching order ("sorted and non-repeated").
    """
    overlap = _Overlap.of(true_instances, pred_instances)
    n_true, n_pred = overlap.intersection.shape
    if n_true == 0 and n_pred == 0:
        return 1.0
    unused = np.ones(n_pred, dtype=bool)
    intersections = unions = 0
    for i in range(n_true):  # ascending true labels
        overlaps = overlap.intersection[i]
        candidates = unused & (overlaps > 0)
        if not candidates.any():
            unions += int(overlap.true_area[i])
            continue
        union_row = overlap.true_area[i] + overlap.pred_area - overlaps
        iou = np.where(candidates, overlaps / union_row, -1.0)
        tied = np.flatnonzero(iou == iou.max())
        j = tied[np.argmax(overlaps[tied])]  # equal IoU: the larger intersection, then the lower label
        intersections += int(overlaps[j])
        unions += int(union_row[j])
        unused[j] = False
    unions += int(overlap.pred_area[unused].sum())
    return intersections / unions


def instances_from_semantic(
    probabilities_or_mask: ProbabilityMap,
    *,
    threshold: float = 0.5,
    method: Literal["watershed", "components"] = "watershed",
    min_distance: int = 3,
    h: float | None = None,
    min_size: int = 0,
    connectivity: Literal[1, 2] = 2,
) -> np.ndarray:
    """Instances from a foreground probability map ``(H, W)`` (or a boolean mask), labelled 1..n.

    - ``threshold``: foreground is ``probability > threshold`` (ignored for a boolean mask);
    - ``method="components"``: each connected foreground region is one instance (``connectivity`` 1 for
      4-neighbours, 2 for 8-neighbours), so touching nuclei stay merged;
    - ``method="watershed"``: markers are the maxima of the distance to the background, found by
      ``peak_local_max`` (at least ``min_distance`` pixels apart) or, with ``h``, the h-maxima (maxima
      rising at least ``h`` pixels above their surroundings, robust to plateaus); the watershed of the
      negated distance, within the foreground, splits touching nuclei at their neck. A foreground region
      without a marker is kept as one instance;
    - ``min_size``: instances of fewer pixels are removed (to background).
    """
    foreground = _foreground(probabilities_or_mask, threshold)
    structure = ndimage.generate_binary_structure(2, _check_connectivity(connectivity))
    components, _ = ndimage.label(foreground, structure=structure)
    if method == "components":
        instances = components
    elif method == "watershed":
        distance = ndimage.distance_transform_edt(foreground)
        if h is not None:
            if not h > 0:
                raise ValueError(f"h must be > 0 (pixels of distance), got {h}")
            peaks = h_maxima(distance, h).astype(bool)
        else:
            if min_distance < 1:
                raise ValueError(f"min_distance must be >= 1 pixel, got {min_distance}")
            peaks = np.zeros_like(foreground)
            coordinates = peak_local_max(
                distance, min_distance=min_distance, labels=components, exclude_border=False
            )
            peaks[tuple(coordinates.T)] = True
        markers, _ = ndimage.label(peaks & foreground, structure=structure)
        instances = watershed(-distance, markers, mask=foreground, connectivity=connectivity)
        instances = _keep_unmarked_regions(instances, components)
    else:
        raise ValueError(f"method must be 'watershed' or 'components', got {method!r}")
    return _remove_small(instances, min_size)


def instances_from_three_class(
    prob_background: ProbabilityMap,
    prob_inside: ProbabilityMap,
    prob_contour: ProbabilityMap,
    *,
    grow: Literal["watershed", "dilation"] = "watershed",
    dilation_radius: int = 2,
    min_seed_size: int = 0,
    min_size: int = 0,
) -> np.ndarray:
    """Instances from a three-class (background, inside, contour) output, each map ``(H, W)``, labelled 1..n.

    Seeds are the 8-connected regions where "inside" beats both contour and background (inside minus
    contour: the contour class is what keeps touching nuclei apart); seeds below ``min_seed_size`` pixels
    are dropped as noise. The foreground is where background does not win. Seeds then grow over the
    foreground, either by a watershed of ``contour - inside`` (instances meet on the predicted contours) or,
    with ``grow="dilation"``, by ``dilation_radius`` pixels without merging (about the contour's width, as
    in DCAN-style pipelines). Foreground that no seed reaches is dropped: a nucleus needs an inside.
    ``min_size`` removes small final instances.
    """
    background = _probability_map(prob_background, "prob_background")
    inside = _probability_map(prob_inside, "prob_inside")
    contour = _probability_map(prob_contour, "prob_contour")
    if not background.shape == inside.shape == contour.shape:
        raise ValueError(
            "the three probability maps differ in shape: "
            f"background {background.shape}, inside {inside.shape}, contour {contour.shape}"
        )
    winner = np.argmax(np.stack([background, inside, contour]), axis=0)
    foreground = winner != 0
    seeds, _ = ndimage.label(winner == 1, structure=ndimage.generate_binary_structure(2, 2))
    seeds = _remove_small(seeds, min_seed_size)
    if grow == "watershed":
        instances = watershed(contour - inside, seeds, mask=foreground)
    elif grow == "dilation":
        if dilation_radius < 0:
            raise ValueError(f"dilation_radius must be >= 0 pixels, got {dilation_radius}")
        instances = np.where(foreground, expand_labels(seeds, distance=dilation_radius), 0)
    else:
        raise ValueError(f"grow must be 'watershed' or 'dilation', got {grow!r}")
    return _remove_small(instances, min_size)


@dataclass(frozen=True)
class _Overlap:
    """Pixel counts of every (true, predicted) instance pair, instances in ascending label order."""

    intersection: np.ndarray  # (n_true, n_pred)
    true_area: np.ndarray  # (n_true,)
    pred_area: np.ndarray  # (n_pred,)

    @classmethod
    def of(cls, true_instances: InstanceMap, pred_instances: InstanceMap) -> _Overlap:
        truth = _instance_map(true_instances, "true_instances")
        prediction = _instance_map(pred_instances, "pred_instances")
        if truth.shape != prediction.shape:
            raise ValueError(
                f"instance maps differ in shape: truth {truth.shape}, prediction {prediction.shape}"
            )
        true_index, n_true = _dense_index(truth.ravel())
        pred_index, n_pred = _dense_index(prediction.ravel())
        counts = np.bincount(true_index * (n_pred + 1) + pred_index, minlength=(n_true + 1) * (n_pred + 1))
        counts = counts.reshape(n_true + 1, n_pred + 1)  # row / column 0: background
        return cls(counts[1:, 1:], counts[1:].sum(axis=1), counts[:, 1:].sum(axis=0))


def _dense_index(labels: np.ndarray) -> tuple[np.ndarray, int]:
    """Labels mapped to 0 (background) and 1..n in ascending label order."""
    values, index = np.unique(labels, return_inverse=True)
    if values[0] != 0:
        index = index + 1
    return index.astype(np.int64), int(np.count_nonzero(values))


def _weighted_best_dice(intersection: np.ndarray, own_area: np.ndarray, other_area: np.ndarray) -> float:
    best_overlap = intersection.max(axis=1)
    dice = 2 * intersection / (own_area[:, None] + other_area[None, :])
    best_dice = np.where(intersection == best_overlap[:, None], dice, -1.0).max(axis=1)
    best_dice[best_overlap == 0] = 0.0
    return float((own_area / own_area.sum() * best_dice).sum())


def _instance_map(instances: InstanceMap, name: str) -> np.ndarray:
    array = as_numpy(instances)
    if array.ndim != 2 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty (H, W) map of instance labels, got shape {array.shape}")
    if array.dtype == bool:
        return array.astype(np.int64)
    floating = np.issubdtype(array.dtype, np.floating)
    if floating and not np.isfinite(array).all():
        raise ValueError(f"{name} must hold finite integer instance labels, found NaN or infinite values")
    integral = np.issubdtype(array.dtype, np.integer) or (floating and np.array_equal(array, np.round(array)))
    if not integral:
        raise ValueError(f"{name} must hold integer instance labels, got {array.dtype} values that are not")
    if array.size and array.min() < 0:
        raise ValueError(f"{name} must hold labels >= 0 (0 = background), found {array.min()}")
    # Larger labels would wrap to negative ones (or garbage) in int64 and scramble the background.
    if array.size and (float(array.max()) >= 2.0**63 if floating else array.max() > np.iinfo(np.int64).max):
        raise ValueError(f"{name} holds a label ({array.max()}) too large for int64")
    return array.astype(np.int64)


def _probability_map(values: ProbabilityMap, name: str) -> np.ndarray:
    array = as_numpy(values)
    if array.ndim != 2:
        raise ValueError(f"{name} must be an (H, W) map, got shape {array.shape}")
    array = array.astype(np.float64)
    if not np.isfinite(array).all():
        raise ValueError(f"{name} holds NaN or infinite values")
    return array


def _foreground(probabilities_or_mask: ProbabilityMap, threshold: float) -> np.ndarray:
    values = probabilities_or_mask
    array = as_numpy(values)
    if array.dtype == bool:
        if array.ndim != 2:
            raise ValueError(f"the mask must be (H, W), got shape {array.shape}")
        return array
    return _probability_map(array, "probabilities_or_mask") > threshold


def _check_connectivity(connectivity: int) -> int:
    if connectivity not in (1, 2):
        raise ValueError(f"connectivity must be 1 (4-neighbours) or 2 (8-neighbours), got {connectivity}")
    return connectivity


def _keep_unmarked_regions(instances: np.ndarray, components: np.ndarray) -> np.ndarray:
    """Foreground regions that got no marker become instances of their own instead of vanishing."""
    missed = (components > 0) & (instances == 0)
    if missed.any():
        instances = instances.copy()
        instances[missed] = components[missed] + instances.max()
    return instances


def _remove_small(instances: np.ndarray, min_size: int) -> np.ndarray:
    if min_size < 0:
        raise ValueError(f"sizes must be >= 0 pixels, got {min_size}")
    if min_size > 0:
        areas = np.bincount(instances.ravel())
        small = areas < min_size
        small[0] = False
        instances = np.where(small[instances], 0, instances)
    return relabel_sequential(instances.astype(np.int64))[0]
