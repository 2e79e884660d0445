"""The in-memory dataset types every loader returns and every algorithm consumes."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np
import torch


def is_plain_int(value: object) -> bool:
    """An integer option's check: Python's bool is an int too, but `true` is no pixel count or size."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class TextInfo:
    """How a text dataset's token ids were made, for the models that read them: the tokenizer of the
    local model folder `tokenizer`, ids below `vocab_size`, padded with `pad_id` to at most `max_length`
    tokens (the attention mask is `ids != pad_id`)."""

    tokenizer: str
    vocab_size: int
    pad_id: int
    max_length: int


@dataclass(frozen=True)
class DatasetInfo:
    """What models and transforms need to know about a dataset.

    A text dataset (`text` set) has channels 1, mean 0 and std 1, and `image_size` is its sequence
    length; nothing normalises or augments token ids."""

    name: str
    channels: int
    image_size: int  # square images: height == width
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_padding: int = 0  # random-crop padding used by the training augmentation (0 = no crop)
    horizontal_flip: bool = False  # flip is wrong for digits and letters, right for natural images
    class_names: tuple[str, ...] = field(default=())
    # What a target is and how a model is trained and scored: the name of a task in fedistill.tasks
    # (classification, semantic-segmentation, instance-segmentation, reconstruction, text-classification).
    # For the segmentation tasks `num_classes` counts pixel classes (background included).
    task: str = "classification"
    text: TextInfo | None = None  # token-id inputs: how they were tokenised (None: images)

    def to_json(self) -> str:
        """These facts as JSON: written beside a trained model, so it can be used without the dataset."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DatasetInfo:
        """The facts `to_json` wrote; ValueError when `text` is not such a record."""
        try:
            fields = json.loads(text)
            text_info = fields.pop("text", None)
            tuples = {k: tuple(fields[k]) for k in ("mean", "std", "class_names") if k in fields}
            return cls(**{**fields, **tuples}, text=None if text_info is None else TextInfo(**text_info))
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a dataset record ({exc})") from None


@dataclass
class ImageSet:
    """Images (N, C, H, W) and their targets; normalisation happens per batch.

    Images are uint8 (0..255) or float32 in [0, 1] (reconstruction keeps the precision of its source);
    texts are int64 token ids (N, L), padded at the end (`DatasetInfo.text`). Targets are int64: one
    class per image or text (N,) for classification, or one value per pixel (N, H, W):
    a class per pixel (semantic segmentation), an instance id per pixel (instance segmentation, 0 =
    background), or the condition of a reconstruction task (the foreground mask).
    """

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        image = self.x.dtype in (torch.uint8, torch.float32) and self.x.dim() == 4
        if not image and not self.tokens:
            raise ValueError(
                "images must be uint8 or float32 (N, C, H, W) and texts int64 token ids (N, L), got "
                f"{self.x.dtype} {tuple(self.x.shape)}"
            )
        n = self.x.shape[0]
        per_pixel = (n, *self.x.shape[2:])
        if self.y.dtype != torch.int64 or tuple(self.y.shape) not in ((n,), per_pixel):
            raise ValueError(
                f"targets must be int64 (N,) or (N, H, W) matching the images, got {self.y.dtype} "
                f"{tuple(self.y.shape)} for images {tuple(self.x.shape)}"
            )

    @property
    def tokens(self) -> bool:
        """Whether the samples are token ids (N, L) rather than images."""
        return self.x.dtype == torch.int64 and self.x.dim() == 2

    @property
    def per_pixel(self) -> bool:
        """Whether the targets are per pixel (segmentation, reconstruction) rather than per image."""
        return self.y.dim() == 3

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, indices) -> ImageSet:
        """The samples at `indices`, in that order; or, given a boolean mask of one entry per sample, the
        samples it marks (as tensor indexing does)."""
        idx = torch.as_tensor(np.asarray(indices) if isinstance(indices, range) else indices)
        if idx.dtype == torch.bool:  # cast to int64, a mask would pick samples 0 and 1
            if tuple(idx.shape) != (len(self),):
                raise ValueError(
                    f"a boolean mask needs one entry per sample ({len(self)}), got {tuple(idx.shape)}"
                )
            idx = idx.nonzero().flatten()
        idx = idx.to(torch.int64)
        return ImageSet(self.x[idx], self.y[idx])


@dataclass
class LoadedDataset:
    """A loaded dataset: its description, train and test sets, and where the data give them, its natural
    groups."""

    info: DatasetInfo
    train: ImageSet
    test: ImageSet
    # Natural groups, for datasets whose sites are given rather than drawn (the `natural` partitioner):
    # an int per sample, in the protocol's order (e.g. BraTS subjects sorted by tumour size, one organ
    # per group for TCGA's cross-organ split); test groups name the test source of each test sample.
    train_groups: np.ndarray | None = None
    test_groups: np.ndarray | None = None
    group_names: tuple[str, ...] = field(default=())
    # The subject (volume, whole image) of each training sample, where a group holds several: a site that
    # is one source of many subjects validates on whole subjects of its own, not on a slab across two.
    train_subject_ids: np.ndarray | None = None
    # What one natural group's samples are the parts of, where they belong together ("subject", "case": the
    # slices of one volume); a partition other than `natural` cuts samples, not groups, and the run says so.
    whole_groups: str = ""
    # Per-test-sample facts a task's metrics need, each an array of len(test): "subject" (the volume or
    # whole image a slice or patch came from: per-volume data range, stitching patches back), "row" and
    # "col" (a patch's top-left corner in its whole image), "height" and "width" (the whole image's size).
    test_meta: dict[str, np.ndarray] = field(default_factory=dict)

    def spread_over_sites(self, partition: str, clients: int) -> str:
        """What a partition other than `natural` does to groups whose samples belong together (the slices
        of one volume), and the fix; "" where it does not apply."""
        unit = self.whole_groups
        if not unit or partition == "natural" or clients < 2:
            return ""
        return (
            f"{self.info.name}: the slices of one {unit} are spread over several sites (partition "
            f'{partition!r} cuts slices, not {unit}s); partition = "natural" (--partition natural) gives '
            f"each site whole {unit}s"
        )
