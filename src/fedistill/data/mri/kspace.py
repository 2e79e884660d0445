"""Single-coil Cartesian k-space in torch: centred orthonormal FFTs, zero filling, data consistency.

The conventions are fastMRI's (`fastmri.fft2c` / `ifft2c`): ifftshift -> fft2(norm="ortho") ->
fftshift over the last two dimensions, so the DC term sits at the centre of k-space (row H // 2,
column W // 2) and Parseval holds (the transforms are unitary). fastMRI stores complex numbers as a
trailing dimension of size 2; here they are torch complex tensors.

Magnitude images have no phase. Where the datasets hold magnitude images (everything in fedistill's
reconstruction sets: NIfTI volumes, root-sum-of-squares targets), k-space is *simulated* as the FFT of
the magnitude image, i.e. of an image whose phase is zero everywhere. That is the single-coil
simulation of Guo et al. (FL-MRCM, CVPR 2021) for BraTS and IXI; real acquisitions carry phase, so
their k-space is not Hermitian-symmetric as the simulated one is.

Undersampling masks (`fedistill.data.mri.masks`) select k-space columns (the phase-encoding
direction); a mask of shape (W,) or (..., 1, W) broadcasts over rows.
"""

from __future__ import annotations

import torch

from fedistill.data.mri.masks import (  # noqa: F401  (re-exported: k-space and its masks in one place)
    EquispacedExactMaskFunc,
    EquispacedMaskFunc,
    MaskFunc,
    RandomMaskFunc,
    SliceMasks,
    mask_function,
)

_DIMS = (-2, -1)


def _complex(x: torch.Tensor) -> torch.Tensor:
    if x.is_complex():
        return x
    return x.to(torch.complex128 if x.dtype == torch.float64 else torch.complex64)


def fft2c(image: torch.Tensor) -> torch.Tensor:
    """Centred orthonormal 2D FFT over the last two dimensions (a real image is taken as zero-phase)."""
    x = torch.fft.ifftshift(_complex(image), dim=_DIMS)
    x = torch.fft.fft2(x, dim=_DIMS, norm="ortho")
    return torch.fft.fftshift(x, dim=_DIMS)


def ifft2c(kspace: torch.Tensor) -> torch.Tensor:
    """Centred orthonormal 2D inverse FFT over the last two dimensions; the inverse of `fft2c`."""
    x = torch.fft.ifftshift(_complex(kspace), dim=_DIMS)
    x = torch.fft.ifft2(x, dim=_DIMS, norm="ortho")
    return torch.fft.fftshift(x, dim=_DIMS)


def _mask_for(mask: torch.Tensor, kspace: torch.Tensor) -> torch.Tensor:
    if mask.shape[-1] != kspace.shape[-1]:
        raise ValueError(
            f"mask has {mask.shape[-1]} columns but k-space {tuple(kspace.shape)} has {kspace.shape[-1]}"
        )
    try:
        fits = torch.broadcast_shapes(mask.shape, kspace.shape) == kspace.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"mask {tuple(mask.shape)} does not broadcast over k-space {tuple(kspace.shape)}: give one mask "
            "(W,) for all, or one per image (B, 1, 1, W)"
        )
    return mask.to(device=kspace.device, dtype=kspace.real.dtype)


def undersample(image: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(measured k-space, zero-filled magnitude image) of `image` (..., H, W) sampled on `mask`'s columns.

    The measured k-space is zero on the columns the mask skips: what a scanner that acquired only
    those phase-encoding lines would hand over, with the missing lines filled by zeros.
    """
    kspace = fft2c(image)
    measured = kspace * _mask_for(mask, kspace)
    return measured, ifft2c(measured).abs()


def zero_filled(image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """|ifft2c(mask * fft2c(image))|: the network input of a reconstruction task (real, image's shape)."""
    return undersample(image, mask)[1]


def data_consistency(
    prediction: torch.Tensor,
    measured_kspace: torch.Tensor,
    mask: torch.Tensor,
    weight: float = 1.0,
    magnitude: bool = True,
) -> torch.Tensor:
    """Put the measured lines back into a prediction's k-space and return the image.

    weight = 1 replaces every sampled line by its measurement (hard data consistency); 0 < weight < 1
    blends them, (1 - weight) * predicted + weight * measured, the noisy-measurement form of Schlemper
    et al. 2017 with weight = lambda / (1 + lambda). Unsampled lines keep the prediction. A magnitude
    prediction has no phase, so the result is complex in general: `magnitude=False` returns it as is (its
    measured lines exact), the default its magnitude (what a magnitude-image network is trained and scored
    on; taking the magnitude moves the measured lines a little, so the step is not idempotent then).
    """
    if not 0.0 < weight <= 1.0:
        raise ValueError(f"data consistency weight must be in (0, 1], got {weight}")
    predicted = fft2c(prediction)
    if measured_kspace.shape != predicted.shape:
        raise ValueError(
            f"measured k-space {tuple(measured_kspace.shape)} does not match the prediction "
            f"{tuple(prediction.shape)}: each image needs its own measurement of its size"
        )
    measured = _complex(measured_kspace).to(predicted.dtype)
    m = _mask_for(mask, predicted) * weight
    image = ifft2c(predicted * (1 - m) + measured * m)
    return image.abs() if magnitude else image


def root_sum_of_squares(coil_images: torch.Tensor, dim: int = -3) -> torch.Tensor:
    """sqrt(sum |coil image|^2) over `dim` (the coils): fastMRI's multi-coil target (`fastmri.rss`)."""
    return coil_images.abs().pow(2).sum(dim).sqrt()
