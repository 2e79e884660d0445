"""exp, powers, norms and Gaussian smoothing that round alike on every x86-64 CPU, for seeded synthetic data.

NumPy computes float64 exp and log, and powers with a non-integer exponent, with AVX-512 code (Intel's SVML)
on CPUs that have AVX-512 and with the C library on the others, and the two differ in the last bit now and
then. SciPy's `gaussian_filter` builds its kernel with NumPy's exp, so it inherits the difference. Rounded
to an 8-bit pixel or cut at a threshold, such a last bit can become a grey level or a mask pixel: three
pixels of mni152-synthetic-lesions differed between an AVX2 and an AVX-512 machine. NumPy's
vector norm is OpenBLAS's dot, whose kernel also follows the CPU. Python's `math` is the C library's, or
Python's own, on every CPU, and PyTorch's CPU kernels compute exp and pow the same way on AVX2 and AVX-512,
so nothing here follows the CPU's vector instructions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from scipy import ndimage


def exp(values: np.ndarray) -> np.ndarray:
    """e to the power of `values`, elementwise, in their float dtype."""
    return torch.exp(torch.from_numpy(np.ascontiguousarray(values))).numpy()


def power(values: np.ndarray, exponent: float) -> np.ndarray:
    """`values ** exponent`, elementwise, in their float dtype."""
    return torch.from_numpy(np.ascontiguousarray(values)).pow(float(exponent)).numpy()


def norm(vector: np.ndarray | Sequence[float]) -> float:
    """The Euclidean length of a vector (`math.hypot` of its entries)."""
    return math.hypot(*(float(x) for x in np.ravel(vector)))


def gaussian_kernel(sigma: float, truncate: float = 4.0) -> np.ndarray:
    """SciPy's normalised 1-D Gaussian kernel (radius `int(truncate * sigma + 0.5)`), by `math.exp`."""
    sigma = float(sigma)
    radius = int(truncate * sigma + 0.5)
    scale = -0.5 / (sigma * sigma)
    phi = np.array([math.exp(scale * float(x * x)) for x in range(-radius, radius + 1)])
    return phi / phi.sum()


def gaussian_filter(
    values: np.ndarray, sigma: float | Sequence[float], truncate: float = 4.0, mode: str = "reflect"
) -> np.ndarray:
    """`scipy.ndimage.gaussian_filter(values, sigma, truncate=truncate, mode=mode)` for float arrays: one
    1-D pass per axis whose sigma is above 1e-15, in the input's dtype, with `gaussian_kernel`."""
    values = np.asarray(values)
    if not np.issubdtype(values.dtype, np.floating):
        raise TypeError(f"gaussian_filter smooths float arrays; got dtype {values.dtype}")
    sigmas = [float(s) for s in np.broadcast_to(np.asarray(sigma, dtype=np.float64), (values.ndim,))]
    out = values.copy()
    for axis, s in enumerate(sigmas):
        if s > 1e-15:
            ndimage.correlate1d(out, gaussian_kernel(s, truncate)[::-1], axis, output=out, mode=mode)
    return out
