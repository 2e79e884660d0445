"""Gradient sanitisation: clip each sample's contribution, then add Gaussian noise.

Two release patterns, two functions:

* `sanitize_per_sample`: every per-sample gradient is itself released (GS-WGAN / DP-CGAN style: a
  client returns the gradient of its loss with respect to each synthetic input), so each one is clipped
  and noised on its own.
* `sanitize_sum`: only the sum over a batch is released (a FedAvg-style client update), so each
  sample is clipped, the clipped gradients are summed and one noise draw is added to the sum.

In both cases one sample changes the released tensor by at most ``clip_norm`` in L2 (a sample whose
gradient is not finite counts as zero), and the noise has
standard deviation ``noise_multiplier * clip_norm``: a Gaussian mechanism of that noise multiplier,
which is what `ClientAccountant.step` records.
"""

from __future__ import annotations

import math

import torch

__all__ = ["clip_per_sample", "sanitize_per_sample", "sanitize_sum"]

NORM_EPS: float = 1e-12
"""Added to a norm before dividing by it, so an all-zero gradient stays zero."""


def _check(grads: torch.Tensor, clip_norm: float, noise_multiplier: float = 0.0) -> None:
    if grads.dim() < 1:
        raise ValueError("per-sample gradients must have shape (B, ...), got a scalar")
    if not grads.is_floating_point():
        raise ValueError(f"per-sample gradients must be floating point, got {grads.dtype}")
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"clip_norm must be a finite number > 0, got {clip_norm!r}")
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ValueError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier!r}")


def _flat(grads: torch.Tensor) -> torch.Tensor:
    # Explicit sizes instead of -1 so an empty batch (B = 0) reshapes too.
    return grads.reshape(grads.shape[0], math.prod(grads.shape[1:]))


def clip_per_sample(grads: torch.Tensor, clip_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale each sample's gradient down to L2 norm at most `clip_norm`.

    Samples already within the bound are returned unchanged (the scale is clamped to 1). A sample with a
    NaN or infinite entry becomes zero: scaling would leave it NaN, and a NaN that reaches the receiver
    reveals something of the data that no clip norm bounds. Returns the clipped tensor (same shape as
    `grads`) and the ``(B,)`` per-sample norms before clipping.
    """
    _check(grads, clip_norm)
    flat = _flat(grads)
    norms = flat.norm(dim=1)
    finite = torch.isfinite(flat).all(dim=1).reshape((-1,) + (1,) * (grads.dim() - 1))
    scale = (clip_norm / (norms + NORM_EPS)).clamp(max=1.0)
    clipped = grads * scale.reshape((-1,) + (1,) * (grads.dim() - 1))
    return torch.where(finite, clipped, torch.zeros_like(clipped)), norms


def _noise(
    shape: torch.Size, std: float, like: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """Gaussian noise of standard deviation `std`, drawn on the generator's device (the CPU for the run's
    seeded streams) and moved to `like`'s, so every device adds the same noise."""
    gen_device = generator.device if generator is not None else like.device
    noise = torch.randn(shape, generator=generator, dtype=like.dtype, device=gen_device).to(like.device)
    return noise * std


def sanitize_per_sample(
    grads: torch.Tensor, clip_norm: float, noise_multiplier: float, generator: torch.Generator | None
) -> torch.Tensor:
    """Clip each per-sample gradient to `clip_norm`, then add N(0, (noise_multiplier*clip_norm)^2) to each.

    Every sample gets its own noise draw because every sample's gradient is released.
    """
    _check(grads, clip_norm, noise_multiplier)
    clipped, _ = clip_per_sample(grads, clip_norm)
    if noise_multiplier == 0:
        return clipped
    return clipped + _noise(grads.shape, noise_multiplier * clip_norm, grads, generator)


def sanitize_sum(
    grads: torch.Tensor, clip_norm: float, noise_multiplier: float, generator: torch.Generator | None
) -> torch.Tensor:
    """Clip each per-sample gradient, sum over the batch, add one N(0, (noise_multiplier*clip_norm)^2) draw.

    Returns a tensor of shape ``grads.shape[1:]``; divide by the (expected) batch size afterwards for
    a mean, as DP-SGD does.
    """
    _check(grads, clip_norm, noise_multiplier)
    clipped, _ = clip_per_sample(grads, clip_norm)
    total = clipped.sum(dim=0)
    if noise_multiplier == 0:
        return total
    return total + _noise(total.shape, noise_multiplier * clip_norm, grads, generator)
