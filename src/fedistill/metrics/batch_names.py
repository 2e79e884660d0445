"""The name of each item of a batch (its site, its test source), from one name or one name per item."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

Names = str | int | Sequence[str | int] | np.ndarray | torch.Tensor | None


def names_for_batch(names: Names, size: int, what: str, items: str) -> list[str | None]:
    """``size`` names as strings: ``None`` (no name) or a single name for every item, or one per item.

    A single name may be a string, a number (site 3 is named ``"3"``) or a 0-d array holding either;
    ``what`` and ``items`` word the error when a sequence has the wrong length (``"sources"``,
    ``"slices"``).
    """
    if isinstance(names, np.ndarray | torch.Tensor):
        names = names.tolist()  # plain values: tensor(3) is named "3" like 3; a 0-d array is its one value
    if names is None:
        return [None] * size
    if isinstance(names, str) or not isinstance(names, Iterable):
        return [str(names)] * size
    listed = [None if name is None else str(name) for name in names]  # an item without a name has none
    if len(listed) != size:
        raise ValueError(f"got {len(listed)} {what} for a batch of {size} {items}")
    return listed
