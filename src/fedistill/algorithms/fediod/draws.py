"""What G draws a batch from, and which site each sample is for.

Classification: z ~ N(0, I) (with the per-client mixture, z followed by the one-hot of the sample's
site). Dense tasks: a label mask per sample, from the masks a site uploaded (AsynDGAN's and the
paper's protocol: its samples are that site's own) or from the server's own prior (no label leaves a
site), one-hot encoded, plus seeded noise channels. A `Draw` carries G's input, each sample's site (its
position among the federation's clients, or None when every site judges every sample), its mask, and,
for uploaded masks, the position of the mask in its site's upload (so the site can pair the synthetic
image with the real image of that mask for the perceptual term; -1 when there is none).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy import ndimage

from fedistill.algorithms.fediod.task_view import TaskView


@dataclass
class Draw:
    latent: torch.Tensor  # z, or z with the site's one-hot (classification)
    owner: torch.Tensor | None  # (B,) site positions, or None
    masks: torch.Tensor | None = None  # (B, H, W) int64 condition (dense tasks)
    pair: torch.Tensor | None = None  # (B,) position of the mask in its site's upload, -1 for none


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


def prior_masks(view: TaskView, batch: int, rng: torch.Generator) -> torch.Tensor:
    """Masks the server draws from its own prior, knowing no site's labels: smooth random blobs, drawn
    as thresholded smoothed noise (`mask`: one blob of a random size and position per image, as a
    tumour; `instance map`: many small round nuclei at a random density; `image`: one large, roughly
    elliptical brain-like foreground)."""
    size = view.info.image_size
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=rng))
    gen = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / max(size - 1, 1)
    out = np.zeros((batch, size, size), dtype=np.int64)
    for i in range(batch):
        noise = ndimage.gaussian_filter(gen.standard_normal((size, size)), sigma=size / 16)
        noise /= noise.std() + 1e-8
        if view.task.target == "image":
            cy, cx = gen.uniform(0.45, 0.55, 2)
            ry, rx = gen.uniform(0.32, 0.45, 2)
            field = 1 - ((yy - cy) / ry) ** 2 - ((xx - cx) / rx) ** 2 + 0.08 * noise
            out[i] = field > 0
        elif view.task.target == "instance map":
            count = int(gen.integers(5, 40))
            radius = gen.uniform(0.02, 0.06)
            centres = gen.uniform(0.05, 0.95, (count, 2))
            for cy, cx in centres:
                wobble = 1 + 0.15 * noise
                out[i] |= ((yy - cy) ** 2 + (xx - cx) ** 2) < (radius * wobble) ** 2
        else:
            cy, cx = gen.uniform(0.25, 0.75, 2)
            radius = gen.uniform(0.04, 0.2)
            field = 1 - ((yy - cy) ** 2 + (xx - cx) ** 2) / radius**2 + 0.5 * noise
            out[i] = field > 0  # class 1: the prior knows one foreground class
    return torch.from_numpy(out)
