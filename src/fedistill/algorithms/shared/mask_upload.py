"""Label masks a site uploads once (`query.masks`, kind `label-masks`), for a server-side generator
conditioned on them: FedIOD's per-pixel tasks with `mask_source = "clients"`, and AsynDGAN. The site sends
the masks of its training samples in a seeded order and keeps that order, so a synthetic image drawn
from the i-th mask it sent can later be paired with the real image of that mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fedistill.algorithms.base import ClientContext
from fedistill.errors import FederationError
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import ArraySpec, Message
from fedistill.federation.reply_spec import ReplySpec
from fedistill.seeding import torch_generator


def site_masks(
    ctx: ClientContext, limit: int, encode: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(training indices, uint8 masks) of at most `limit` training samples (0: all) in a seeded order;
    `encode` turns the stored targets (B, H, W) into the masks sent."""
    order = torch.randperm(
        len(ctx.train), generator=torch_generator(ctx.config.seed, "mask-upload", ctx.client_id)
    )
    uploaded = order[:limit] if limit else order
    return uploaded, encode(ctx.train.y[uploaded]).to(torch.uint8)


def collect_masks(
    fleet: Fleet,
    clients: Sequence[int],
    *,
    size: int,
    limit: int,
    timeout: float | None,
    classes: int,
    metrics: tuple[str, ...] = (),
) -> tuple[list[torch.Tensor], dict[int, Message]]:
    """Every site's uploaded masks (int64, in the order of `clients`) and the replies (for `metrics`
    they must carry); every site must answer, with at least one mask, and only with values below the
    condition's `classes` (a larger one would fail later in G's one-hot, naming no site)."""
    request = Message.build("query.masks", scalars={"config": {"limit": limit}})
    expect = ReplySpec({"label-masks": {"masks": ArraySpec("uint8", (None, size, size))}}, metrics)
    replies = successful(
        fleet.broadcast(request, clients, timeout=timeout, expect=expect),
        minimum=len(clients),
        what="label masks",
    )
    pools = [replies[c].tensor("label-masks", "masks").to(torch.int64) for c in clients]
    empty = [c for c, pool in zip(clients, pools, strict=True) if len(pool) == 0]
    if empty:
        raise FederationError(f"client(s) {empty} uploaded no masks; G has nothing to draw for them")
    wrong = [c for c, pool in zip(clients, pools, strict=True) if int(pool.max()) >= classes]
    if wrong:
        raise FederationError(f"client(s) {wrong} uploaded masks with classes >= {classes}")
    return pools, replies
