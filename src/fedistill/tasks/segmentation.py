"""Segmentation tasks: a class per pixel (brain tumour) or an instance per pixel (nuclei).

Semantic segmentation trains with cross-entropy plus soft Dice (the paper's BraTS setting: "cross-entropy
loss and dice loss") and reports Dice, sensitivity, specificity and HD95 of the foreground per image.

Instance segmentation follows the paper's nuclei setting: the net predicts three classes per pixel
(background, nucleus inside, nucleus contour), trained with cross-entropy that gives the foreground and
the contours more weight than the background; instances come back from the prediction through one
post-processing function (`instances_from_three_class`: seeds where "inside" wins, grown over the
foreground), and the report adds object-level Dice and AJI (Eq. 12). Patched test sets are stitched back
into whole images first (`test_meta`), so every metric is a whole-image one, as the paper's.

FedIOD on these tasks compares per-pixel logits and conditions its generator on the label mask
(semantic) or the nuclei's foreground (instance).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from skimage.segmentation import find_boundaries

from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.errors import ConfigError
from fedistill.metrics.instances import aji, instances_from_three_class, object_dice
from fedistill.metrics.segmentation import SegmentationScores
from fedistill.metrics.thresholds import foreground_above
from fedistill.tasks.base import Inputs, Task
from fedistill.tasks.conditions import LabelMask, NucleiForeground
from fedistill.tasks.per_pixel_batches import per_pixel_batches

SEMANTIC_LOSSES = ("ce+dice", "ce")


def soft_dice_loss(logits: torch.Tensor, targets: torch.Tensor, eps: float = 1.0) -> torch.Tensor:
    """1 - mean over foreground classes of the soft Dice of softmax(logits) with the one-hot targets,
    pixels of the whole batch pooled (smoothed by `eps`, so an empty class gives a finite value)."""
    probs = logits.softmax(1)
    onehot = F.one_hot(targets, logits.shape[1]).permute(0, 3, 1, 2).to(probs)
    dims = (0, 2, 3)
    inter = (probs * onehot).sum(dims)
    sizes = probs.sum(dims) + onehot.sum(dims)
    dice = (2 * inter + eps) / (sizes + eps)
    return 1.0 - dice[1:].mean()


@dataclass(frozen=True)
class SemanticSegmentation(Task):
    """A class per pixel: cross-entropy plus soft Dice; Dice, sensitivity, specificity and HD95 of the
    foreground."""

    targets_are_classes = True

    name = "semantic-segmentation"
    target = "mask"
    headline = "dice"
    columns = (("dice", "Dice %", "percent"), ("hd95", "HD95 px", "float"))
    per_pixel = True
    condition = LabelMask()

    loss_kind: str = "ce+dice"  # ce+dice: cross-entropy + dice_weight * soft Dice | ce: cross-entropy alone
    dice_weight: float = 1.0  # the soft Dice term's weight beside the cross-entropy (0: cross-entropy alone)
    hd95: bool = True  # HD95 costs a distance transform per image; off for quick runs
    # two classes only: the foreground probability above which a pixel is foreground (0.5: argmax), or
    # "validation": the one of 0.05, 0.10, ..., 0.95 with the best pooled Dice on the sites' validation
    # splits, from the pixel counts they report after the last round (metrics/thresholds.py); the exported
    # model records the number, and predict applies it
    decision_threshold: float | str = 0.5

    def __post_init__(self) -> None:
        check_threshold(self.decision_threshold)
        if self.loss_kind not in SEMANTIC_LOSSES:
            raise ConfigError(
                f"task.loss_kind must be one of {', '.join(SEMANTIC_LOSSES)}, got {self.loss_kind!r}"
            )
        if not self.dice_weight >= 0:
            raise ConfigError(f"task.dice_weight must be >= 0, got {self.dice_weight!r}")

    def check(self, info: DatasetInfo, data: ImageSet, what: str) -> None:
        super().check(info, data, what)
        if self.targets_are_classes and info.num_classes < 2:
            raise ValueError(
                f"{what}: dataset {info.name!r} declares {info.num_classes} class per pixel, but a softmax "
                "segmentation counts the background as a class: a binary mask needs num_classes = 2 "
                "(background 0, foreground 1), not one sigmoid channel"
            )
        if self.decision_threshold != 0.5 and info.num_classes != 2:
            raise ConfigError(
                f"task.decision_threshold is for two classes; dataset {info.name!r} has {info.num_classes}"
            )

    def decode(self, outputs: torch.Tensor) -> torch.Tensor:
        """The class per pixel: argmax, or with a decision threshold other than 0.5 on two classes the
        foreground where its probability passes it."""
        threshold = self.decision_threshold
        if isinstance(threshold, str) or threshold == 0.5:  # "validation" before its choice: argmax
            return outputs.argmax(1)
        if outputs.shape[1] != 2:
            raise ConfigError(
                f"task.decision_threshold {threshold} is for two classes; this net outputs {outputs.shape[1]}"
            )
        return foreground_above(outputs, float(threshold)).to(torch.int64)

    def usual_augment(self, info: DatasetInfo) -> bool:
        return True  # the paper's segmentation nets train with random rotations and flips

    def batches(
        self,
        data: ImageSet,
        info: DatasetInfo,
        batch_size: int,
        *,
        shuffle: bool,
        generator: torch.Generator | None,
        augment: bool,
        drop_last: bool = False,
    ) -> Iterator[tuple[Inputs, torch.Tensor]]:
        for x, y, _ in per_pixel_batches(
            data, info, batch_size, shuffle=shuffle, generator=generator, augment=augment, drop_last=drop_last
        ):
            yield x, self.pixel_targets(y)

    def pixel_targets(self, y: torch.Tensor) -> torch.Tensor:
        """The per-pixel class the net learns from a stored target."""
        return y

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        ce = F.cross_entropy(outputs, targets)
        if self.loss_kind == "ce" or self.dice_weight == 0:
            return ce
        return ce + self.dice_weight * soft_dice_loss(outputs, targets)

    def column_counts(self, data: ImageSet, info: DatasetInfo) -> torch.Tensor:
        """Pixels per class the net learns (instance maps: background, inside, contour)."""
        classes = self.pixel_targets(data.y).reshape(-1).cpu()
        return torch.bincount(classes, minlength=self.distilled_columns(info)).to(torch.int64)

    def score(
        self,
        outputs: torch.Tensor,
        data: ImageSet,
        info: DatasetInfo,
        *,
        meta: Mapping[str, np.ndarray] | None = None,
        groups: Sequence[str] | None = None,
    ) -> dict[str, float]:
        """Dice, sensitivity, specificity and HD95 of the foreground (any class > 0) of per-pixel logits
        (N, C, H, W), per image, then averaged; per source too (`dice_<source>`) when `groups` name each
        sample's source."""
        if len(data) == 0:
            return self.empty_metrics()
        outputs = outputs.detach().cpu()
        loss = self.loss(outputs, self.pixel_targets(data.y)).item()
        scores = SegmentationScores(compute_hd95=self.hd95)
        truth, predicted = (data.y > 0).numpy(), (self.decode(outputs) > 0).numpy()
        scores.update(truth, predicted, _group_list(groups, len(data)))
        return _segmentation_metrics(scores, loss, len(data))


@dataclass(frozen=True)
class InstanceSegmentation(SemanticSegmentation):
    """An instance per pixel, learnt as three classes (background, inside, contour); adds object-level Dice
    and AJI."""

    targets_are_classes = False  # instance ids, any number of them

    name = "instance-segmentation"
    target = "instance map"
    condition = NucleiForeground()
    patchwise = True
    columns = (
        ("dice", "Dice %", "percent"),
        ("object_dice", "Obj-Dice %", "percent"),
        ("aji", "AJI %", "percent"),
        ("hd95", "HD95 px", "float"),
    )

    loss_kind: str = "ce"  # ce: weighted cross-entropy alone | ce+dice: + dice_weight * soft Dice
    foreground_weight: float = 2.0  # the paper weighs foreground and contours above the background
    contour_weight: float = 5.0  # the cross-entropy's weight on contour pixels (the background's is 1)

    def decode(self, outputs: torch.Tensor) -> torch.Tensor:
        """An instance id per pixel (0 the background) from the background/inside/contour scores, (N, H, W)
        int64 (no rows for no outputs)."""
        probs = outputs.detach().cpu().softmax(1).numpy()
        maps = [instances_from_three_class(p[0], p[1], p[2]) for p in probs]
        if not maps:
            return torch.zeros((0, *outputs.shape[2:]), dtype=torch.int64)
        return torch.from_numpy(np.stack(maps).astype(np.int64))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.decision_threshold != 0.5:
            raise ConfigError("task.decision_threshold is for two-class segmentation, not nuclei instances")
        if not (self.foreground_weight > 0 and self.contour_weight > 0):
            raise ConfigError("task.foreground_weight and task.contour_weight must be > 0")

    def output_channels(self, info: DatasetInfo) -> int:
        return 3  # background, nucleus inside, nucleus contour

    def pixel_targets(self, y: torch.Tensor) -> torch.Tensor:
        """Instance ids (B, H, W) -> 0 background, 1 inside, 2 contour (each instance's inner boundary, so
        touching nuclei stay apart)."""
        instances = y.cpu().numpy()
        boundaries = np.zeros(instances.shape, dtype=bool)  # stays (0, H, W) for no maps
        for i, m in enumerate(instances):
            boundaries[i] = find_boundaries(m, connectivity=1, mode="inner")
        contour = boundaries & (instances > 0)
        classes = (instances > 0).astype(np.int64)
        classes[contour] = 2
        return torch.from_numpy(classes).to(y.device)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        weight = torch.tensor([1.0, self.foreground_weight, self.contour_weight], dtype=outputs.dtype)
        ce = F.cross_entropy(outputs, targets, weight=weight.to(outputs.device))
        if self.loss_kind == "ce" or self.dice_weight == 0:
            return ce
        return ce + self.dice_weight * soft_dice_loss(outputs, targets)

    def score(
        self,
        outputs: torch.Tensor,
        data: ImageSet,
        info: DatasetInfo,
        *,
        meta: Mapping[str, np.ndarray] | None = None,
        groups: Sequence[str] | None = None,
    ) -> dict[str, float]:
        """Dice and HD95 of the foreground, object-level Dice and AJI of the instances, on whole images
        (patches stitched back when `meta` places them) or on the samples as they are."""
        if len(data) == 0:
            return self.empty_metrics()
        outputs = outputs.detach().cpu()
        loss = self.loss(outputs, self.pixel_targets(data.y)).item()
        probs = outputs.softmax(1).numpy()
        wholes = _whole_images(probs, data.y.numpy(), meta, _group_list(groups, len(data)))
        scores = SegmentationScores(compute_hd95=self.hd95)
        object_dices, ajis, by_group = [], [], {}
        for prob, truth, group in wholes:
            predicted = instances_from_three_class(prob[0], prob[1], prob[2])
            scores.update(truth > 0, predicted > 0, group)
            od, a = object_dice(truth, predicted), aji(truth, predicted)
            object_dices.append(od)
            ajis.append(a)
            if group is not None:
                by_group.setdefault(group, []).append((od, a))
        metrics = _segmentation_metrics(scores, loss, len(data))
        metrics |= {"object_dice": float(np.mean(object_dices)), "aji": float(np.mean(ajis))}
        for group, values in sorted(by_group.items()):
            metrics[f"object_dice_{group}"] = float(np.mean([v[0] for v in values]))
            metrics[f"aji_{group}"] = float(np.mean([v[1] for v in values]))
        return metrics


def check_threshold(value: object) -> None:
    """ConfigError unless `value` is a decision threshold: a number strictly between 0 and 1, or
    "validation"."""
    if value == "validation":
        return
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and 0 < value < 1):
        raise ConfigError(
            f'task.decision_threshold must be a number between 0 and 1 or "validation", got {value!r}'
        )


def _group_list(groups: Sequence[str] | None, n: int) -> list[str | None]:
    if groups is None:
        return [None] * n
    if len(groups) != n:
        raise ValueError(f"{len(groups)} group names for {n} samples")
    return [str(g) for g in groups]


def _segmentation_metrics(scores: SegmentationScores, loss: float, count: int) -> dict[str, float]:
    summary = scores.summary()
    metrics = {
        "dice": summary["mean_dice"],
        "pooled_dice": summary["pooled_dice"],
        "sensitivity": summary["mean_sensitivity"],
        "specificity": summary["mean_specificity"],
        "loss": loss,
        "count": count,
    }
    if "mean_hd95" in summary:
        metrics["hd95"] = summary["mean_hd95"]
    for group, values in scores.by_group().items():
        metrics[f"dice_{group}"] = values["mean_dice"]
        if "mean_hd95" in values:
            metrics[f"hd95_{group}"] = values["mean_hd95"]
    return metrics


def _whole_images(
    probs: np.ndarray, truth: np.ndarray, meta: Mapping[str, np.ndarray] | None, groups: list[str | None]
) -> list[tuple[np.ndarray, np.ndarray, str | None]]:
    """(probabilities (3, H, W), instance map (H, W), source) per whole image: patches stitched back when
    `meta` places them (`row`, `col`, `height`, `width`, `subject`, `image_instances`), else per sample."""
    needed = ("subject", "row", "col", "height", "width", "image_instances")
    if meta is None or any(key not in meta for key in needed) or len(meta["subject"]) != len(probs):
        return [(p, t, g) for p, t, g in zip(probs, truth, groups, strict=True)]
    from fedistill.data.medical.patches import stitch_by_meta, stitch_instances

    stitched = stitch_by_meta(probs, meta)
    instances = stitch_instances(np.asarray(meta["image_instances"]), meta)
    subjects = np.asarray(meta["subject"])
    first = {int(s): groups[int(np.flatnonzero(subjects == s)[0])] for s in np.unique(subjects)}
    return [(stitched[s], instances[s], first[s]) for s in sorted(stitched)]
