"""One seed drives everything: each random stream is derived from (seed, purpose, ...) by hashing.

Deriving instead of sharing one global RNG makes every round reproducible on its own, which is what
lets a resumed run end exactly where an uninterrupted one does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import numpy as np
import torch

T = TypeVar("T")


def _plain(part: object) -> object:
    """A NumPy or one-element torch number as the Python number it equals: `np.int64(3)` and `3` name one
    stream (their reprs differ, and the hash reads the repr)."""
    if isinstance(part, torch.Tensor) and part.numel() == 1:
        part = part.item()
    return part.item() if isinstance(part, np.generic) else part


def derive_seed(seed: int, *purpose: object) -> int:
    """A 63-bit seed derived from the run seed and a purpose (a name, a client, a round, ...)."""
    parts = tuple(_plain(part) for part in (seed, *purpose))
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def torch_generator(seed: int, *purpose: object) -> torch.Generator:
    """A torch generator of its own, seeded by (seed, purpose): no global state is touched."""
    return torch.Generator().manual_seed(derive_seed(seed, *purpose))


def numpy_generator(seed: int, *purpose: object) -> np.random.Generator:
    """A NumPy generator of its own, seeded by (seed, purpose)."""
    return np.random.default_rng(derive_seed(seed, *purpose))


def seeded(seed: int, build: Callable[[], T], *purpose: object) -> T:
    """Run `build` (e.g. a model constructor using torch's global RNG) under a derived seed,
    leaving the global RNG state as it was. A module it builds is initialised on the CPU (the same
    weights on every device) and then moved to the run's device."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, *purpose))
        built = build()
    if isinstance(built, torch.nn.Module):
        from fedistill import devices

        built = built.to(devices.current())
    return built


@contextmanager
def global_rng(seed: int) -> Iterator[None]:
    """Torch's global RNG seeded with `seed` inside the block and restored after it: for the draws a
    model makes without a generator (dropout), so that they too follow the run's seed and a resumed
    run draws what an uninterrupted one does (on a CUDA device, its generator too)."""
    from fedistill import devices

    cuda = [devices.current()] if devices.current().type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        yield
