"""Image similarity for reconstructions: PSNR, SSIM, order-free matching, and image grids.

Used to score gradient-inversion attacks (FedMD-CG's Table 2 reports DLG PSNR) and other images on a fixed
scale. FedIOD's MRI reconstruction is not scored here: its SSIM and PSNR follow fastMRI's per-volume
evaluation (a uniform 7 x 7 window, the target volume's maximum as data range) in
:mod:`fedistill.metrics.reconstruction`. Images are batches ``(B, C, H, W)`` (a single
``(C, H, W)`` image counts as ``B = 1``), torch tensors or numpy arrays, on a common scale whose width is
``data_range`` (1.0 for images in [0, 1]; denormalise model inputs first).

PSNR is computed with torch and SSIM with ``scipy.ndimage``; both follow scikit-image's conventions
(``peak_signal_noise_ratio``; ``structural_similarity`` with ``gaussian_weights=True``,
``use_sample_covariance=False``, ``sigma=1.5``, i.e. Wang et al. 2004), so values are comparable with
papers that used it, without depending on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from scipy import ndimage
from scipy.optimize import linear_sum_assignment

__all__ = ["best_match_psnr", "psnr", "save_image_grid", "ssim"]

ArrayLike = torch.Tensor | np.ndarray

_TRUNCATE = 3.5  # scikit-image's Gaussian window: radius int(3.5 * sigma + 0.5), 11 x 11 for sigma 1.5


def psnr(reference: ArrayLike, reconstruction: ArrayLike, data_range: float = 1.0) -> torch.Tensor:
    """Peak signal-to-noise ratio ``10 log10(data_range² / MSE)`` per image, shape ``(B,)``, in dB.

    Identical images give ``inf``. Average the result over the batch to report a mean PSNR as the papers do.
    """
    ref, rec = _pair(reference, reconstruction)
    _check_range(data_range)
    return _psnr_from_mse(((ref - rec) ** 2).flatten(1).mean(dim=1), data_range)


def ssim(
    reference: ArrayLike,
    reconstruction: ArrayLike,
    data_range: float = 1.0,
    *,
    sigma: float = 1.5,
    k1: float = 0.01,
    k2: float = 0.03,
) -> torch.Tensor:
    """Mean structural similarity per image (Wang et al. 2004), shape ``(B,)``; 1 for identical images.

    Local statistics use a Gaussian window of width ``sigma`` (truncated at 3.5 sigma), population
    (co)variances, and the mean is taken over channels and over the pixels at least one window radius away
    from the border, as scikit-image does. Images smaller than the window (11 pixels at ``sigma = 1.5``) are
    an error: pass a smaller ``sigma`` for tiny images.
    """
    ref, rec = _pair(reference, reconstruction)
    _check_range(data_range)
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    radius = int(_TRUNCATE * sigma + 0.5)
    if min(ref.shape[-2:]) < 2 * radius + 1:
        raise ValueError(
            f"images of {tuple(ref.shape[-2:])} pixels are smaller than the {2 * radius + 1}-pixel "
            f"SSIM window of sigma={sigma}; pass a smaller sigma"
        )
    x, y = ref.numpy(), rec.numpy()
    ssim_map = _ssim_map(x, y, sigma, (k1 * data_range) ** 2, (k2 * data_range) ** 2)
    cropped = ssim_map[..., radius : ssim_map.shape[-2] - radius, radius : ssim_map.shape[-1] - radius]
    return torch.from_numpy(cropped.reshape(cropped.shape[0], -1).mean(axis=1))


def best_match_psnr(
    reference: ArrayLike,
    reconstruction: ArrayLike,
    data_range: float = 1.0,
    *,
    one_to_one: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PSNR of each reconstruction against its best-matching reference; returns ``(psnr, reference index)``.

    DLG recovers a batch in arbitrary order, so reconstructions are paired with references by lowest MSE:
    one-to-one (Hungarian assignment, needs at least as many references as reconstructions) by default,
    or each to its own nearest reference with ``one_to_one=False`` (several may then share one).
    """
    ref, rec = _finite(_batch(reference), "reference"), _finite(_batch(reconstruction), "reconstruction")
    if ref.shape[1:] != rec.shape[1:]:
        raise ValueError(
            f"image shapes differ: reference {tuple(ref.shape[1:])}, reconstruction {tuple(rec.shape[1:])}"
        )
    _check_range(data_range)
    mse = ((rec[:, None] - ref[None]) ** 2).flatten(2).mean(dim=2)  # (reconstructions, references)
    if one_to_one:
        if rec.shape[0] > ref.shape[0]:
            raise ValueError(
                f"{rec.shape[0]} reconstructions cannot be paired one-to-one with {ref.shape[0]} references; "
                "pass one_to_one=False"
            )
        rows, cols = linear_sum_assignment(mse.numpy())
        index = torch.empty(rec.shape[0], dtype=torch.long)
        index[torch.from_numpy(rows)] = torch.from_numpy(cols).long()
    else:
        index = mse.argmin(dim=1)
    best = mse.gather(1, index[:, None]).squeeze(1)
    return _psnr_from_mse(best, data_range), index


def save_image_grid(
    images: ArrayLike,
    path: str | Path,
    nrow: int = 8,
    titles: Sequence[str] | None = None,
    *,
    title: str = "",
) -> Path:
    """A PNG grid of images in [0, 1] (clipped), ``nrow`` images per row as torchvision's ``make_grid``.

    ``titles`` label the images one by one; ``title`` heads the figure. Returns the PNG path.
    """
    from fedistill.plots import plot_image_grid

    batch = _batch(images)
    if nrow < 1:
        raise ValueError(f"nrow must be >= 1, got {nrow}")
    if titles is not None and len(titles) != batch.shape[0]:
        raise ValueError(f"got {len(titles)} titles for {batch.shape[0]} images")
    if batch.shape[1] not in (1, 3):
        raise ValueError(f"images must have 1 or 3 channels, got {batch.shape[1]}")
    return plot_image_grid(batch.numpy(), path, labels=titles, columns=nrow, title=title)


def _batch(images: ArrayLike) -> torch.Tensor:
    """A float64 CPU tensor ``(B, C, H, W)``."""
    tensor = torch.as_tensor(images).detach().to("cpu", torch.float64)
    if tensor.dim() == 3:
        tensor = tensor[None]
    if tensor.dim() != 4 or tensor.shape[0] == 0:
        raise ValueError(f"images must have shape (B, C, H, W) or (C, H, W), got {tuple(tensor.shape)}")
    return tensor


def _finite(images: torch.Tensor, name: str) -> torch.Tensor:
    """``images`` if every value is finite: a NaN would turn a score into NaN, or stop the best match."""
    finite = torch.isfinite(images).flatten(1).all(dim=1)
    if not bool(finite.all()):
        first = int(torch.nonzero(~finite)[0, 0])
        raise ValueError(f"{name} holds NaN or infinite values (image {first} of the batch)")
    return images


def _pair(reference: ArrayLike, reconstruction: ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
    ref, rec = _finite(_batch(reference), "reference"), _finite(_batch(reconstruction), "reconstruction")
    if ref.shape != rec.shape:
        raise ValueError(f"shapes differ: reference {tuple(ref.shape)}, reconstruction {tuple(rec.shape)}")
    return ref, rec


def _check_range(data_range: float) -> None:
    if not (data_range > 0 and math.isfinite(data_range)):
        raise ValueError(f"data_range must be a positive number (1.0 for images in [0, 1]), got {data_range}")


def _psnr_from_mse(mse: torch.Tensor, data_range: float) -> torch.Tensor:
    # 10 log10(R² / 0) = inf for identical images, as scikit-image reports.
    return 10.0 * torch.log10(data_range**2 / mse)


def _ssim_map(x: np.ndarray, y: np.ndarray, sigma: float, c1: float, c2: float) -> np.ndarray:
    """The SSIM index at every pixel of ``(B, C, H, W)`` arrays, filtering only the spatial axes."""

    def blur(a: np.ndarray) -> np.ndarray:
        return ndimage.gaussian_filter(a, sigma=(0, 0, sigma, sigma), truncate=_TRUNCATE, mode="reflect")

    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x * mu_x
    var_y = blur(y * y) - mu_y * mu_y
    cov = blur(x * y) - mu_x * mu_y
    numerator = (2 * mu_x * mu_y + c1) * (2 * cov + c2)
    denominator = (mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2)
    return numerator / denominator
