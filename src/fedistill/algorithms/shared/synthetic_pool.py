"""A pool of synthetic samples and their ensemble targets, replayed to the student.

Data-free distillation sees each synthetic batch once, while G keeps moving: the student forgets what
G produced earlier. DENSE and Co-Boosting keep an image pool; here the pool keeps the inputs together
with the targets the clients already returned for them, so a replay step costs no message and
nothing new crosses the boundary. First in, first out, up to `capacity` samples; saved with the
server's checkpoint, so a resumed run replays exactly what an uninterrupted one would.
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
        self.x: torch.Tensor | None = None
        self.targets: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.x is None else len(self.x)

    def add(self, x: torch.Tensor, targets: torch.Tensor) -> None:
        """Append a batch; the oldest samples leave once the pool is full."""
        x, targets = x.detach(), targets.detach()
        if self.x is not None and self.targets is not None:
            x, targets = torch.cat([self.x, x]), torch.cat([self.targets, targets])
        self.x, self.targets = x[-self.capacity :].clone(), targets[-self.capacity :].clone()

    def sample(self, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """`size` samples drawn uniformly with replacement."""
        if self.x is None or self.targets is None:
            raise ValueError("the synthetic pool is empty")
        index = torch.randint(len(self.x), (size,), generator=generator)
        return self.x[index], self.targets[index]

    def state_dict(self) -> dict[str, Any]:
        """The pooled inputs and targets, for the server's checkpoint."""
        return {"x": self.x, "targets": self.targets}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the pool `state_dict` saved, on the run's device."""
        x, targets = state.get("x"), state.get("targets")
        self.x = None if x is None else devices.on_device(x)
        self.targets = None if targets is None else devices.on_device(targets)
