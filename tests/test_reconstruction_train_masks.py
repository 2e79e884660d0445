"""`task.train_masks`: by default a training slice keeps its one seeded mask in every epoch; "per-step"
draws fresh masks for every training batch (fastMRI's training practice) from the batch's seeded stream,
while evaluation keeps the fixed per-slice masks."""

from __future__ import annotations

import pytest
import torch

from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.errors import ConfigError
from fedistill.tasks import Reconstruction
from fedistill.tasks.per_pixel_batches import per_pixel_batches

SIZE = 16
INFO = DatasetInfo("toy", 1, SIZE, 2, (0.0,), (1.0,), task="reconstruction")
DATA = ImageSet(torch.rand(4, 1, SIZE, SIZE), torch.ones(4, SIZE, SIZE, dtype=torch.int64))


def _epochs(task: Reconstruction, seed: int, epochs: int = 2) -> list[dict[int, torch.Tensor]]:
    """Each epoch's mask per slice index, as training draws them (one generator across the epochs)."""
    generator = torch.Generator().manual_seed(seed)
    masks_by_epoch = []
    for _ in range(epochs):
        by_slice = {}
        batches = task.batches(DATA, INFO, 2, shuffle=True, generator=generator, augment=False)
        for (_, _, mask), target in batches:
            for row, image in zip(mask.reshape(len(mask), -1), target, strict=True):
                by_slice[next(i for i in range(len(DATA)) if torch.equal(DATA.x[i], image))] = row
        masks_by_epoch.append(by_slice)
    return masks_by_epoch


def test_per_step_masks_change_between_epochs_and_repeat_with_the_seed():
    task = Reconstruction(train_masks="per-step")
    first, second = _epochs(task, seed=5)
    assert not torch.equal(first[0], second[0])  # the same slice, a fresh mask in the next epoch
    rerun = _epochs(task, seed=5)
    assert all(torch.equal(a[i], b[i]) for a, b in zip((first, second), rerun, strict=True) for i in a)


def test_per_step_leaves_evaluation_inputs_unchanged():
    model = torch.nn.Conv2d(1, 1, 1)
    default, per_step = Reconstruction(), Reconstruction(train_masks="per-step")
    assert torch.equal(default.outputs(model, DATA, INFO), per_step.outputs(model, DATA, INFO))
    index = torch.arange(4)
    assert torch.equal(default.net_inputs(DATA.x, index)[0], per_step.net_inputs(DATA.x, index)[0])


def test_the_default_trains_on_each_slice_s_one_mask_as_before():
    """The default's training inputs are the per-slice masks, and it draws nothing more from the
    generator, so shuffling and augmentation follow the same stream as before the option existed."""
    task = Reconstruction()
    assert task.train_masks == "per-slice"
    first, second = _epochs(task, seed=5)
    expected = task.masks(list(range(4)), SIZE).reshape(4, SIZE)
    assert all(torch.equal(epoch[i], expected[i]) for epoch in (first, second) for i in range(4))
    ours, reference = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    list(task.batches(DATA, INFO, 2, shuffle=True, generator=ours, augment=True))
    list(per_pixel_batches(DATA, INFO, 2, shuffle=True, generator=reference, augment=True))
    assert torch.equal(ours.get_state(), reference.get_state())


def test_train_masks_is_checked():
    with pytest.raises(ConfigError, match=r"per-slice, per-step.*'per-epoch'"):
        Reconstruction(train_masks="per-epoch")
    with pytest.raises(ConfigError, match="fixed"):
        Reconstruction(train_masks="per-step", mask_mode="fixed")
