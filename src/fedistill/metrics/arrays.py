"""Metric inputs as numpy arrays, whatever torch dtype or device they come in."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def as_numpy(values: Any) -> np.ndarray:
    """A numpy view or copy of a tensor (detached, on the CPU) or of anything ``np.asarray`` takes.

    numpy has no bfloat16, so such a tensor becomes float32, which holds each of its values exactly.
    """
    if isinstance(values, torch.Tensor):
        tensor = values.detach().cpu()
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    return np.asarray(values)
