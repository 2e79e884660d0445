"""Which site each sample of a server-drawn batch is for: a share of the batch per site, and a mask per
sample drawn from its site's uploaded masks (FedIOD's and AsynDGAN's conditional generators)."""

from __future__ import annotations

import torch


def shares(pi: torch.Tensor, batch: int, rng: torch.Generator | None = None) -> torch.Tensor:
    """Samples per site: a share pi_k of `batch`, at least one each when the batch has room, the rest by
    the fractional parts of the quotas. With `rng` those slots are drawn (systematic sampling: site k
    gets one with probability equal to its fractional part), so over many draws every site's count
    averages its quota even when the batch is smaller than the sites; without, they go to the largest
    fractional parts (ties to the earlier site), the same sites every time."""
    k = len(pi)
    floor = 1 if batch >= k else 0
    quota = pi.double() * (batch - floor * k)
    counts = quota.floor().long() + floor
    extra = batch - int(counts.sum())
    if extra > 0:
        fraction = quota - quota.floor()
        if rng is None:
            counts[torch.argsort(fraction, descending=True, stable=True)[:extra]] += 1
        else:
            points = torch.rand((), generator=rng, dtype=torch.float64) + torch.arange(extra)
            edges = torch.cumsum(fraction, 0) * (extra / float(fraction.sum()))  # the sum is `extra`
            counts += torch.bincount(torch.searchsorted(edges, points, right=True).clamp(max=k - 1),
                                     minlength=k)  # fmt: skip
    return counts


def owners(pi: torch.Tensor, batch: int, rng: torch.Generator | None = None) -> torch.Tensor:
    """(batch,) site positions on the CPU, site by site in order (see `shares`)."""
    return torch.repeat_interleave(torch.arange(len(pi)), shares(pi.cpu(), batch, rng))


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
