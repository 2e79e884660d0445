"""MRI reconstruction metrics as the fastMRI evaluation computes them: SSIM, PSNR, NMSE per volume.

FedIOD's Table 9 reports SSIM and PSNR of reconstructed brain MRI per test source (BraTS, fastMRI, IXI;
T1 and T2), following the fastMRI protocol, whose ``fastmri/evaluate.py`` scores one volume at a time:

- the data range is the *target volume's* maximum (``maxval = gt.max()``), not each slice's and not
  ``max - min``, so a slice's score depends on the brightest voxel of its volume;
- SSIM: scikit-image's ``structural_similarity`` on every 2-D slice with that data range and its defaults
  (7 x 7 uniform window, sample covariance, K1 = 0.01, K2 = 0.03), averaged over the slices;
- PSNR: ``10 log10(maxval² / MSE)`` with the MSE over the whole volume (scikit-image's
  ``peak_signal_noise_ratio``); identical volumes give ``inf`` (no cap), and so does any mean that
  includes one;
- NMSE: ``||target - prediction||² / ||target||²`` over the volume.

Dataset means are means over volumes (each volume counts once, however many slices it has).
:class:`ReconstructionScores` collects slices, groups them into volumes by ``(source, subject)`` and reports
those means per source. Slice order inside a volume does not matter for any of the three metrics.

These differ on purpose from :mod:`fedistill.metrics.image_quality`, which scores batches of images on a
fixed scale with a Gaussian-weighted SSIM (Wang et al. 2004) for attack and generation figures.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from fedistill.metrics.arrays import as_numpy
from fedistill.metrics.batch_names import Names, names_for_batch

__all__ = ["ReconstructionScores", "VolumeScores", "error_map", "nmse", "psnr", "ssim"]

Image = np.ndarray | torch.Tensor

SSIM_WINDOW = 7  # scikit-image's default, which fastMRI's evaluation uses


def ssim(target: Image, prediction: Image, data_range: float | None = None) -> float:
    """Mean SSIM over the slices of a volume ``(S, H, W)`` (or of one slice ``(H, W)``).

    ``data_range=None`` takes the target's maximum, which is fastMRI's convention only when the whole
    volume is passed; pass the volume's maximum explicitly when scoring a single slice.
    """
    volume_target, volume_prediction = _pair(target, prediction)
    peak = _data_range(volume_target, data_range)
    if min(volume_target.shape[-2:]) < SSIM_WINDOW:
        raise ValueError(
            f"slices of {volume_target.shape[-2:]} pixels are smaller than the "
            f"{SSIM_WINDOW}-pixel SSIM window"
        )
    slices = zip(
        volume_target.reshape(-1, *volume_target.shape[-2:]),
        volume_prediction.reshape(-1, *volume_target.shape[-2:]),
        strict=True,
    )
    return float(
        np.mean([structural_similarity(t, p, win_size=SSIM_WINDOW, data_range=peak) for t, p in slices])
    )


def psnr(target: Image, prediction: Image, data_range: float | None = None) -> float:
    """PSNR in dB over everything passed (a volume: fastMRI's volume PSNR); ``inf`` when identical."""
    volume_target, volume_prediction = _pair(target, prediction)
    peak = _data_range(volume_target, data_range)
    if np.array_equal(volume_target, volume_prediction):
        return math.inf
    return float(peak_signal_noise_ratio(volume_target, volume_prediction, data_range=peak))


def nmse(target: Image, prediction: Image) -> float:
    """Normalised squared error ``||target - prediction||² / ||target||²``."""
    volume_target, volume_prediction = _pair(target, prediction)
    energy = float(np.sum(volume_target**2))
    if energy == 0:
        raise ValueError("the target is all zero: NMSE normalises by its energy and is undefined")
    return float(np.sum((volume_target - volume_prediction) ** 2)) / energy


def error_map(target: Image, prediction: Image) -> np.ndarray:
    """Absolute difference ``|target - prediction|``, the error image shown next to reconstructions."""
    volume_target, volume_prediction = _pair(target, prediction)
    return np.abs(volume_target - volume_prediction)


@dataclass(frozen=True)
class VolumeScores:
    """One volume's scores; ``data_range`` is the target volume's maximum that SSIM and PSNR used."""

    source: str | None
    subject: Hashable
    slices: int
    data_range: float
    ssim: float
    psnr: float
    nmse: float


class ReconstructionScores:
    """Collects reconstructed slices, scores them per volume (fastMRI's protocol) and averages per source.

    Slices are kept until scored, since a volume's data range is known only once all its slices are in
    (about ``2 x 4`` bytes per pixel of every slice: float32 target and prediction).
    """

    def __init__(self) -> None:
        self._targets: dict[tuple[str | None, Hashable], list[np.ndarray]] = {}
        self._predictions: dict[tuple[str | None, Hashable], list[np.ndarray]] = {}
        self._scored: list[VolumeScores] | None = None

    def update(
        self,
        targets: Image,
        predictions: Image,
        subjects: Hashable | Sequence[Hashable] | np.ndarray | torch.Tensor,
        sources: Names = None,
    ) -> None:
        """Add slices ``(N, H, W)`` or ``(N, 1, H, W)`` with each slice's subject (volume id) and source.

        ``subjects`` gives one id per slice, or one id (a string or a number) for the whole batch.
        ``sources`` names the test set of each slice (one name for the whole batch, or one per slice;
        numbers are names too, turned into strings); volumes without a source count in :meth:`summary`
        but not in :meth:`by_source`.
        """
        target_batch, prediction_batch = (
            _slice_batch(targets, "targets"),
            _slice_batch(predictions, "predictions"),
        )
        if target_batch.shape != prediction_batch.shape:
            raise ValueError(
                f"targets and predictions differ in shape: {target_batch.shape} vs {prediction_batch.shape}"
            )
        size = target_batch.shape[0]
        subject_ids = _subjects_for_batch(subjects, size)
        if len(subject_ids) != size:
            raise ValueError(f"got {len(subject_ids)} subjects for a batch of {size} slices")
        source_names = names_for_batch(sources, size, "sources", "slices")
        for target, prediction, subject, source in zip(
            target_batch, prediction_batch, subject_ids, source_names, strict=True
        ):
            key = (source, subject)
            self._targets.setdefault(key, []).append(target.astype(np.float32))
            self._predictions.setdefault(key, []).append(prediction.astype(np.float32))
        self._scored = None

    def per_volume(self) -> list[VolumeScores]:
        """Every volume's scores, in the order their first slices came."""
        if self._scored is None:
            self._scored = [self._score(key) for key in self._targets]
        return self._scored

    def summary(self) -> dict[str, float]:
        """Means over all volumes: ``volumes``, ``slices``, ``ssim``, ``psnr``, ``nmse``."""
        volumes = self.per_volume()
        if not volumes:
            raise ValueError("no slices scored yet: call update() with at least one batch first")
        return _means(volumes)

    def by_source(self) -> dict[str, dict[str, float]]:
        """The :meth:`summary` of each source's volumes, sources in sorted order."""
        volumes = self.per_volume()
        sources = sorted({v.source for v in volumes if v.source is not None})
        return {source: _means([v for v in volumes if v.source == source]) for source in sources}

    def _score(self, key: tuple[str | None, Hashable]) -> VolumeScores:
        target = np.stack(self._targets[key]).astype(np.float64)
        prediction = np.stack(self._predictions[key]).astype(np.float64)
        source, subject = key
        try:
            peak = _data_range(target, None)
        except ValueError as error:
            raise ValueError(f"volume {subject!r} of source {source!r}: {error}") from None
        return VolumeScores(
            source=source,
            subject=subject,
            slices=target.shape[0],
            data_range=peak,
            ssim=ssim(target, prediction, peak),
            psnr=psnr(target, prediction, peak),
            nmse=nmse(target, prediction),
        )


def _subjects_for_batch(
    subjects: Hashable | Sequence[Hashable] | np.ndarray | torch.Tensor, size: int
) -> list[Hashable]:
    """One subject per slice; a single id (a string is one id, not a sequence of letters) for all of them."""
    if isinstance(subjects, np.ndarray | torch.Tensor):
        ids = subjects.tolist()
        return ids if isinstance(ids, list) else [ids] * size  # a 0-d array holds one id
    if isinstance(subjects, str | bytes) or not isinstance(subjects, Iterable):
        return [subjects] * size
    return list(subjects)


def _means(volumes: list[VolumeScores]) -> dict[str, float]:
    return {
        "volumes": float(len(volumes)),
        "slices": float(sum(v.slices for v in volumes)),
        "ssim": float(np.mean([v.ssim for v in volumes])),
        "psnr": float(np.mean([v.psnr for v in volumes])),
        "nmse": float(np.mean([v.nmse for v in volumes])),
    }


def _as_array(image: Image) -> np.ndarray:
    array = as_numpy(image)
    if not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array):
        raise ValueError(f"images must hold real numbers (magnitude images), got dtype {array.dtype}")
    return array.astype(np.float64)


def _pair(target: Image, prediction: Image) -> tuple[np.ndarray, np.ndarray]:
    volume_target, volume_prediction = _as_array(target), _as_array(prediction)
    if volume_target.shape != volume_prediction.shape:
        raise ValueError(
            f"target and prediction differ in shape: {volume_target.shape} vs {volume_prediction.shape}"
        )
    if volume_target.ndim not in (2, 3) or volume_target.size == 0:
        raise ValueError(f"expected a slice (H, W) or a volume (S, H, W), got shape {volume_target.shape}")
    if not (np.isfinite(volume_target).all() and np.isfinite(volume_prediction).all()):
        raise ValueError("target or prediction holds NaN or infinite values")
    return volume_target, volume_prediction


def _data_range(target: np.ndarray, data_range: float | None) -> float:
    peak = float(target.max()) if data_range is None else float(data_range)
    if not (peak > 0 and math.isfinite(peak)):
        raise ValueError(
            f"the data range must be a positive number, got {peak}"
            + (" (the target's maximum: is the target all zero or negative?)" if data_range is None else "")
        )
    return peak


def _slice_batch(images: Image, name: str) -> np.ndarray:
    batch = _as_array(images)
    if batch.ndim == 4 and batch.shape[1] == 1:
        batch = batch[:, 0]
    if batch.ndim != 3 or batch.shape[0] == 0:
        raise ValueError(
            f"{name} must be a batch of slices (N, H, W) or (N, 1, H, W), got shape {batch.shape}"
        )
    # Refused here, where the batch is known: at scoring time a NaN target reads as a bad data range.
    finite = np.isfinite(batch).reshape(batch.shape[0], -1).all(axis=1)
    if not finite.all():
        raise ValueError(
            f"{name} hold NaN or infinite values (first in slice {np.argmin(finite)} of the batch)"
        )
    return batch
