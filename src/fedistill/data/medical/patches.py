"""Cut whole images into square patches and stitch per-pixel predictions back.

Histology images (1000×1000 TCGA, 500/600 CPM-17, 512 TNBC) are trained and predicted on in
`size`×`size` patches, but scored on the whole image (the FedIOD protocol), so every patch remembers
where it came from. Patches start every `stride` pixels; when the image is not a whole number of strides
long, one more patch sits flush with the far border (overlapping its neighbour), so no padding is needed
for images at least `size` long. Shorter sides are padded at the bottom/right with zeros: black pixels
that are labelled background, so no nucleus is claimed where none is shown. Stitching averages the
overlapping predictions and drops the padding, so `stitch(extract_patches(x)) == x` exactly.

Instance targets are relabelled 1..n per patch for training, which loses which piece of a nucleus cut by
a patch border belongs with which; patched test sets therefore also keep each patch's whole-image ids
(`test_meta["image_instances"]`), which `stitch_instances` puts back together into the exact whole-image
instance map that whole-image metrics (AJI, object Dice) need.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from skimage.segmentation import relabel_sequential


def patch_starts(length: int, size: int, stride: int) -> list[int]:
    """Start offsets along one axis: every `stride`, plus one patch flush with the far end. A stride longer
    than the patch would leave gaps no patch covers, and is a ValueError."""
    if length < 1 or size < 1 or stride < 1:
        raise ValueError(f"length, size and stride must be positive, got {length}, {size}, {stride}")
    if stride > size:
        raise ValueError(f"stride {stride} is longer than the patch size {size}: patches would leave gaps")
    if length <= size:
        return [0]
    starts = list(range(0, length - size + 1, stride))
    if starts[-1] != length - size:
        starts.append(length - size)
    return starts


def extract_patches(
    image: np.ndarray, size: int, stride: int, pad_mode: str = "constant"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Patches (P, ..., size, size) of an image (..., H, W), with each patch's top-left row and column.

    Sides shorter than `size` are padded at the end: zeros by default, or "reflect" for images where a
    mirrored border is preferable (a target map should then be cut with zeros).
    """
    height, width = image.shape[-2:]
    pad_h, pad_w = max(0, size - height), max(0, size - width)
    if pad_h or pad_w:
        widths = [(0, 0)] * (image.ndim - 2) + [(0, pad_h), (0, pad_w)]
        image = np.pad(image, widths, mode=pad_mode)
    rows, cols = patch_starts(height, size, stride), patch_starts(width, size, stride)
    grid = [(r, c) for r in rows for c in cols]
    patches = np.stack([image[..., r : r + size, c : c + size] for r, c in grid])
    return patches, np.array([r for r, _ in grid], np.int64), np.array([c for _, c in grid], np.int64)


def stitch(
    patches: np.ndarray | torch.Tensor, rows: np.ndarray, cols: np.ndarray, height: int, width: int
) -> np.ndarray:
    """Average patches (P, ..., S, S) placed at (rows, cols) into one (..., height, width) float64 map."""
    values = patches.detach().cpu().numpy() if isinstance(patches, torch.Tensor) else np.asarray(patches)
    size = values.shape[-1]
    full_h, full_w = max(height, size), max(width, size)
    total = np.zeros((*values.shape[1:-2], full_h, full_w), np.float64)
    count = np.zeros((full_h, full_w), np.float64)
    for patch, r, c in zip(values, rows, cols, strict=True):
        total[..., r : r + size, c : c + size] += patch
        count[r : r + size, c : c + size] += 1
    if (count[:height, :width] == 0).any():
        raise ValueError("the patches do not cover the whole image; pass every patch of it")
    return (total / np.maximum(count, 1))[..., :height, :width]


def stitch_by_meta(
    patches: np.ndarray | torch.Tensor, meta: Mapping[str, np.ndarray]
) -> dict[int, np.ndarray]:
    """Stitch a whole test set's patch predictions into one map per whole image (`meta["subject"]`), using
    the patch positions and image sizes a patched dataset records in `test_meta`."""
    subjects = np.asarray(meta["subject"])
    if len(subjects) != len(patches):
        raise ValueError(f"{len(patches)} patches but test_meta describes {len(subjects)}")
    wholes: dict[int, np.ndarray] = {}
    for subject in np.unique(subjects):
        idx = np.flatnonzero(subjects == subject)
        height, width = int(meta["height"][idx[0]]), int(meta["width"][idx[0]])
        wholes[int(subject)] = stitch(
            patches[torch.as_tensor(idx)] if isinstance(patches, torch.Tensor) else patches[idx],
            np.asarray(meta["row"])[idx],
            np.asarray(meta["col"])[idx],
            height,
            width,
        )
    return wholes


def stitch_instances(patches: np.ndarray, meta: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
    """Whole-image instance maps (int64) from patches whose ids agree across overlaps, such as
    `test_meta["image_instances"]`: every patch is written back in place (overlaps hold equal ids)."""
    subjects = np.asarray(meta["subject"])
    rows, cols = np.asarray(meta["row"]), np.asarray(meta["col"])
    size = patches.shape[-1]
    wholes: dict[int, np.ndarray] = {}
    for subject in np.unique(subjects):
        idx = np.flatnonzero(subjects == subject)
        height, width = int(meta["height"][idx[0]]), int(meta["width"][idx[0]])
        canvas = np.zeros((max(height, size), max(width, size)), np.int64)
        for i in idx:
            canvas[rows[i] : rows[i] + size, cols[i] : cols[i] + size] = patches[i]
        wholes[int(subject)] = canvas[:height, :width]
    return wholes


def relabel(instances: np.ndarray) -> np.ndarray:
    """Instance ids renumbered 1..n in order of first id (0 stays background), as int64."""
    out, _, _ = relabel_sequential(np.asarray(instances, dtype=np.int64))
    return out.astype(np.int64, copy=False)
