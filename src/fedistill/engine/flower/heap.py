"""Give the C heap's free pages back to the system in a process that serves many nodes.

A simulation worker answers thousands of messages for hundreds of sites. glibc's allocator keeps what
they freed (tensors of a few MB land on its main heap once its mmap threshold has risen, and a small
live block near the top stops the heap from shrinking), so the worker's resident memory grew with the
messages it had served: at 1,000 FedIOD sites one worker held 2.9 GB of heap of which 0.6 GB was in
use. `malloc_trim(0)` returns every free page of every arena, so a worker holds about what it uses.
It changes no allocation that is in use, so no result changes. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none (macOS, musl)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Return the heap's free pages to the system; whether anything could be asked (glibc only)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
