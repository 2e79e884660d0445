"""Which sites a G-step asks (`sites_per_step`), and their `query.generate` requests sharing one copy of
the step's batch.

Why: at 1,000 sites a G-step that asks every site, with a copy of G's batch (and the S-step inputs that
ride along) in every request, holds about a megabyte per site before a single reply arrives. A message's
arrays are read-only snapshots, so the sites' requests can share the batch's: each request still carries
(and the ledger still counts) the whole batch, as a networked transport sends it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedistill.federation.messages import Message, Payload, Scalar, check_structure
from fedistill.seeding import numpy_generator


def step_sites(clients: list[int], sites_per_step: int, seed: int, step: int) -> list[int]:
    """The sites G-step `step` asks, in id order: every one of `clients` (`sites_per_step = 0`, or as many
    as there are sites), else `sites_per_step` of them drawn without replacement from (seed, step) alone,
    so a resumed run draws what an uninterrupted one did."""
    if not sites_per_step or sites_per_step >= len(clients):
        return list(clients)
    draw = numpy_generator(seed, "fediod-sites", step)
    chosen = draw.choice(len(clients), size=sites_per_step, replace=False)
    return sorted(clients[int(i)] for i in chosen)


def shared_batch_request(
    shared: Message,
    own: Mapping[str, torch.Tensor],
    scalars: Mapping[str, Mapping[str, Scalar]],
    encodings: Mapping[str, str],
) -> Message:
    """One site's request: the arrays of `shared` (the step's batch, not copied) with this site's `own`
    synthetic-input arrays after them, and its scalars; the same message `Message.build` would give."""
    arrays_own = {"synthetic-inputs": dict(own)} if own else {}
    mine = Message.build(shared.type, arrays=arrays_own, scalars=scalars, encodings=encodings)
    arrays: dict[str, dict[str, Payload]] = {kind: dict(named) for kind, named in shared.arrays.items()}
    for kind, named in mine.arrays.items():
        arrays.setdefault(kind, {}).update(named)
    message = Message(type=shared.type, arrays=arrays, scalars=mine.scalars)
    check_structure(message)
    return message
