"""Finite poison a misbehaving site can send: how the plausibility checks and robust aggregates
(federation/plausibility.py, shared/weight_average.py) are tested and measured (benchmarks/poisoning.py).

Each poison takes the reply an honest site would send and returns the one a poisoning site sends instead.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedistill.federation.messages import Message


def changed(message: Message, kind: str, change: Callable[[str, np.ndarray], np.ndarray]) -> Message:
    """`message` with every array of content `kind` passed through `change(name, array)` (decoded first)."""
    if kind not in message.arrays:
        return message
    arrays = {k: {n: message.array(k, n) for n in named} for k, named in message.arrays.items()}
    arrays[kind] = {name: change(name, a) for name, a in arrays[kind].items()}
    return Message.build(message.type, arrays, {k: dict(v) for k, v in message.scalars.items()})


def scaled_logits(message: Message) -> Message:
    """Every logit times 1e30 (still finite in float32): outvotes every honest site in a plain mean."""
    return changed(message, "logits", lambda _, a: a * np.float32(1e30))


def huge_bias(message: Message) -> Message:
    """The model's last bias plus 1e30: one such model ruins a plain parameter average."""
    last = [n for n in message.arrays.get("parameters", {}) if n.endswith("bias")][-1:]
    return changed(message, "parameters", lambda n, a: a + np.float32(1e30) if n in last else a)


def inflated_counts(message: Message) -> Message:
    """Class counts times 1000: a claim of far more data than the site holds (class-share weighting)."""
    return changed(message, "label-statistics", lambda _, a: a * 1000)
