"""Normalisation, random crop + flip and the batch iterator, checked by hand on tiny tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.transforms import augment, batches, normalize, random_shift, to_float
from fedistill.errors import ConfigError


def info(channels: int = 1, padding: int = 0, flip: bool = False) -> DatasetInfo:
    return DatasetInfo(
        name="t",
        channels=channels,
        image_size=3,
        num_classes=2,
        mean=(0.5,) * channels if channels == 1 else (0.5, 0.25, 0.0),
        std=(0.25,) * channels if channels == 1 else (0.25, 0.5, 1.0),
        crop_padding=padding,
        horizontal_flip=flip,
    )


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_to_float_normalises_per_channel() -> None:
    x = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 3, 1, 1)
    out = to_float(x, info(channels=3))
    assert out.dtype == torch.float32
    assert out.flatten().tolist() == pytest.approx([(0 - 0.5) / 0.25, (0.2 - 0.25) / 0.5, (1.0 - 0.0) / 1.0])
    assert torch.allclose(normalize(x.float() / 255, info(channels=3)), out)
    with pytest.raises(ValueError):
        to_float(x, info(channels=1))


def test_identity_without_crop_or_flip() -> None:
    x = torch.arange(18, dtype=torch.uint8).view(2, 1, 3, 3)
    assert torch.equal(augment(x, info(), gen()), x)


def test_crop_moves_content_by_the_drawn_offset() -> None:
    x = torch.arange(1, 10, dtype=torch.uint8).view(1, 1, 3, 3).repeat(64, 1, 1, 1)
    out = augment(x, info(padding=1), gen(3))
    assert out.shape == x.shape and out.dtype == torch.uint8
    g = gen(3)  # the same draws, replayed: row offsets first, then column offsets
    dy = torch.randint(0, 3, (64,), generator=g)
    dx = torch.randint(0, 3, (64,), generator=g)
    padded = F.pad(x, (1, 1, 1, 1))
    for i in range(64):
        assert torch.equal(out[i], padded[i, :, dy[i] : dy[i] + 3, dx[i] : dx[i] + 3])
    assert len({(int(a), int(b)) for a, b in zip(dy, dx, strict=True)}) == 9  # every offset occurs
    # by hand: offset (0, 0) shifts the image one pixel down and right, filling with black (0)
    i = next(k for k in range(64) if dy[k] == 0 and dx[k] == 0)
    assert out[i, 0].tolist() == [[0, 0, 0], [0, 1, 2], [0, 4, 5]]
    j = next(k for k in range(64) if dy[k] == 2 and dx[k] == 1)
    assert out[j, 0].tolist() == [[4, 5, 6], [7, 8, 9], [0, 0, 0]]


def test_random_shift_repeats_the_edge_pixels_into_the_gap() -> None:
    x = torch.arange(1.0, 10.0).view(1, 1, 3, 3).repeat(64, 1, 1, 1)
    out = random_shift(x, 1, gen(5))
    g = gen(5)
    dy = torch.randint(0, 3, (64,), generator=g)
    dx = torch.randint(0, 3, (64,), generator=g)
    i = next(k for k in range(64) if dy[k] == 0 and dx[k] == 0)  # one pixel down and right
    assert out[i, 0].tolist() == [[1, 1, 2], [1, 1, 2], [4, 4, 5]]
    j = next(k for k in range(64) if dy[k] == 2 and dx[k] == 1)  # one pixel up
    assert out[j, 0].tolist() == [[4, 5, 6], [7, 8, 9], [7, 8, 9]]
    assert torch.equal(random_shift(x, 0, gen(5)), x)


def test_flip_is_per_sample_with_half_probability() -> None:
    x = torch.arange(1, 10, dtype=torch.float32).view(1, 1, 3, 3).repeat(400, 2, 1, 1)
    out = augment(x, _info2(flip=True), gen(1))
    flipped = (out == x.flip(3)).flatten(1).all(1)
    same = (out == x).flatten(1).all(1)
    assert bool((flipped | same).all()) and 150 < int(flipped.sum()) < 250


def _info2(flip: bool) -> DatasetInfo:
    return DatasetInfo("t2", 2, 3, 2, (0.0, 0.0), (1.0, 1.0), horizontal_flip=flip)


def test_augment_is_deterministic_given_the_generator() -> None:
    x = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8, generator=gen(9))
    i = info(channels=3, padding=2, flip=True)
    assert torch.equal(augment(x, i, gen(5)), augment(x, i, gen(5)))
    assert not torch.equal(augment(x, i, gen(5)), augment(x, i, gen(6)))


def _images(n: int) -> ImageSet:
    """Image k is a flat grey of value 100 + k (never black) with label k."""
    x = (100 + torch.arange(n, dtype=torch.uint8)).view(n, 1, 1, 1).expand(n, 1, 3, 3).contiguous()
    return ImageSet(x, torch.arange(n, dtype=torch.int64))


def test_batches_cover_each_sample_once_per_epoch() -> None:
    data, i = _images(23), info()
    seen = [y for _, y in batches(data, i, 5, shuffle=True, generator=gen(), augment=False)]
    assert [len(y) for y in seen] == [5, 5, 5, 5, 3]
    order = torch.cat(seen)
    assert sorted(order.tolist()) == list(range(23)) and order.tolist() != list(range(23))
    kept = torch.cat(
        [y for _, y in batches(data, i, 5, shuffle=True, generator=gen(), augment=False, drop_last=True)]
    )
    assert kept.tolist() == order[:20].tolist()
    plain = torch.cat([y for _, y in batches(data, i, 10, shuffle=False, generator=None, augment=False)])
    assert plain.tolist() == list(range(23))


def test_batches_are_normalised_and_match_their_labels() -> None:
    data, i = _images(7), info()
    labels = []
    for x, y in batches(data, i, 3, shuffle=True, generator=gen(2), augment=False):
        assert x.dtype == torch.float32 and y.dtype == torch.int64 and x.shape[1:] == (1, 3, 3)
        expected = ((100 + y).float() / 255 - 0.5) / 0.25
        assert torch.allclose(x[:, 0, 1, 1], expected)
        labels += y.tolist()
    assert sorted(labels) == sorted(data.y.tolist())  # every image once: no batch is not a pass


def test_batches_with_augmentation_are_deterministic_and_pad_black() -> None:
    data, i = _images(30), info(padding=1, flip=True)

    def epoch(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(batches(data, i, 8, shuffle=True, generator=gen(seed), augment=True))

    a, b = epoch(4), epoch(4)
    assert all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b, strict=True))
    black = (0.0 - 0.5) / 0.25  # padding is black before normalisation
    x = torch.cat([x for x, _ in a])
    assert bool((x == black).any()) and float(x.min()) == pytest.approx(black)


def test_batches_reject_bad_batch_size() -> None:
    with pytest.raises(ConfigError):
        batches(_images(3), info(), 0, shuffle=False, generator=None, augment=False)


def test_token_batches_come_on_the_runs_device_as_image_batches_do(monkeypatch) -> None:
    """Token ids pass through unnormalised, but on the run's device: a model there (FedDF's teachers scored
    on a text federation's held-out split) cannot read ids left on the CPU."""
    from fedistill import devices

    ids = ImageSet(torch.tensor([[5, 6, 0], [7, 0, 0], [8, 9, 4]]), torch.tensor([1, 0, 1]))
    text = DatasetInfo("text", 1, 3, 2, (0.0,), (1.0,))
    monkeypatch.setattr(devices, "_current", torch.device("meta"))
    for data, facts in ((_images(3), info()), (ids, text)):
        (x, y), *_ = batches(data, facts, 3, shuffle=False, generator=None, augment=False)
        assert (x.device.type, y.device.type) == ("meta", "meta")
    assert x.dtype == torch.int64 and x.shape == (3, 3)  # the ids as they are, not normalised
    embedding = torch.nn.Embedding(10, 2, device="meta")  # a text model on the run's device reads them
    assert embedding(x).shape == (3, 3, 2)
