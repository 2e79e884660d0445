"""What G draws a batch from, and which site each sample is for.

Classification: z ~ N(0, I) (with the per-client mixture, z followed by the one-hot of the sample's
site). Per-pixel tasks: a label mask per sample, from the masks a site uploaded (AsynDGAN's and the
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

from fedistill.algorithms.fediod.task_view import TaskView
from fedistill.algorithms.shared.site_shares import from_uploads, owners, shares  # noqa: F401
from fedistill.data import portable_math


@dataclass
class Draw:
    """One batch drawn for the generator: its latent inputs, which site each sample is for, and its mask
    conditions."""

    latent: torch.Tensor  # z, or z with the site's one-hot; per-pixel: the mask's one-hot (and the site's)
    owner: torch.Tensor | None  # (B,) site positions, or None
    masks: torch.Tensor | None = None  # (B, H, W) int64 condition (per-pixel tasks)
    pair: torch.Tensor | None = None  # (B,) position of the mask in its site's upload, -1 for none


def prior_masks(view: TaskView, batch: int, rng: torch.Generator) -> torch.Tensor:
    """Masks the server draws from its own prior, knowing no site's labels: smooth random shapes, drawn
    as thresholded smoothed noise by the task's condition (`Condition.prior`: one blob of a random size
    and position per image, as a tumour; many small round nuclei at a random density; one large,
    roughly elliptical brain-like foreground)."""
    condition = view.condition
    size = view.info.image_size
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=rng))
    gen = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / max(size - 1, 1)
    out = np.zeros((batch, size, size), dtype=np.int64)
    for i in range(batch):
        noise = portable_math.gaussian_filter(gen.standard_normal((size, size)), sigma=size / 16)
        noise /= noise.std() + 1e-8
        out[i] = condition.prior(gen, noise, yy, xx)
    return torch.from_numpy(out)


def owner_planes(owner: torch.Tensor, sites: int, like: torch.Tensor) -> torch.Tensor:
    """Each sample's site as constant one-hot planes (B, sites, H, W) beside its mask's one-hot `like`, so
    a conditional G of the per-client mixture can draw each site's look for that site's masks."""
    onehot = torch.nn.functional.one_hot(owner.to(like.device), sites).to(like)
    return onehot[:, :, None, None].expand(-1, -1, *like.shape[-2:])
