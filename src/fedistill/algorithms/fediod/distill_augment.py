"""The paper's augmentation of the student's distillation batches on segmentation
(`fediod.distill_augment`): "we randomly crop the generated image x to 224 x 224 and randomly rotate and
flip images as data augmentation during distillation" (its BraTS G draws 240 x 240 images).

Each image is cropped to 224/240 of its side at a random position and resized back to its size, then
flipped and turned by a multiple of 90 degrees (`joint_flip_rotate`, the per-pixel tasks' training
augmentation), and its per-pixel targets go through the same crop, resize, flips and turns: the teachers'
logits move with the pixels they were computed on. Resizing back keeps the student's input at the size
it is validated and tested at and every architecture's size constraints (a U-Net's poolings) satisfied,
as the paper's nets, trained on 224 px crops-and-resizes, always see 224 px.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedistill.tasks.per_pixel_batches import joint_flip_rotate

CROP_SHARE = 224 / 240
"""The side of the paper's crop over the side of G's image (BraTS: 224 of 240 pixels)."""


def crop_side(size: int) -> int:
    """The side of the random crop of an image `size` pixels wide (at least one pixel)."""
    return max(1, round(size * CROP_SHARE))


def augment_batch(
    x: torch.Tensor, targets: torch.Tensor, generator: torch.Generator, *, hard_columns: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Images x (B, C, H, W) and their per-pixel targets (B, T, H, W), each sample cropped at its own
    random position to `crop_side` of each side and resized back (bilinear; the last `hard_columns` target
    channels are class ids and take their nearest pixel's), then flipped and turned alike. Every draw comes
    from the CPU `generator`, so the same generator gives the same batch on any device."""
    b, _, h, w = x.shape
    side_h, side_w = crop_side(h), crop_side(w)
    tops = torch.randint(0, h - side_h + 1, (b,), generator=generator).tolist()
    lefts = torch.randint(0, w - side_w + 1, (b,), generator=generator).tolist()

    def cropped(maps: torch.Tensor, mode: str) -> torch.Tensor:
        crops = torch.stack(
            [m[:, t : t + side_h, s : s + side_w] for m, t, s in zip(maps, tops, lefts, strict=True)]
        )
        if mode == "bilinear":
            return F.interpolate(crops, size=(h, w), mode=mode, align_corners=False)
        return F.interpolate(crops, size=(h, w), mode=mode)

    soft = targets.shape[1] - hard_columns
    parts = [cropped(targets[:, :soft], "bilinear")]
    if hard_columns:
        parts.append(cropped(targets[:, soft:], "nearest-exact"))
    return joint_flip_rotate(cropped(x, "bilinear"), torch.cat(parts, dim=1), generator)
