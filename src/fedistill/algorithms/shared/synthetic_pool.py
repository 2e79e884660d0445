"""A pool of synthetic samples and their ensemble targets, replayed to the student.

Data-free distillation sees each synthetic batch once, while G keeps moving: the student forgets what
G produced earlier. DENSE and Co-Boosting keep an image pool; here the pool keeps the inputs together
with the targets the clients already returned for them, so a replay step costs no message and
nothing new crosses the boundary. First in, first out, up to `capacity` samples; saved with the
server's checkpoint, so a resumed run replays exactly what an uninterrupted one would.

The samples live in a ring buffer that grows by doubling up to `capacity`: adding a batch writes only
that batch (copying the whole pool on every add cost 144 ms per add at 2,500 per-pixel samples). A
sample's index is its position oldest-first, so `sample` and `take` return what a plain first-in
first-out list would.
"""

from __future__ import annotations

from typing import Any

import torch

from fedistill import devices


class SyntheticPool:
    """Synthetic inputs and the ensemble targets already returned for them, first in first out, up to
    `capacity` samples."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._x: torch.Tensor | None = None  # storage; the samples are `_count` rows from `_start`, wrapping
        self._targets: torch.Tensor | None = None
        self._start = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, x: torch.Tensor, targets: torch.Tensor) -> None:
        """Append a batch; the oldest samples leave once the pool is full."""
        x, targets = x.detach()[-self.capacity :], targets.detach()[-self.capacity :]
        n = len(x)
        if n == 0:
            return
        if self._x is None or self._targets is None or n == self.capacity:
            if self._x is None or self._targets is None or len(self._x) != n:
                self._x = x.new_empty((n, *x.shape[1:]))
                self._targets = targets.new_empty((n, *targets.shape[1:]))
            self._x[:], self._targets[:] = x, targets
            self._start, self._count = 0, n
            return
        if self._count + n > len(self._x) < self.capacity:
            self._grow(min(self.capacity, max(2 * len(self._x), self._count + n)))
        slots = (self._start + self._count + torch.arange(n, device=self._x.device)) % len(self._x)
        self._x[slots], self._targets[slots] = x, targets
        dropped = max(0, self._count + n - self.capacity)
        self._start = (self._start + dropped) % len(self._x)
        self._count = min(self.capacity, self._count + n)

    def _grow(self, size: int) -> None:
        """Storage for `size` samples, the current ones moved to its front, oldest first."""
        assert self._x is not None and self._targets is not None
        x, targets = self.x, self.targets
        assert x is not None and targets is not None
        self._x = self._x.new_empty((size, *self._x.shape[1:]))
        self._targets = self._targets.new_empty((size, *self._targets.shape[1:]))
        self._x[: self._count], self._targets[: self._count] = x, targets
        self._start = 0

    def take(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples at `index` (positions oldest first) and their targets."""
        if self._x is None or self._targets is None or self._count == 0:
            raise ValueError("the synthetic pool is empty")
        physical = (self._start + index.to(self._x.device)) % len(self._x)
        return self._x[physical], self._targets[physical]

    def sample(self, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """`size` samples drawn uniformly with replacement."""
        if self._count == 0:
            raise ValueError("the synthetic pool is empty")
        return self.take(torch.randint(self._count, (size,), generator=generator))

    @property
    def x(self) -> torch.Tensor | None:
        """The pooled inputs, oldest first: a view of the storage (a copy once the ring has wrapped), valid
        until the next `add`."""
        return self._ordered(self._x)

    @property
    def targets(self) -> torch.Tensor | None:
        """The pooled targets, in the order of `x`."""
        return self._ordered(self._targets)

    def _ordered(self, storage: torch.Tensor | None) -> torch.Tensor | None:
        if storage is None or self._count == 0:
            return None
        end = self._start + self._count
        if end <= len(storage):
            return storage[self._start : end]
        return torch.cat([storage[self._start :], storage[: end - len(storage)]])

    def state_dict(self) -> dict[str, Any]:
        """The pooled inputs and targets oldest first, for the server's checkpoint."""
        x, targets = self.x, self.targets
        return {
            "x": None if x is None else x.clone(),
            "targets": None if targets is None else targets.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the pool `state_dict` saved, on the run's device."""
        x, targets = state.get("x"), state.get("targets")
        self._x = self._targets = None
        self._start = self._count = 0
        if x is not None and targets is not None:
            self.add(devices.on_device(x), devices.on_device(targets))
