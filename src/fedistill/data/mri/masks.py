"""Cartesian undersampling masks as fastMRI defines them (`fastmri.data.subsample`).

A mask keeps whole k-space columns (phase-encoding lines) and is shared by every row. It has two parts:
the N_low = round(N * center_fraction) columns around the centre, always sampled, and outer columns
chosen so that about N / acceleration columns are sampled in all: the centre counts inside the
acceleration budget. With several (center_fraction, acceleration) pairs one pair is drawn per mask.

- `RandomMaskFunc`: each outer column with probability (N / acc - N_low) / (N - N_low), so the
  *expected* total is N / acc.
- `EquispacedMaskFunc`: columns at a spacing adjusted for the centre, acc * (N_low - N) /
  (N_low * acc - N), from a random offset in [0, round(spacing)); the total is close to N / acc.
  This is fastMRI's original `EquispacedMaskFunc` (fastmri <= 0.1; `EquispacedMaskFractionFunc` in
  fastmri >= 0.2), the one its public multi-coil data were undersampled with. As fastMRI notes
  (its issue 54), rounding the adjusted spacing makes the lines only nearly equispaced. Where the
  rounded centre already holds N / acc columns or more (a few dozen columns and a centre fraction near
  1 / acc), the mask is the centre alone, as the random mask's probability is then 0 (fastMRI's
  spacing is then infinite or negative and it fails).
- `EquispacedExactMaskFunc`: fastmri >= 0.2's `EquiSpacedMaskFunc`: every acc-th column from a random
  offset, plus the centre, so the real acceleration is below `acc`.

Given the same seed a mask here equals fastMRI's bit for bit: the seed goes to a fresh
`numpy.random.RandomState` (fastMRI reseeds its own) and the draws come in fastMRI's order (the pair,
then the column draws or the offset). Two differences: the mask is returned as a (N,) float32 tensor
for complex (..., H, W) k-space rather than fastMRI's (1, ..., N, 1) for its trailing real/imaginary
dimension, and a seed is required (fastMRI falls back to a global random state, which would make a run
depend on what ran before it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedistill.errors import ConfigError, unknown_name

Seed = int | tuple[int, ...]


def center_lines(num_cols: int, num_low: int) -> slice:
    """The centre's columns, placed as fastMRI does: (N - N_low + 1) // 2 columns before them."""
    pad = (num_cols - num_low + 1) // 2
    return slice(pad, pad + num_low)


@dataclass(frozen=True)
class MaskFunc:
    """Pairs of (center_fraction, acceleration), e.g. (0.08,), (4,) or (0.08, 0.04), (4, 8)."""

    center_fractions: tuple[float, ...] = (0.08,)
    accelerations: tuple[float, ...] = (4,)

    def __post_init__(self) -> None:
        cf, acc = tuple(self.center_fractions), tuple(self.accelerations)
        object.__setattr__(self, "center_fractions", cf)
        object.__setattr__(self, "accelerations", acc)
        if not cf or len(cf) != len(acc):
            raise ConfigError(
                f"center_fractions {cf} and accelerations {acc} must be non-empty and of equal length "
                "(one centre fraction per acceleration, e.g. (0.08, 0.04) with (4, 8))"
            )
        for f, a in zip(cf, acc, strict=True):
            if not a > 1:
                raise ConfigError(f"acceleration must be > 1, got {a}")
            if not 0 < f < 1.0 / a:
                raise ConfigError(
                    f"center fraction {f} must be in (0, 1/{a}): the fully sampled centre counts inside "
                    f"the budget of 1/{a} of the columns (fastMRI uses 0.08 at 4x, 0.04 at 8x)"
                )

    def __call__(self, num_cols: int, seed: Seed) -> torch.Tensor:
        """The (num_cols,) float32 mask (1 = sampled column) drawn from `seed`."""
        if num_cols < 2:
            raise ValueError(f"a mask needs at least 2 columns, got {num_cols}")
        rng = np.random.RandomState(seed)
        choice = rng.randint(len(self.center_fractions))
        center_fraction, acceleration = self.center_fractions[choice], self.accelerations[choice]
        num_low = round(num_cols * center_fraction)
        mask = self._outer(rng, num_cols, acceleration, num_low).astype(np.float32)
        mask[center_lines(num_cols, num_low)] = 1.0
        return torch.from_numpy(mask)

    def _outer(self, rng: np.random.RandomState, num_cols: int, acceleration: float, num_low: int):
        raise NotImplementedError


class RandomMaskFunc(MaskFunc):
    """Outer columns drawn independently, so that N / acceleration columns are sampled on average."""

    def _outer(self, rng: np.random.RandomState, num_cols: int, acceleration: float, num_low: int):
        prob = (num_cols / acceleration - num_low) / (num_cols - num_low)
        return rng.uniform(size=num_cols) < prob


class EquispacedMaskFunc(MaskFunc):
    """Outer columns at a spacing adjusted so that the total, centre included, is about N / acceleration."""

    def _outer(self, rng: np.random.RandomState, num_cols: int, acceleration: float, num_low: int):
        mask = np.zeros(num_cols, dtype=np.float32)
        if num_low * acceleration >= num_cols:  # the centre alone fills the budget (a narrow mask)
            return mask
        spacing = acceleration * (num_low - num_cols) / (num_low * acceleration - num_cols)
        offset = rng.randint(0, round(spacing))
        mask[np.around(np.arange(offset, num_cols - 1, spacing)).astype(np.int64)] = 1.0
        return mask


class EquispacedExactMaskFunc(MaskFunc):
    """Every acceleration-th column from a random offset, plus the centre (acceleration must be whole)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for a in self.accelerations:
            if float(a) != int(a):
                raise ConfigError(f"equispaced-exact needs whole accelerations, got {a}")

    def _outer(self, rng: np.random.RandomState, num_cols: int, acceleration: float, num_low: int):
        step = int(acceleration)
        offset = rng.randint(0, step)
        mask = np.zeros(num_cols, dtype=np.float32)
        mask[offset::step] = 1.0
        return mask


MASK_KINDS: dict[str, type[MaskFunc]] = {
    "random": RandomMaskFunc,
    "equispaced": EquispacedMaskFunc,
    "equispaced-exact": EquispacedExactMaskFunc,
}


def mask_function(
    kind: str = "random",
    center_fractions: Sequence[float] = (0.08,),
    accelerations: Sequence[float] = (4,),
) -> MaskFunc:
    """The mask function named `kind` (random, equispaced, equispaced-exact)."""
    if kind not in MASK_KINDS:
        raise unknown_name("mask kind", kind, list(MASK_KINDS), ConfigError)
    return MASK_KINDS[kind](tuple(center_fractions), tuple(accelerations))


MASK_MODES = ("per-slice", "fixed")


@dataclass(frozen=True)
class SliceMasks:
    """Which mask each slice gets, reproducibly.

    per-slice: slice i gets the mask drawn from seed (seed, i): a different mask per slice, the same
    one for that slice in every run and epoch with this seed (fastMRI's validation seeds by file name
    instead; a slice index plays that role here). fixed: every slice gets the one mask drawn from
    `seed`, as in the papers that train and test with one fixed sampling pattern.
    """

    func: MaskFunc
    mode: str = "per-slice"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MASK_MODES:
            raise unknown_name("mask mode", self.mode, list(MASK_MODES), ConfigError)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"mask seed must be a non-negative integer, got {self.seed!r}")

    def mask(self, index: int, num_cols: int) -> torch.Tensor:
        """Slice `index`'s (num_cols,) mask."""
        if self.mode == "fixed":
            return self.func(num_cols, self.seed)
        return self.func(num_cols, (self.seed, int(index)))

    def __call__(self, indices: Sequence[int] | torch.Tensor, num_cols: int) -> torch.Tensor:
        """Masks (N, 1, 1, num_cols) for slices `indices`, ready to multiply (N, 1, H, W) k-space."""
        idx = [int(i) for i in (indices.tolist() if isinstance(indices, torch.Tensor) else indices)]
        if self.mode == "fixed":
            return self.func(num_cols, self.seed).expand(len(idx), num_cols).reshape(-1, 1, 1, num_cols)
        if not idx:
            return torch.zeros(0, 1, 1, num_cols)
        return torch.stack([self.mask(i, num_cols) for i in idx]).reshape(-1, 1, 1, num_cols)
