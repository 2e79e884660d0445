"""The default dataset: scikit-learn's embedded 8x8 handwritten digits (1,797 images, no files needed).

scikit-learn ships no train/test split, so a fixed one is made here: a stratified
80/20 split with `train_test_split(test_size=0.2, stratify=y, random_state=0)`,
which gives 1,437 training and 360 test images and is the same on every machine.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from fedistill.data.base import DatasetInfo, ImageSet, LoadedDataset, is_plain_int
from fedistill.errors import ConfigError

TEST_SIZE = 0.2
SPLIT_SEED = 0


def load_digits_dataset(crop_padding: int = 0) -> LoadedDataset:
    """Digits as uint8 (N, 1, 8, 8): the 0..16 grey levels scaled to 0..255 with round(v * 255 / 16).

    No augmentation is usual for 8x8 digits; `crop_padding` > 0 makes `augment = "auto"` train on random
    crops with that much black padding (one pixel is an eighth of the image)."""
    if not is_plain_int(crop_padding) or not 0 <= crop_padding < 8:
        raise ConfigError(f"digits option crop_padding must be an integer from 0 to 7, got {crop_padding!r}")
    bunch = load_digits()
    x = np.rint(bunch.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)[:, None, :, :]
    y = bunch.target.astype(np.int64)
    idx_train, idx_test = train_test_split(
        np.arange(len(y)), test_size=TEST_SIZE, stratify=y, random_state=SPLIT_SEED
    )
    train = ImageSet(torch.from_numpy(x[idx_train]), torch.from_numpy(y[idx_train]))
    test = ImageSet(torch.from_numpy(x[idx_test]), torch.from_numpy(y[idx_test]))
    pixels = train.x.double() / 255.0  # normalisation constants from the training split only
    info = DatasetInfo(
        name="digits",
        channels=1,
        image_size=8,
        num_classes=10,
        mean=(float(pixels.mean()),),
        std=(float(pixels.std()),),
        class_names=tuple(str(d) for d in range(10)),
        crop_padding=crop_padding,
    )
    return LoadedDataset(info=info, train=train, test=test)
