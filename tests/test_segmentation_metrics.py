"""Segmentation metrics on hand-made masks and instance maps whose scores can be worked out on paper."""

import math

import numpy as np
import pytest
import torch
from scipy import ndimage

from fedistill.metrics.instances import aji, instances_from_semantic, instances_from_three_class, object_dice
from fedistill.metrics.segmentation import SegmentationScores, dice, hd95, sensitivity, specificity


def _square(shape: tuple[int, int], top: int, left: int, size: int) -> np.ndarray:
    mask = np.zeros(shape, dtype=bool)
    mask[top : top + size, left : left + size] = True
    return mask


def _hd95_reference(truth: np.ndarray, prediction: np.ndarray) -> float:
    """Boundary = mask XOR its erosion; each direction's 95th percentile of EDT distances; the larger one."""
    truth_edge = truth ^ ndimage.binary_erosion(truth)
    prediction_edge = prediction ^ ndimage.binary_erosion(prediction)
    to_truth = ndimage.distance_transform_edt(~truth_edge)[prediction_edge]
    to_prediction = ndimage.distance_transform_edt(~prediction_edge)[truth_edge]
    return max(np.percentile(to_truth, 95), np.percentile(to_prediction, 95))


# --- binary metrics ------------------------------------------------------------------------------------


def test_dice_sensitivity_specificity_by_hand():
    truth = np.zeros((4, 4), dtype=bool)
    truth[0, :] = True  # 4 foreground pixels
    prediction = np.zeros((4, 4), dtype=int)
    prediction[0, :2] = 1  # 2 true positives
    prediction[3, 3] = 1  # 1 false positive; so 2 false negatives, 11 true negatives
    assert dice(truth, prediction) == pytest.approx(2 * 2 / (4 + 3))
    assert sensitivity(truth, prediction) == pytest.approx(2 / 4)
    assert specificity(truth, prediction) == pytest.approx(11 / 12)
    assert dice(torch.from_numpy(truth), torch.from_numpy(prediction).float()) == dice(truth, prediction)


def test_hd95_of_concentric_squares_by_hand():
    # Boundaries: the 36-pixel ring of a 10 x 10 square and the 20-pixel ring of a 6 x 6 square inside it.
    # Inner ring to outer: every pixel 2 away. Outer to inner: 24 pixels at 2, 8 at sqrt(5), the 4 corners
    # at 2 sqrt(2); its 95th percentile (position 0.95 * 35 = 33.25 of the sorted 36) falls on the corners.
    outer, inner = _square((24, 24), 5, 5, 10), _square((24, 24), 7, 7, 6)
    assert hd95(outer, inner) == pytest.approx(2 * math.sqrt(2), abs=1e-6)
    assert hd95(inner, outer) == pytest.approx(2 * math.sqrt(2), abs=1e-6)
    assert hd95(outer, inner, spacing=0.5) == pytest.approx(math.sqrt(2), abs=1e-6)
    single_a, single_b = np.zeros((9, 9), bool), np.zeros((9, 9), bool)
    single_a[2, 2], single_b[2, 7] = True, True
    assert hd95(single_a, single_b) == pytest.approx(5.0)
    assert hd95(outer, outer) == 0.0


def test_hd95_agrees_with_a_distance_transform_computation():
    rng = np.random.default_rng(0)
    for _ in range(4):
        field = ndimage.gaussian_filter(rng.standard_normal((2, 48, 56)), sigma=(0, 4, 4))
        truth, prediction = field[0] > 0.05, field[1] > 0.05
        assert hd95(truth, prediction) == pytest.approx(_hd95_reference(truth, prediction), abs=1e-4)


def test_hd95_takes_a_numpy_scalar_spacing_as_a_python_number():
    truth, prediction = _square((8, 8), 2, 2, 3), _square((8, 8), 3, 3, 3)
    expected = 0.5 * hd95(truth, prediction)
    for spacing in (0.5, np.float32(0.5), np.float64(0.5)):
        assert hd95(truth, prediction, spacing=spacing) == pytest.approx(expected, rel=1e-6)
    assert hd95(truth, prediction, spacing=np.int64(2)) == pytest.approx(4 * expected, rel=1e-6)


def test_empty_mask_conventions():
    empty, square = np.zeros((30, 40), bool), _square((30, 40), 3, 3, 5)
    assert dice(empty, empty) == 1.0 and hd95(empty, empty) == 0.0
    assert sensitivity(empty, empty) == 1.0 and specificity(empty, empty) == 1.0
    for truth, prediction in [(empty, square), (square, empty)]:
        assert dice(truth, prediction) == 0.0
        assert hd95(truth, prediction) == pytest.approx(50.0)  # the diagonal of 30 x 40
        assert math.isnan(hd95(truth, prediction, empty_hd95="nan"))
    assert sensitivity(empty, square) == 1.0  # nothing to miss; the false positives show in Dice
    full = np.ones((30, 40), bool)
    assert specificity(full, square) == 1.0


def test_mistakes_are_named():
    square = _square((8, 8), 1, 1, 3)
    with pytest.raises(ValueError, match="differ in shape"):
        dice(square, square[:7])
    with pytest.raises(ValueError, match="threshold probabilities first"):
        dice(square, square * 0.7)
    with pytest.raises(ValueError, match="empty_hd95"):
        hd95(square, square, empty_hd95="inf")
    with pytest.raises(ValueError, match="group names"):
        SegmentationScores().update(square[None], square[None], groups=["a", "b"])


def test_scores_report_per_image_and_pooled_dice_per_group():
    shape = (12, 12)
    big = _square(shape, 0, 0, 10)  # 100 pixels
    small = _square(shape, 0, 0, 2)  # 4 pixels
    half_big = np.zeros(shape, bool)
    half_big[0:5, 0:10] = True  # 50 of the 100
    empty = np.zeros(shape, bool)
    scores = SegmentationScores(empty_hd95="nan")
    scores.update(np.stack([big, small]), np.stack([half_big, empty]), groups="site-a")
    scores.update(torch.from_numpy(empty)[None, None], torch.from_numpy(empty)[None, None], groups=["site-b"])

    per_image = scores.per_image()
    np.testing.assert_allclose(per_image["dice"], [100 / 150, 0.0, 1.0])
    assert len(scores) == 3
    summary = scores.summary()
    assert summary["images"] == 3
    assert summary["mean_dice"] == pytest.approx((100 / 150 + 0 + 1) / 3)
    assert summary["pooled_dice"] == pytest.approx(2 * 50 / (104 + 50))  # one Dice over all pixels
    assert summary["mean_sensitivity"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert summary["hd95_images"] == 2  # the image with an empty prediction has no HD95 here
    assert summary["mean_hd95"] == pytest.approx(per_image["hd95"][[0, 2]].mean())
    groups = scores.by_group()
    assert list(groups) == ["site-a", "site-b"]
    assert groups["site-a"]["mean_dice"] == pytest.approx((100 / 150) / 2)
    assert groups["site-b"]["pooled_dice"] == 1.0


def test_a_group_named_by_the_empty_string_holds_only_its_own_images():
    square = _square((8, 8), 2, 2, 3)
    scores = SegmentationScores(compute_hd95=False)
    scores.update(square[None], square[None], groups="")
    scores.update(square[None], ~square[None])  # no group: counted in summary() only
    groups = scores.by_group()
    assert list(groups) == [""]
    assert groups[""]["images"] == 1 and groups[""]["mean_dice"] == 1.0
    assert scores.summary()["images"] == 2


def test_site_numbers_name_groups_as_strings_do():
    square = _square((8, 8), 2, 2, 3)
    batch = np.stack([square, square])
    for groups in (3, np.int64(3), torch.tensor([3, 3]), np.array([3, 3]), [3, 3]):
        # a number raised "'int' object is not iterable"; a tensor's images were grouped as "tensor(3)"
        scores = SegmentationScores(compute_hd95=False)
        scores.update(batch, batch, groups=groups)
        assert list(scores.by_group()) == ["3"]


def test_one_name_held_in_a_numpy_array_names_the_whole_batch():
    batch = np.stack([_square((8, 8), 2, 2, 3)] * 5)
    for groups in (np.array("siteA"), np.str_("siteA"), np.array(["siteA"] * 5)):
        # a 0-d array of text was split into its letters, five groups "s", "i", "t", "e", "A"
        scores = SegmentationScores(compute_hd95=False)
        scores.update(batch, batch, groups=groups)
        assert [type(name) for name in scores.by_group()] == [str]
        assert scores.by_group()["siteA"]["images"] == 5


# --- instance metrics ----------------------------------------------------------------------------------


def _two_squares_case() -> tuple[np.ndarray, np.ndarray]:
    """Truth: A and B (4 x 4), C (2 x 2). Prediction: A exact, B split in two halves, C missed, one
    false positive (3 x 3)."""
    truth = np.zeros((20, 20), dtype=int)
    truth[1:5, 1:5] = 1  # A, 16 pixels
    truth[1:5, 10:14] = 2  # B, 16 pixels
    truth[10:12, 1:3] = 3  # C, 4 pixels
    prediction = np.zeros((20, 20), dtype=int)
    prediction[1:5, 1:5] = 1  # A exactly
    prediction[1:5, 10:12] = 2  # left half of B, 8 pixels
    prediction[1:5, 12:14] = 3  # right half of B, 8 pixels
    prediction[15:18, 15:18] = 4  # false positive, 9 pixels
    return truth, prediction


def test_aji_and_object_dice_by_hand():
    truth, prediction = _two_squares_case()
    # AJI: A-1 gives 16 / 16; B takes one half (IoU 8/16, either): 8 / 16; C matches nothing: + 4 to the
    # union; the other half and the false positive are never used: + 8 + 9.
    assert aji(truth, prediction) == pytest.approx(24 / (16 + 16 + 4 + 8 + 9))
    # Object Dice. Truth side (area 36): A 16/36 * 1, B 16/36 * 2*8/(16+8), C 4/36 * 0.
    # Prediction side (area 41): 16/41 * 1, each half 8/41 * 2*8/(8+16), false positive 9/41 * 0.
    truth_side = 16 / 36 + 16 / 36 * 2 / 3
    prediction_side = 16 / 41 + 2 * (8 / 41) * (2 / 3)
    assert object_dice(truth, prediction) == pytest.approx((truth_side + prediction_side) / 2)


def test_instance_metrics_ignore_how_instances_are_numbered():
    truth, prediction = _two_squares_case()
    rng = np.random.default_rng(1)
    expected_aji, expected_dice = aji(truth, prediction), object_dice(truth, prediction)
    for _ in range(5):
        new_truth_labels = np.concatenate([[0], rng.permutation(np.arange(1, 4)) * 7 + 100])
        new_pred_labels = np.concatenate([[0], rng.permutation(np.arange(1, 5)) * 3 + 50])
        relabelled_truth, relabelled_prediction = new_truth_labels[truth], new_pred_labels[prediction]
        assert aji(relabelled_truth, relabelled_prediction) == pytest.approx(expected_aji)
        assert object_dice(relabelled_truth, relabelled_prediction) == pytest.approx(expected_dice)
    assert aji(torch.from_numpy(truth), torch.from_numpy(prediction)) == pytest.approx(expected_aji)


def test_aji_uses_a_prediction_once_in_label_order():
    # A (16 pixels, label 1) and B (8 pixels, label 2) predicted as one merged instance P (24 pixels).
    truth = np.zeros((6, 8), dtype=int)
    truth[0:4, 0:4] = 1
    truth[0:4, 4:6] = 2
    merged = (truth > 0).astype(int)
    # A takes P (16 / 24); P is then used up, so B adds only its 8 pixels: 16 / 32.
    assert aji(truth, merged) == pytest.approx(0.5)
    # Numbered the other way round, B takes P first (8 / 24) and A adds its 16 pixels: 8 / 40.
    assert aji(np.array([0, 2, 1])[truth], merged) == pytest.approx(0.2)
    # Object Dice lets P serve both: truth side 16/24 * 0.8 + 8/24 * 0.5, prediction side 1 * 0.8.
    assert object_dice(truth, merged) == pytest.approx((0.7 + 0.8) / 2)


def test_instance_metrics_on_perfect_and_empty_maps():
    truth, _ = _two_squares_case()
    empty = np.zeros_like(truth)
    assert aji(truth, truth) == 1.0 and object_dice(truth, truth) == 1.0
    assert aji(empty, empty) == 1.0 and object_dice(empty, empty) == 1.0
    assert aji(truth, empty) == 0.0 and object_dice(truth, empty) == 0.0
    assert aji(empty, truth) == 0.0 and object_dice(empty, truth) == 0.0
    with pytest.raises(ValueError, match="differ in shape"):
        aji(truth, truth[:10])
    with pytest.raises(ValueError, match=">= 0"):
        aji(truth, -truth)
    with pytest.raises(ValueError, match="integer instance labels"):
        object_dice(truth, truth * 0.5)


def test_instance_labels_that_do_not_fit_an_int64_are_refused():
    truth, _ = _two_squares_case()
    infinite = truth.astype(float)
    infinite[0, 0] = np.inf
    with pytest.raises(ValueError, match="finite"):
        aji(truth, infinite)
    with pytest.raises(ValueError, match="finite"):
        object_dice(infinite, truth)
    huge = truth.astype(np.uint64)
    huge[0, 0] = np.uint64(2**63)  # would wrap to a negative label in int64
    with pytest.raises(ValueError, match="int64"):
        aji(truth, huge)
    with pytest.raises(ValueError, match="non-empty"):
        aji(np.zeros((0, 0), dtype=int), np.zeros((0, 0), dtype=int))


# --- post-processing -----------------------------------------------------------------------------------


def _touching_disks() -> tuple[np.ndarray, np.ndarray]:
    """Two overlapping disks of radius 10, centres 16 apart; truth splits the overlap by nearest centre."""
    rows, cols = np.mgrid[:48, :64]
    left, right = (rows - 24) ** 2 + (cols - 22) ** 2, (rows - 24) ** 2 + (cols - 38) ** 2
    mask = (left <= 100) | (right <= 100)
    return mask, np.where(mask, np.where(left <= right, 1, 2), 0)


def test_watershed_separates_touching_nuclei_that_components_merge():
    mask, truth = _touching_disks()
    assert instances_from_semantic(mask, method="components").max() == 1
    for options in [{}, {"h": 1.0}]:
        instances = instances_from_semantic(mask, method="watershed", **options)
        assert instances.max() == 2
        assert aji(truth, instances) > 0.95
    probabilities = np.where(mask, 0.9, 0.2)
    np.testing.assert_array_equal(instances_from_semantic(torch.from_numpy(probabilities)), instances)


def test_small_objects_are_removed_and_labels_stay_consecutive():
    mask, _ = _touching_disks()
    mask[2:4, 2:4] = True  # a 4-pixel speck
    assert instances_from_semantic(mask, method="components").max() == 2
    instances = instances_from_semantic(mask, method="watershed", min_size=5)
    assert sorted(np.unique(instances)) == [0, 1, 2]
    with pytest.raises(ValueError, match="method"):
        instances_from_semantic(mask, method="kmeans")


def test_three_class_output_becomes_one_instance_per_nucleus():
    mask, truth = _touching_disks()
    inside = np.zeros_like(mask)
    for label in (1, 2):
        inside |= ndimage.binary_erosion(truth == label, iterations=2)
    contour = mask & ~inside
    prob_background, prob_inside, prob_contour = (np.where(m, 0.8, 0.1) for m in (~mask, inside, contour))
    for grow in ("watershed", "dilation"):
        instances = instances_from_three_class(prob_background, prob_inside, prob_contour, grow=grow)
        assert instances.max() == 2
        assert aji(truth, instances) > 0.95
    with pytest.raises(ValueError, match="differ in shape"):
        instances_from_three_class(prob_background, prob_inside, prob_contour[:10])


def test_images_named_by_no_group_are_not_a_group_called_none():
    """A test set without sources passes one None per image: they count overall, and no group "None" (a
    `dice_None` beside `dice` in every segmentation summary) appears."""
    truth = np.zeros((2, 4, 4), dtype=bool)
    truth[:, 1:3, 1:3] = True
    scores = SegmentationScores()
    scores.update(truth, truth, [None, None])
    assert scores.summary()["mean_dice"] == 1.0
    assert scores.by_group() == {}
