"""A model a run trained, ready to predict: the module with the task it serves and the dataset facts
its inputs must match (image size, channels, normalisation, class names).

`preprocess` is the run's own evaluation preprocessing (`data.transforms.to_float`): uint8 images are
divided by 255, float images are taken to be in [0, 1] already, then each channel is normalised with the
training split's mean and std. So `predict` on a run's test images reproduces the run's test metrics,
and for a reconstruction model `reconstruct` does (it undersamples fully sampled slices with the run's
masks and keeps the measured lines, as the run's evaluation did; `predict` takes zero-filled images).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo
from fedistill.data.transforms import to_float
from fedistill.errors import UserError
from fedistill.inference.forward import chunks
from fedistill.tasks import Task


class InputError(UserError, ValueError):
    """Inputs a model cannot take: the wrong shape, channels, size or type."""


#: Tasks whose outputs are class scores (per sample or per pixel), which `predict_proba` turns into
#: probabilities; a reconstruction net's outputs are images.
SCORED_TASKS = ("classification", "text-classification", "semantic-segmentation", "instance-segmentation")
#: The float values `preprocess` takes. Images in [-1, 1], already normalised ones and 0..255 as floats lie
#: outside; a bicubic resize's overshoot (about 0.11 below 0) passes, and up to 2, a zero-filled MRI
#: slice's magnitude, which passes 1.
FLOAT_RANGE = (-0.25, 2.0)


def as_tensor(images: Any) -> torch.Tensor:
    """`images` as a tensor; InputError naming what was given when it is no array of numbers (a path, text,
    images of several sizes in one list)."""
    if isinstance(images, torch.Tensor):
        return images
    given = f"an array of {images.dtype}" if isinstance(images, np.ndarray) else f"a {type(images).__name__}"
    try:
        # contiguous: a flipped view (`images[..., ::-1]`, OpenCV's BGR reversed) has negative strides,
        # which torch cannot wrap
        return torch.as_tensor(np.ascontiguousarray(images))
    except (TypeError, ValueError):
        raise InputError(
            f"images are arrays of numbers (a NumPy array or a tensor, uint8 or float), got {given}; "
            "read image files first (or use `fedistill predict`), and stack images of one size"
        ) from None


@dataclass
class TrainedModel:
    """The model `name` (models/<name>.safetensors) that `algorithm` trained in the run `run_dir`,
    rebuilt as the registry's `architecture` from the run's `config`; `module` is in eval mode."""

    module: nn.Module
    task: Task
    info: DatasetInfo
    algorithm: str
    config: RunConfig
    name: str = "global"
    architecture: str = ""
    run_dir: Path | None = None
    selection: str = ""  # which epoch's model it is (`selection.which_model`): the selected or the last

    def __repr__(self) -> str:
        """What the model is, in one line: the module's layers and the run's config are attributes."""
        return (
            f"TrainedModel(algorithm={self.algorithm!r}, name={self.name!r}, architecture="
            f"{self.architecture!r}, task={self.task.name!r}, input_shape={self.input_shape}, "
            f"selection={self.selection!r}, run_dir={self.run_dir!r})"
        )

    @property
    def device(self) -> torch.device:
        """The device of the model's parameters; the CPU for a model without any."""
        first = next(self.module.parameters(), None)
        return first.device if first is not None else torch.device("cpu")

    def to(self, device: str | torch.device) -> TrainedModel:
        """Move the module to `device` (in place) and return self; a device this machine lacks is a
        ConfigError saying what it has."""
        from fedistill import devices

        self.module.to(devices.resolve(device))
        return self

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One input's shape: (channels, size, size) for images, (length,) for token ids."""
        if self.info.text is not None:
            return (self.info.text.max_length,)
        return (self.info.channels, self.info.image_size, self.info.image_size)

    def preprocess(self, images: Any) -> torch.Tensor:
        """Images as the model takes them: uint8 (0..255) or float in [0, 1], (N, H, W) for one channel or
        (N, C, H, W), a NumPy array or a tensor -> normalised float32 (N, C, H, W) on the model's device.
        Token ids (N, L) of a text model pass as they are."""
        x = as_tensor(images)
        if self.info.text is not None:
            text = self.info.text
            if x.dim() != 2 or x.dtype.is_floating_point or x.dtype == torch.bool:
                raise InputError(f"a text model takes token ids (N, L), got {x.dtype} {tuple(x.shape)}")
            if x.shape[1] > text.max_length:  # the model never saw positions past its training length
                raise InputError(
                    f"token ids are {x.shape[1]} long, more than the {text.max_length} the model was trained "
                    f"on; encode with max_length={text.max_length} (fedistill.data.text.encode does)"
                )
            if x.numel() and (int(x.min()) < 0 or int(x.max()) >= text.vocab_size):
                raise InputError(
                    f"token ids must lie in [0, {text.vocab_size}) (the tokenizer {text.tokenizer}'s), got "
                    f"[{int(x.min())}, {int(x.max())}]"
                )
            return x.to(torch.int64).to(self.device)
        c, s = self.info.channels, self.info.image_size
        given = tuple(x.shape)  # the error names the shape the caller passed
        if x.dim() == 3 and c == 1:
            x = x[:, None]
        if x.dim() != 4 or tuple(x.shape[1:]) != (c, s, s):
            single = f" or (N, {s}, {s})" if c == 1 else ""
            raise InputError(f"{self.info.name} images are (N, {c}, {s}, {s}){single}, got shape {given}")
        if x.dtype != torch.uint8 and not x.dtype.is_floating_point:
            raise InputError(f"images must be uint8 (0..255) or float in [0, 1], got {x.dtype}")
        if x.dtype.is_floating_point and not bool(torch.isfinite(x).all()):  # NaN passes every comparison
            raise InputError("images hold NaN or infinite values; replace them before predicting")
        low, high = (float(x.min()), float(x.max())) if x.dtype.is_floating_point and x.numel() else (0, 0)
        if low < FLOAT_RANGE[0] or high > FLOAT_RANGE[1]:  # another scale would be read as it is, silently
            scale = (
                "divide each volume by its maximum (the run's slices were scaled so, per volume)"
                if self.task.outputs_images  # MRI in a scanner's units, not 8-bit images
                else "pass uint8 for 0..255, divide by 255, map [-1, 1] with (x + 1) / 2"
            )
            raise InputError(
                f"float images must lie in [0, 1], got values in [{low:.4g}, {high:.4g}]; {scale}, and do "
                "not normalise: the model normalises"
            )
        return to_float(x.detach().cpu(), self.info).to(self.device)

    @torch.no_grad()
    def outputs(self, images: Any, batch_size: int = 512) -> torch.Tensor:
        """The module's raw outputs on the CPU: logits (N, classes), per-pixel logits (N, classes, H, W)
        or images (N, C, H, W)."""
        x = self.preprocess(images)
        self.module.eval()
        if not len(x):  # the shape of an answer, with no rows
            return self.task.predict(self.module, self._example()).cpu()[:0]
        return torch.cat([self.task.predict(self.module, x[s]).cpu() for s in chunks(len(x), batch_size)])

    def _example(self) -> torch.Tensor:
        """One input of zeros, on the model's device (an empty batch's answer takes its shape)."""
        dtype = torch.int64 if self.info.text is not None else torch.float32
        return torch.zeros((1, *self.input_shape), dtype=dtype, device=self.device)

    @torch.no_grad()
    def reconstruct(self, images: Any, batch_size: int = 512, first_index: int = 0) -> torch.Tensor:
        """Reconstructions (N, 1, H, W) of fully sampled slices as the run scored its test slices: slice i
        undersampled with the run's mask of index `first_index + i` (the test set's own numbering from
        0), through the net (and its residual), and, when the run kept them, the measured lines put back
        (data consistency). On the run's test images this reproduces its SSIM and PSNR."""
        net_inputs = getattr(self.task, "net_inputs", None)  # a reconstruction task's (Reconstruction)
        if net_inputs is None:
            raise InputError(f"reconstruct is for reconstruction models; this one is {self.task.name}")
        x = self.preprocess(images)
        self.module.eval()
        parts = []
        for part in chunks(len(x), batch_size):
            inputs = net_inputs(x[part], torch.arange(part.start, part.stop) + int(first_index))
            parts.append(self.task.predict(self.module, inputs).cpu())
        return torch.cat(parts) if parts else torch.zeros((0, *self.input_shape))

    def predict(self, images: Any, batch_size: int = 512) -> torch.Tensor:
        """Class ids (N,) for classification; a class per pixel (N, H, W) for semantic segmentation; an
        instance id per pixel (N, H, W), 0 the background, for instance segmentation; images (N, C, H, W)
        for reconstruction (from the zero-filled images the net takes, without data consistency: from fully
        sampled slices, `reconstruct` scores as the run did)."""
        return self.task.decode(self.outputs(images, batch_size))

    def predict_proba(self, images: Any, batch_size: int = 512) -> torch.Tensor:
        """Class probabilities: (N, classes), or (N, classes, H, W) per pixel for segmentation."""
        if self.task.name not in SCORED_TASKS:
            raise InputError(f"predict_proba needs class scores; a {self.task.name} model outputs images")
        return self.outputs(images, batch_size).softmax(1)
