"""Which site each sample of a server-drawn batch is for: a share of the batch per site, and a mask per
sample drawn from its site's uploaded masks (FedIOD's and AsynDGAN's conditional generators)."""

from __future__ import annotations

import torch


def shares(pi: torch.Tensor, batch: int) -> torch.Tensor:
    """Samples per site: a share pi_k of `batch`, at least one each when the batch has room, the rest by
    largest remainders (ties to the earlier site)."""
    k = len(pi)
    floor = 1 if batch >= k else 0
    quota = pi.double() * (batch - floor * k)
    counts = quota.floor().long() + floor
    extra = batch - int(counts.sum())
    if extra > 0:
        counts[torch.argsort(quota - quota.floor(), descending=True, stable=True)[:extra]] += 1
    return counts


def owners(pi: torch.Tensor, batch: int) -> torch.Tensor:
    """(batch,) site positions on the CPU, site by site in order (see `shares`)."""
    return torch.repeat_interleave(torch.arange(len(pi)), shares(pi.cpu(), batch))


def from_uploads(
    pools: list[torch.Tensor], owner: torch.Tensor, rng: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each sample, a mask drawn uniformly from its site's uploaded masks: (masks, positions)."""
    positions = torch.empty(len(owner), dtype=torch.int64)
    for site in range(len(pools)):
        rows = torch.nonzero(owner == site).flatten()
        if len(rows):
            positions[rows] = torch.randint(len(pools[site]), (len(rows),), generator=rng)
    masks = torch.stack([pools[int(s)][int(p)] for s, p in zip(owner, positions, strict=True)])
    return masks.to(torch.int64), positions


def uniform_over_uploads(pools: list[torch.Tensor], batch: int, rng: torch.Generator) -> torch.Tensor:
    """`batch` masks drawn uniformly from all the sites' uploads together, so every uploaded mask is
    equally likely (a site's share of the draws is its share of the uploads, with no minimum)."""
    sizes = torch.tensor([len(pool) for pool in pools])
    flat = torch.randint(int(sizes.sum()), (batch,), generator=rng)
    ends = torch.cumsum(sizes, 0)
    site, starts = torch.searchsorted(ends, flat, right=True), ends - sizes
    masks = [pools[int(k)][int(f - starts[k])] for k, f in zip(site, flat, strict=True)]
    return torch.stack(masks).to(torch.int64)
