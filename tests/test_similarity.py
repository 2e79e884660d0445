"""Similarity of synthetic images to private data: Fréchet distance, nearest neighbours, memorisation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedistill.analysis.similarity import (
    FeatureNetwork,
    frechet_distance,
    held_out_halves,
    memorisation_share,
    memorisation_threshold,
    nearest_neighbour,
    similarity_to_private,
    to_unit,
    train_feature_network,
)
from fedistill.data.base import DatasetInfo, ImageSet


def _features(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) @ torch.randn(
        d, d, generator=g, dtype=torch.float64
    )


def _images(n: int, seed: int, size: int = 8) -> torch.Tensor:
    return torch.rand(n, 1, size, size, generator=torch.Generator().manual_seed(seed))


# --- Fréchet distance ------------------------------------------------------------------------------


def test_frechet_distance_of_a_set_with_itself_is_zero() -> None:
    a = _features(300, 6, 0)
    assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-6)


def test_frechet_distance_grows_with_a_shift_as_the_squared_mean_difference() -> None:
    a = _features(300, 5, 1)
    values = [frechet_distance(a, a + shift) for shift in (0.0, 0.5, 1.0, 2.0)]
    assert values == sorted(values) and values[0] < 1e-6
    # equal covariances: only |mu_a - mu_b|^2 = D * shift^2 remains
    for shift, value in zip((0.5, 1.0, 2.0), values[1:], strict=True):
        assert value == pytest.approx(5 * shift**2, rel=1e-6)


def test_frechet_distance_matches_the_closed_form_for_scaled_covariances() -> None:
    a = _features(400, 4, 2)
    b = 2.0 * a + 3.0  # cov_b = 4 cov_a, so (cov_a cov_b)^(1/2) = 2 cov_a
    cov_a = np.cov(a.numpy(), rowvar=False)
    mean_diff = (b.mean(0) - a.mean(0)).numpy()
    expected = float(mean_diff @ mean_diff + np.trace(cov_a))  # tr(S + 4S - 2 * 2S) = tr(S)
    assert frechet_distance(a, b) == pytest.approx(expected, rel=1e-6)
    assert frechet_distance(b, a) == pytest.approx(expected, rel=1e-6)


def test_frechet_distance_stays_finite_with_fewer_samples_than_dimensions() -> None:
    a, b = _features(5, 12, 3), _features(6, 12, 4)
    value = frechet_distance(a, b)
    assert math.isfinite(value) and value > 0


def test_frechet_distance_refuses_bad_shapes() -> None:
    with pytest.raises(ValueError, match="N >= 2"):
        frechet_distance(torch.zeros(1, 3), torch.zeros(4, 3))
    with pytest.raises(ValueError, match="dimensions differ"):
        frechet_distance(torch.randn(4, 3), torch.randn(4, 2))


# --- nearest neighbours ----------------------------------------------------------------------------


def test_nearest_neighbour_distances_are_exact_on_a_hand_case() -> None:
    references = torch.tensor([[0.0, 0.0], [3.0, 4.0], [10.0, 0.0]])
    queries = torch.tensor([[0.0, 1.0], [3.0, 4.0], [6.0, 8.0], [9.0, 0.0]])
    distances, indices = nearest_neighbour(queries, references, chunk=3)  # crosses a chunk border
    torch.testing.assert_close(distances, torch.tensor([1.0, 0.0, 5.0, 1.0], dtype=torch.float64))
    assert indices.tolist() == [0, 1, 1, 2]


def test_nearest_neighbour_flattens_images() -> None:
    private = torch.zeros(2, 1, 2, 2)
    private[1] = 1.0
    query = torch.full((1, 1, 2, 2), 0.75)  # distance to the ones: sqrt(4 * 0.25^2) = 0.5
    distances, indices = nearest_neighbour(query, private)
    assert distances.item() == pytest.approx(0.5) and indices.item() == 1


def test_memorisation_threshold_and_share() -> None:
    reference = torch.arange(1, 101, dtype=torch.float64)  # 1..100
    threshold = memorisation_threshold(reference, 5.0)
    assert threshold == pytest.approx(np.percentile(np.arange(1, 101), 5.0))
    assert memorisation_share(torch.tensor([0.0, 1.0, 5.0, 50.0]), threshold) == 0.75  # threshold 5.95
    with pytest.raises(ValueError, match="percentile"):
        memorisation_threshold(reference, 120.0)


# --- the report ------------------------------------------------------------------------------------


def _pool_features(x: torch.Tensor) -> torch.Tensor:
    """A fixed stand-in for the feature network: 2x2 average pooling of 8x8 images (16 features)."""
    return torch.nn.functional.avg_pool2d(x, 4).flatten(1).to(torch.float64)


def test_memorisation_flags_copies_of_private_images() -> None:
    private, held_out = _images(40, 10), _images(60, 11)
    copies = private[:3] + 0.001 * torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    synthetic = torch.cat([copies.clamp(0, 1), torch.zeros(7, 1, 8, 8)])  # 3 near-copies, 7 far away
    report = similarity_to_private(synthetic, private, held_out, _pool_features)
    assert report.memorised_pixel == pytest.approx(0.3)  # exactly the three copies
    assert report.memorised_feature >= 0.3
    # the reference's own share sits near the percentile by construction
    assert report.memorised_pixel_held_out <= 0.05 + 1e-9


def test_fresh_samples_score_like_the_held_out_reference() -> None:
    private, held_out, synthetic = _images(50, 20), _images(80, 21), _images(80, 22)
    report = similarity_to_private(synthetic, private, held_out, _pool_features)
    assert report.memorised_pixel < 0.2
    assert report.pixel_nn_mean_synthetic == pytest.approx(report.pixel_nn_mean_held_out, rel=0.1)
    shifted = similarity_to_private((synthetic * 0.5).clamp(0, 1), private, held_out, _pool_features)
    assert shifted.fid_synthetic > 10 * max(report.fid_synthetic, report.fid_held_out)
    assert set(report.to_dict()) >= {"fid_synthetic", "memorised_pixel", "threshold_feature"}


def test_uint8_images_and_image_sets_are_accepted_and_bad_ranges_refused() -> None:
    x = (torch.rand(4, 1, 8, 8) * 255).to(torch.uint8)
    torch.testing.assert_close(to_unit(ImageSet(x, torch.zeros(4, dtype=torch.int64))), x.float() / 255)
    with pytest.raises(ValueError, match="denormalise"):
        to_unit(torch.full((2, 1, 8, 8), 2.0))


def test_images_holding_nan_are_refused() -> None:
    # A NaN pixel made that sample's nearest-neighbour distance NaN, which no threshold is above: it
    # counted as "not memorised" without a word.
    x = torch.rand(2, 1, 8, 8)
    x[1, 0, 3, 3] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        to_unit(x)


# --- the feature network ---------------------------------------------------------------------------

INFO = DatasetInfo("toy", 1, 8, 2, (0.5,), (0.25,))


def _toy_set(n: int, seed: int) -> ImageSet:
    """Two classes: bright top half or bright bottom half, with noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = torch.rand(n, 1, 8, 8, generator=g) * 0.3
    x[y == 0, :, :4] += 0.7
    x[y == 1, :, 4:] += 0.7
    return ImageSet((x.clamp(0, 1) * 255).to(torch.uint8), y.to(torch.int64))


def test_feature_network_trains_on_held_out_data_and_gives_penultimate_features() -> None:
    test = _toy_set(256, 0)
    train_half, reference = held_out_halves(test)
    assert len(train_half) == 128 and len(reference) == 128
    torch.testing.assert_close(reference.x, test.x[128:])
    net = train_feature_network(train_half, INFO, epochs=3, batch_size=16, seed=0)
    assert isinstance(net, FeatureNetwork) and net.accuracy is not None and net.accuracy > 0.9
    feats = net(reference)
    assert feats.shape == (128, 84) and feats.dtype == torch.float64
    again = train_feature_network(train_half, INFO, epochs=3, batch_size=16, seed=0)
    torch.testing.assert_close(again(reference), feats)  # seeded
    report = similarity_to_private(
        reference.subset(range(32)), train_half, reference.subset(range(32, 128)), net
    )
    assert report.fid_synthetic >= 0 and math.isfinite(report.fid_held_out)
    with pytest.raises(ValueError, match="do not fit"):
        net(torch.rand(2, 1, 6, 6))
