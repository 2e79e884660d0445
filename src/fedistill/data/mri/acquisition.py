"""Simulated acquisition differences between sites: the same anatomy as different scanners image it.

Everything here is deterministic (fixed fields, noise seeded per site and slice) and each effect is
one that distinguishes real MRI sites:

- intensity profile (`gamma`): I -> I ** gamma on the [0, 1] image; a different sequence timing
  changes the contrast between grey matter, white matter and CSF;
- bias field (`bias`): a smooth multiplicative field exp(bias * p), p a fixed linear-plus-bilinear
  function of position in [-1, 1] along `bias_axes`, as receive-coil sensitivity shades a scan;
- resolution (`blur_px`): a Gaussian point-spread function of sigma `blur_px` delivered pixels, a scanner
  that resolves less detail than the others (applied after resizing, so it does not vanish at small
  image sizes);
- noise (`noise`): Rician noise, |I + sigma (n1 + i n2)| with sigma = `noise` times the volume's
  maximum, the magnitude of complex Gaussian noise, also at the delivered size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage


@dataclass(frozen=True)
class Acquisition:
    """A simulated scanner: the intensity profile, bias field, blur and noise it gives the slices it
    images."""

    name: str
    gamma: float = 1.0
    bias: float = 0.0
    bias_axes: tuple[float, float, float] = (0.0, 1.0, 0.0)  # weights along (slice, row, column)
    blur_px: float = 0.0
    noise: float = 0.0
    seed: int = 0

    def before_resize(self, slices: np.ndarray) -> np.ndarray:
        """Intensity profile and bias field on the native (S, H, W) slices in [0, 1]."""
        out = np.clip(slices, 0.0, None) ** self.gamma if self.gamma != 1.0 else slices.copy()
        if self.bias:
            s, h, w = out.shape
            z, y, x = np.meshgrid(*(np.linspace(-1.0, 1.0, n) for n in (s, h, w)), indexing="ij", sparse=True)
            a, b, c = self.bias_axes
            p = a * z + b * y + c * x + 0.5 * y * x
            p = p / max(float(np.abs(p).max()), 1e-12)
            out = out * np.exp(self.bias * p)
        return out.astype(np.float32)

    def after_resize(self, slices: np.ndarray, slice_index: np.ndarray) -> np.ndarray:
        """Point-spread blur and Rician noise on the delivered (S, H, W) slices in [0, 1]."""
        out = slices.astype(np.float32, copy=True)
        if self.blur_px:
            out = ndimage.gaussian_filter(out, sigma=(0.0, self.blur_px, self.blur_px))
        if self.noise:
            sigma = self.noise * float(out.max())
            for i, index in enumerate(slice_index):
                rng = np.random.default_rng((self.seed, int(index)))
                n = rng.standard_normal((2, *out.shape[1:]), dtype=np.float32) * sigma
                out[i] = np.hypot(out[i] + n[0], n[1])
        return out
