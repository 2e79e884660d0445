"""MRI reconstruction: from the zero-filled image of an undersampled Cartesian k-space to the fully
sampled slice.

A dataset stores the fully sampled magnitude slices (float32 in [0, 1], each volume's maximum at 1) as its
images and each slice's brain foreground mask as its targets; the task undersamples on the fly. The
masks follow fastMRI (`fedistill.data.mri.masks`): random or equispaced columns at an acceleration, a
fully sampled centre that counts inside the budget, one seeded mask per slice (slice i of a set always
gets the same mask; `train_masks = "per-step"` draws fresh ones for every training batch instead,
as fastMRI trains) or one fixed mask. k-space is simulated from magnitude images, so it has no phase.
By default the network learns a correction to its input (`residual`: output = zero-filled image +
net(zero-filled image)), and a data-consistency step puts the measured lines back into that output's
k-space (`data_consistency`; learnt residuals and data consistency are cascaded networks' habits, e.g.
Schlemper et al. 2017 and fastMRI's VarNet; fastMRI's U-Net baseline and FL-MRCM's code have neither), so a
network that has learnt nothing returns nearly its input rather than an image worse than it. The output is
the magnitude of that image: the measured lines are exact before the magnitude, and since the mixed
k-space is not conjugate-symmetric they move a little after it (the data have no phase, so each measured
column also fixes its mirror column; using that is not done here), and a second pass of the step changes
the image again. `task.residual = false` / `task.data_consistency = false` give the
plain image-to-image network. The net's output is in units of its input slice's spread (`output_scale =
"slice"`): the correction is std(zero-filled) x net, and without the residual the image is mean + std x net,
fastMRI's per-slice normalisation seen from the output side (its U-Net's instance norm already makes the net
blind to its input's offset and scale, so only the output needs the slice's units). `"none"` takes the net's
output as it is.

Loss: L1 (default) or L2 between output and target, as the protocol the paper follows, on the images'
own scale ([0, 1] per volume; fastMRI and FL-MRCM take it after normalising both by the input slice's mean
and std, which weighs a dim slice more). Metrics: SSIM,
PSNR and NMSE per volume with the maximum of the volume's test slices as data range (fastMRI's
evaluation; a volume's held-out slabs may not hold its maximum of 1), then averaged over volumes,
overall and per test source. FedIOD on this task compares output images and conditions its generator
on the brain's foreground mask.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.mri.kspace import data_consistency, undersample, zero_filled
from fedistill.data.mri.masks import MASK_KINDS, MASK_MODES, SliceMasks, mask_function
from fedistill.errors import ConfigError
from fedistill.metrics.reconstruction import ReconstructionScores
from fedistill.tasks.base import Inputs, Task
from fedistill.tasks.conditions import BrainForeground
from fedistill.tasks.per_pixel_batches import per_pixel_batches

OUTPUT_SCALES = ("slice", "none")
#: per-slice: a training slice keeps its one seeded mask every epoch; per-step: fresh masks every batch
TRAIN_MASKS = ("per-slice", "per-step")
#: the smallest std a slice's unit takes: an empty (all-zero) slice keeps its zero-filled input
MIN_SLICE_STD = 1e-6


@dataclass(frozen=True)
class Reconstruction(Task):
    """MRI reconstruction: from the zero-filled image of an undersampled k-space to the fully sampled slice;
    SSIM and PSNR."""

    name = "reconstruction"
    target = "image"
    headline = "ssim"
    columns = (("ssim", "SSIM", "float4"), ("psnr", "PSNR dB", "float"))
    per_pixel = True
    outputs_images = True
    condition = BrainForeground()

    acceleration: float = 4.0  # the undersampling factor: about 1 in `acceleration` k-space columns kept
    center_fraction: float = 0.08  # the fraction of low-frequency (central) columns always kept
    mask: str = "random"  # random | equispaced | equispaced-exact (fastMRI's mask functions)
    mask_mode: str = "per-slice"  # per-slice (seeded by the slice's index) | fixed (one mask for all)
    mask_seed: int = 0  # the seed the masks are drawn from (with the slice's index when per-slice)
    train_masks: str = "per-slice"  # per-slice (as evaluated) | per-step (fresh per training batch)
    loss_kind: str = "l1"  # l1 | l2
    residual: bool = True  # output = zero-filled input + net(input)
    data_consistency: bool = True  # the measured k-space lines put back into the output
    output_scale: str = "slice"  # slice: the net's output in units of its input slice's std | none

    def __post_init__(self) -> None:
        if self.mask not in MASK_KINDS:
            raise ConfigError(f"task.mask must be one of {', '.join(MASK_KINDS)}, got {self.mask!r}")
        if self.mask_mode not in MASK_MODES:
            raise ConfigError(
                f"task.mask_mode must be one of {', '.join(MASK_MODES)}, got {self.mask_mode!r}"
            )
        if self.train_masks not in TRAIN_MASKS:
            raise ConfigError(
                f"task.train_masks must be one of {', '.join(TRAIN_MASKS)}, got {self.train_masks!r}"
            )
        if self.train_masks == "per-step" and self.mask_mode == "fixed":
            raise ConfigError(
                'task.train_masks = "per-step" needs random masks, but mask_mode = "fixed" measures '
                'every slice with one mask: use mask_mode = "per-slice" or train_masks = "per-slice"'
            )
        if self.loss_kind not in ("l1", "l2"):
            raise ConfigError(f"task.loss_kind must be l1 or l2, got {self.loss_kind!r}")
        if self.output_scale not in OUTPUT_SCALES:
            raise ConfigError(
                f"task.output_scale must be one of {', '.join(OUTPUT_SCALES)}, got {self.output_scale!r}"
            )
        _ = self.masks  # builds the mask function: bad accelerations/fractions fail here, before any work

    @property
    def masks(self) -> SliceMasks:
        """The task's slice masks: its mask function (kind, centre fraction, acceleration), mode and seed."""
        func = mask_function(self.mask, (self.center_fraction,), (self.acceleration,))
        return SliceMasks(func, self.mask_mode, self.mask_seed)

    def check(self, info: DatasetInfo, data: ImageSet, what: str) -> None:
        super().check(info, data, what)
        if data.x.dtype != torch.float32:
            raise ValueError(f"{what}: reconstruction needs float32 images in [0, 1], got {data.x.dtype}")
        if any(m != 0 for m in info.mean) or any(s != 1 for s in info.std):
            raise ValueError(
                f"{what}: dataset {info.name!r} declares mean {tuple(info.mean)} and std {tuple(info.std)}, "
                "but a reconstruction is trained and scored on the slices' own [0, 1] scale: declare "
                "mean 0 and std 1 (the net's input is put in its slice's units by task.output_scale)"
            )

    def usual_augment(self, info: DatasetInfo) -> bool:
        """Random flips and quarter turns of each slice before its k-space is simulated. Why: a site holds
        a few dozen slices of one volume; on Table 9 (brain-t1-sites, seed 0) they lifted FedIOD's
        student from SSIM 0.6922 to 0.7009 and the Standalone models' mean from below the zero-filled
        input on one volume to above it on all four (FedAvg -0.004, Centralized -0.024, still the best),
        and on the reconstruction demo Centralized to the best row
        (docs/methods/fediod/per-pixel-notes.md)."""
        return True

    def output_channels(self, info: DatasetInfo) -> int:
        return info.channels

    def step_masks(self, generator: torch.Generator) -> SliceMasks:
        """One training batch's masks under `train_masks = "per-step"`: per-slice masks seeded by a draw
        from the batch's generator (seeded by the run's seed, the site and the round, and advanced by
        every batch), so a slice gets a fresh mask each time it is trained on and a rerun the same ones."""
        draw = int(torch.randint(0, 2**31 - 1, (), generator=generator))
        return SliceMasks(self.masks.func, "per-slice", draw)

    def undersampled(
        self, x: torch.Tensor, indices: torch.Tensor, masks: SliceMasks | None = None
    ) -> tuple[torch.Tensor, ...]:
        """(zero-filled image, measured k-space, mask) of the slices `x` (B, 1, H, W) in [0, 1], with
        `masks` or the task's own."""
        mask = (masks or self.masks)(indices, x.shape[-1]).to(x.device)
        kspace, zero_filled = undersample(x, mask)
        return zero_filled.to(x.dtype), kspace, mask

    def net_inputs(self, x: torch.Tensor, indices: torch.Tensor, masks: SliceMasks | None = None) -> Inputs:
        """What `predict` takes for fully sampled slices `x`: the zero-filled images, or with data
        consistency (zero-filled, measured k-space, mask); slice i undersampled with mask `indices[i]`
        of `masks` (the task's own by default)."""
        zero_filled, kspace, mask = self.undersampled(x, indices, masks)
        return (zero_filled, kspace, mask) if self.data_consistency else zero_filled

    def batches(
        self,
        data: ImageSet,
        info: DatasetInfo,
        batch_size: int,
        *,
        shuffle: bool,
        generator: torch.Generator | None,
        augment: bool,
        drop_last: bool = False,
    ) -> Iterator[tuple[Inputs, torch.Tensor]]:
        """(inputs, target images): inputs are the zero-filled images, or with data consistency the
        tuple (zero-filled, measured k-space, mask). Batches drawn with a generator (training's) get
        fresh masks from it under `train_masks = "per-step"`; evaluation's (none) keep the per-slice ones."""
        fresh = self.train_masks == "per-step" and generator is not None
        for x, _, idx in per_pixel_batches(
            data, info, batch_size, shuffle=shuffle, generator=generator, augment=augment, drop_last=drop_last
        ):
            yield self.net_inputs(x, idx, self.step_masks(generator) if fresh else None), x

    def predict(self, model: nn.Module, inputs: Inputs) -> torch.Tensor:
        """The reconstruction: the net's output (plus its input with `residual`), its measured lines
        replaced by the measurement when `inputs` carry them (data consistency)."""
        if isinstance(inputs, torch.Tensor):
            return self.corrected(inputs, model(inputs))
        zero_filled, kspace, mask = inputs
        return data_consistency(self.corrected(zero_filled, model(zero_filled)), kspace, mask)

    def _base_and_unit(self, zero_filled: torch.Tensor) -> tuple[torch.Tensor | float, torch.Tensor | float]:
        """(what the net's output is added to, the unit it is in): the zero-filled input with `residual`, else
        the slice's mean under `output_scale = "slice"` or 0; the unit the slice's std, or 1."""
        if self.output_scale == "none":
            return (zero_filled if self.residual else 0.0), 1.0
        dims = tuple(range(1, zero_filled.dim()))
        std = zero_filled.std(dim=dims, keepdim=True).clamp_min(MIN_SLICE_STD)
        base = zero_filled if self.residual else zero_filled.mean(dim=dims, keepdim=True)
        return base, std

    def corrected(self, zero_filled: torch.Tensor, net_output: torch.Tensor) -> torch.Tensor:
        """The image a net's output stands for: the zero-filled input plus the output (a correction) with
        `residual`, the output itself without; under `output_scale = "slice"` the output is in units of the
        slice's std (and, without the residual, counted from the slice's mean)."""
        base, unit = self._base_and_unit(zero_filled)
        return base + unit * net_output

    def net_output_for(self, zero_filled: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        """The net output that `corrected` turns into `image`."""
        base, unit = self._base_and_unit(zero_filled)
        return (image - base) / unit

    def standalone(self, model: nn.Module) -> nn.Module:
        """A module that computes the reconstruction from the zero-filled image alone (what an exported file
        runs): `model` with its residual and output scale built in. Data consistency needs the measured
        k-space, which such a module does not take, so it is left to the caller."""
        if not self.residual and self.output_scale == "none":
            return model
        return Corrected(model, self)

    def identity_baseline(self) -> Reconstruction:
        """This task for a net that returns its input (`nn.Identity`): no residual, no output scale."""
        return dataclasses.replace(self, residual=False, output_scale="none")

    def decode(self, outputs: torch.Tensor) -> torch.Tensor:
        """The reconstructed images themselves."""
        return outputs

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.l1_loss(outputs, targets) if self.loss_kind == "l1" else F.mse_loss(outputs, targets)

    def inputs_of(self, images: torch.Tensor, indices: torch.Tensor, seed: int) -> torch.Tensor:
        """The zero-filled images of the undersampled k-space of `images`, with the task's mask function
        and mode, the masks seeded by `seed` (a stream of its own, apart from any data set's); a fixed mask
        is the task's one mask (`mask_seed`), the pattern the data are measured with."""
        masks = self.masks if self.mask_mode == "fixed" else SliceMasks(self.masks.func, self.mask_mode, seed)
        mask = masks(indices, images.shape[-1]).to(images.device)
        # images normalised with the dataset's mean and std: reconstruction data have mean 0 and std 1,
        # so the images are in [0, 1] and go through the k-space as they are
        return zero_filled(images, mask).to(images.dtype)

    def trivial_baseline(self) -> tuple[str, nn.Module, Task] | None:
        """The undersampled input itself (after data consistency when on): what a net whose correction is
        zero returns, the floor a reconstruction must rise above."""
        label = "zero-filled input" + (" + data consistency" if self.data_consistency else "")
        return label, nn.Identity(), self.identity_baseline()

    def distilled_columns(self, info: DatasetInfo) -> int:
        """One: each pixel of an output image is a row with one value."""
        return 1

    def column_counts(self, data: ImageSet, info: DatasetInfo) -> torch.Tensor:
        """The number of slices: there are no classes, so a site's share is its share of all slices."""
        return torch.tensor([len(data)], dtype=torch.int64)

    def score(
        self,
        outputs: torch.Tensor,
        data: ImageSet,
        info: DatasetInfo,
        *,
        meta: Mapping[str, np.ndarray] | None = None,
        groups: Sequence[str] | None = None,
    ) -> dict[str, float]:
        """SSIM, PSNR, NMSE of output images (N, 1, H, W) per volume (`meta["subject"]`; each slice its own
        volume without it, blank slices left out), averaged over volumes; `ssim_<source>` etc. per source
        when `groups` name each slice's source. Outputs are clipped at 0 first, as a magnitude image has no
        negative pixel (fastMRI's evaluation does not clip; with data consistency, the default, the output
        is a magnitude already and the clip changes nothing)."""
        n = len(data)
        if n == 0:
            return self.empty_metrics()
        outputs = outputs.detach().cpu()
        loss = self.loss(outputs, data.x).item()
        targets, predictions = data.x.numpy(), outputs.clamp(min=0).numpy()
        sources = groups and [str(g) for g in groups]
        if meta and len(meta.get("subject", ())) == n:
            subjects = np.asarray(meta["subject"])
        else:
            # each slice its own volume: a blank slice (a volume's edge) has no data range, so no SSIM
            # or PSNR; it is left out of those means instead of stopping the evaluation
            kept = np.flatnonzero(targets.reshape(n, -1).max(axis=1) > 0)
            if len(kept) == 0:
                return {"ssim": math.nan, "psnr": math.nan, "nmse": math.nan, "loss": loss, "count": n}
            targets, predictions, subjects = targets[kept], predictions[kept], np.arange(n)[kept]
            sources = sources and [sources[i] for i in kept]
        scores = ReconstructionScores()
        scores.update(targets, predictions, subjects, sources)
        summary = scores.summary()
        metrics = {key: summary[key] for key in ("ssim", "psnr", "nmse")} | {"loss": loss, "count": n}
        for source, values in scores.by_source().items():
            metrics |= {f"{key}_{source}": values[key] for key in ("ssim", "psnr", "nmse")}
        return metrics


class Corrected(nn.Module):
    """A reconstruction net with the task's residual and output scale inside: `task.corrected(x, net(x))`."""

    def __init__(self, net: nn.Module, task: Reconstruction) -> None:
        super().__init__()
        self.net = net
        self.task = task

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.task.corrected(x, self.net(x))
