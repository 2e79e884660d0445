"""The task layer answers every per-task question: what the partitioner splits by, what FedIOD's
generator is conditioned on and how its outputs are counted, what a model sees of clean images, and how a
model is scored. Generic modules ask the task and never name one task's metric or compare task names."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedistill.data.base import DatasetInfo, ImageSet, LoadedDataset
from fedistill.errors import ConfigError
from fedistill.tasks import (
    TASKS,
    Classification,
    InstanceSegmentation,
    Reconstruction,
    SemanticSegmentation,
    TextClassification,
    make_task,
    task_class,
)

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "fedistill"
SIZE = 8


def _info(task: str, classes: int = 3, **kwargs) -> DatasetInfo:
    return DatasetInfo("toy", 1, SIZE, classes, (0.0,), (1.0,), task=task, **kwargs)


def _images(n: int) -> torch.Tensor:
    pixels = torch.arange(n * SIZE * SIZE, dtype=torch.int64).remainder(256)
    return pixels.to(torch.uint8).view(n, 1, SIZE, SIZE)


def _class_set() -> ImageSet:
    return ImageSet(_images(5), torch.tensor([0, 2, 2, 1, 2]))


def _mask_set() -> ImageSet:
    y = torch.zeros(2, SIZE, SIZE, dtype=torch.int64)
    y[0, :2, :2] = 1  # 4 pixels of class 1
    y[1, 4:, 4:] = 2  # 16 pixels of class 2
    return ImageSet(_images(2), y)


def _instance_set() -> ImageSet:
    y = torch.zeros(1, SIZE, SIZE, dtype=torch.int64)
    y[0, 1:4, 1:4] = 1  # a 3x3 nucleus: 8 contour pixels around 1 inside
    return ImageSet(_images(1), y)


# ------------------------------------------------------------------------------------------------
# the kind of target, and what the partitioner splits by


def test_per_pixel_tasks_are_exactly_segmentation_and_reconstruction():
    per_pixel = {name for name, cls in TASKS.items() if cls.per_pixel}
    assert per_pixel == {"semantic-segmentation", "instance-segmentation", "reconstruction"}


def test_check_refuses_targets_of_the_other_kind():
    Classification().check(_info("classification"), _class_set(), "train")
    SemanticSegmentation().check(_info("semantic-segmentation"), _mask_set(), "train")
    with pytest.raises(ValueError, match=r"needs targets \(N,\)"):
        Classification().check(_info("classification"), _mask_set(), "train")
    with pytest.raises(ValueError, match=r"needs targets \(N, H, W\)"):
        SemanticSegmentation().check(_info("semantic-segmentation"), _class_set(), "train")


def test_check_refuses_class_indices_outside_the_classes_but_not_instance_ids():
    """A label of 3 among 3 classes (or -1) failed only inside the cross-entropy, on a GPU as a
    device-side assert; instance maps number their nuclei, any number of them."""
    with pytest.raises(ValueError, match=r"train: targets run from 0 to 2, but 2 classes take .* 0\.\.1"):
        Classification().check(_info("classification", classes=2), _class_set(), "train")
    with pytest.raises(ValueError, match=r"targets run from 0 to 2, but 2 classes"):
        SemanticSegmentation().check(_info("semantic-segmentation", classes=2), _mask_set(), "test")
    negative = ImageSet(_images(2), torch.tensor([0, -1]))
    with pytest.raises(ValueError, match=r"targets run from -1 to 0"):
        Classification().check(_info("classification"), negative, "train")
    many = ImageSet(_images(1), torch.arange(SIZE * SIZE).view(1, SIZE, SIZE))  # 63 nuclei, 2 classes
    InstanceSegmentation().check(_info("instance-segmentation", classes=2), many, "train")


@pytest.mark.parametrize("task", [SemanticSegmentation(), InstanceSegmentation()])
def test_check_refuses_per_pixel_images_unlike_the_dataset_s(task):
    """A non-square image, or one of another size or channel count than the dataset declares, failed
    only later: as a tensor-stacking error in the first augmented batch, or inside a convolution."""
    info = _info(task.name, classes=2)
    y = torch.zeros(2, SIZE, SIZE + 4, dtype=torch.int64)
    wide = ImageSet(torch.zeros(2, 1, SIZE, SIZE + 4, dtype=torch.uint8), y)
    with pytest.raises(ValueError, match=rf"train: images are 1x{SIZE}x{SIZE + 4}, but .* 1x{SIZE}x{SIZE}"):
        task.check(info, wide, "train")
    rgb = ImageSet(
        torch.zeros(2, 3, SIZE, SIZE, dtype=torch.uint8), torch.zeros(2, SIZE, SIZE, dtype=torch.int64)
    )
    with pytest.raises(ValueError, match=rf"test: images are 3x{SIZE}x{SIZE}, but .* 1x{SIZE}x{SIZE}"):
        task.check(info, rgb, "test")


def test_check_refuses_a_semantic_segmentation_without_a_background_class():
    """One class per pixel (a sigmoid's single channel) made the loss NaN: the softmax needs the
    background as a class of its own. Instance maps always learn three classes."""
    empty = ImageSet(_images(2), torch.zeros(2, SIZE, SIZE, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"train: .* 1 class .* background .* num_classes = 2"):
        SemanticSegmentation().check(_info("semantic-segmentation", classes=1), empty, "train")
    InstanceSegmentation().check(_info("instance-segmentation", classes=1), empty, "train")


def test_check_refuses_a_reconstruction_dataset_that_normalises_its_images():
    """Batches normalise inputs and targets with the dataset's mean and std, the scores compare with the
    stored [0, 1] slices: any normalisation but (0, 1) scored outputs against targets in other units."""
    slices = ImageSet(torch.rand(2, 1, SIZE, SIZE), torch.ones(2, SIZE, SIZE, dtype=torch.int64))
    Reconstruction().check(_info("reconstruction", classes=2), slices, "train")
    shifted = DatasetInfo("toy", 1, SIZE, 2, (0.5,), (0.25,), task="reconstruction")
    with pytest.raises(ValueError, match=r"train: .* mean \(0\.5,\) and std \(0\.25,\).* mean 0 and std 1"):
        Reconstruction().check(shifted, slices, "train")


def test_classification_partitions_by_class():
    info = _info("classification", class_names=("a", "b", "c"))
    data = LoadedDataset(info, _class_set(), ImageSet(_images(2), torch.tensor([1, 0])))
    train, test, count = task_class(info).partition_labels(data)
    assert train.tolist() == [0, 2, 2, 1, 2] and test.tolist() == [1, 0] and count == 3
    assert Classification.partition_names(data) == ("a", "b", "c")


def test_per_pixel_tasks_partition_by_natural_groups_or_one_group():
    info = _info("semantic-segmentation", class_names=("background", "tumour"))
    test = ImageSet(_images(1), torch.zeros(1, SIZE, SIZE, dtype=torch.int64))
    grouped = LoadedDataset(
        info, _mask_set(), test, np.array([0, 3]), np.array([1]), group_names=("s0", "s1", "s2", "s3")
    )
    train, test_groups, count = SemanticSegmentation.partition_labels(grouped)
    assert train.dtype == np.int64 and train.tolist() == [0, 3] and test_groups.tolist() == [1]
    assert count == 4 and SemanticSegmentation.partition_names(grouped) == ("s0", "s1", "s2", "s3")
    plain = LoadedDataset(info, _mask_set(), test)
    train, test_groups, count = Reconstruction.partition_labels(plain)
    assert train.tolist() == [0, 0] and test_groups.tolist() == [0] and count == 1
    assert Reconstruction.partition_names(plain) == ()


def test_task_class_names_the_kind_before_options_and_refuses_unknown_tasks():
    assert task_class(_info("instance-segmentation")) is InstanceSegmentation
    with pytest.raises(ConfigError, match=r"unknown task 'no-such-task'.*\(valid: .*instance-segmentation"):
        task_class(_info("no-such-task"))


# ------------------------------------------------------------------------------------------------
# FedIOD's questions: the generator's condition, the columns of an output row and their counts


def test_only_per_pixel_tasks_condition_a_generator():
    assert Classification.condition is None and TextClassification.condition is None
    for cls in (SemanticSegmentation, InstanceSegmentation, Reconstruction):
        assert cls.condition is not None and cls.condition.description


def test_conditions_masks_and_classes():
    info = _info("semantic-segmentation")
    masks = _mask_set().y
    semantic = SemanticSegmentation.condition
    assert semantic.classes(info) == 3 and semantic.of(masks) is masks
    instances = _instance_set().y * 7
    for cls in (InstanceSegmentation, Reconstruction):
        assert cls.condition.classes(info) == 2
        foreground = cls.condition.of(instances)
        assert foreground.dtype == torch.int64 and foreground.unique().tolist() == [0, 1]
        assert int(foreground.sum()) == 9


@pytest.mark.parametrize("cls", [SemanticSegmentation, InstanceSegmentation, Reconstruction])
def test_condition_priors_draw_binary_masks_from_their_generator_alone(cls):
    yy, xx = np.mgrid[0:32, 0:32] / 31
    noise = np.random.default_rng(0).standard_normal((32, 32))
    first = cls.condition.prior(np.random.default_rng(1), noise, yy, xx)
    again = cls.condition.prior(np.random.default_rng(1), noise, yy, xx)
    assert first.shape == (32, 32) and set(np.unique(first).tolist()) <= {0, 1}
    assert np.array_equal(first, again) and first.any()


def test_distilled_columns_and_their_counts():
    cls_info, seg_info = _info("classification"), _info("semantic-segmentation")
    assert Classification().distilled_columns(cls_info) == 3
    assert Classification().column_counts(_class_set(), cls_info).tolist() == [1, 1, 3]
    assert SemanticSegmentation().distilled_columns(seg_info) == 3
    assert SemanticSegmentation().column_counts(_mask_set(), seg_info).tolist() == [108, 4, 16]
    ins_info = _info("instance-segmentation", classes=2)
    assert InstanceSegmentation().distilled_columns(ins_info) == 3  # background, inside, contour
    assert InstanceSegmentation().column_counts(_instance_set(), ins_info).tolist() == [55, 1, 8]
    rec_info = _info("reconstruction", classes=2)
    slices = ImageSet(torch.rand(4, 1, SIZE, SIZE), torch.zeros(4, SIZE, SIZE, dtype=torch.int64))
    assert Reconstruction().distilled_columns(rec_info) == 1
    counts = Reconstruction().column_counts(slices, rec_info)
    assert counts.dtype == torch.int64 and counts.tolist() == [4]


def test_an_empty_batch_decodes_to_no_targets_of_a_targets_shape():
    """A model's answer to no images (`TrainedModel.predict`) is a prediction with no rows, shaped and
    typed as one of that task's targets: instance segmentation gave a float tensor of shape (0,)."""
    semantic = SemanticSegmentation().decode(torch.zeros(0, 3, SIZE, SIZE))
    instances = InstanceSegmentation().decode(torch.zeros(0, 3, SIZE, SIZE))
    assert semantic.shape == instances.shape == (0, SIZE, SIZE)
    assert semantic.dtype == instances.dtype == torch.int64


def test_no_instance_maps_give_no_pixel_classes_and_zero_counts():
    """Instance maps (0, H, W) crashed in numpy's stack; semantic masks were counted as zeros already."""
    info, task = _info("instance-segmentation", classes=2), InstanceSegmentation()
    none = torch.zeros(0, SIZE, SIZE, dtype=torch.int64)
    classes = task.pixel_targets(none)
    assert classes.shape == (0, SIZE, SIZE) and classes.dtype == torch.int64
    empty = ImageSet(torch.zeros(0, 1, SIZE, SIZE, dtype=torch.uint8), none)
    assert task.column_counts(empty, info).tolist() == [0, 0, 0]


def test_inputs_of_clean_images():
    images = torch.rand(3, 1, 16, 16)
    index = torch.arange(3) + 5
    assert Classification().inputs_of(images, index, 0) is images
    assert SemanticSegmentation().inputs_of(images, index, 0) is images
    task = Reconstruction()
    measured = task.inputs_of(images, index, 11)
    assert measured.shape == images.shape and measured.dtype == images.dtype
    assert not torch.equal(measured, images)  # undersampled: some of k-space is missing
    assert torch.equal(measured, task.inputs_of(images, index, 11))  # the masks follow the seed


def test_a_fixed_mask_measures_a_generator_s_images_with_the_data_s_one_mask():
    """`mask_mode = "fixed"` is one sampling pattern, the scanner's: FedIOD's synthetic images drew
    theirs from the stream's seed instead, a pattern neither the sites' models nor the test set use."""
    images = torch.rand(3, 1, 16, 16)
    task = Reconstruction(mask_mode="fixed", mask_seed=3)
    zero_filled, _, _ = task.undersampled(images, torch.arange(3))
    assert torch.equal(task.inputs_of(images, torch.arange(3) + 5, 11), zero_filled)


def test_only_image_classification_reports_the_global_accuracy_oracle():
    assert {name for name, cls in TASKS.items() if cls.reports_global_accuracy} == {"classification"}


# ------------------------------------------------------------------------------------------------
# scores


class _PixelNet(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def test_the_shared_evaluate_is_the_score_of_the_outputs():
    info = _info("semantic-segmentation")
    task = SemanticSegmentation(hd95=False)
    net, data = _PixelNet(3), _mask_set()
    scored = task.score(task.outputs(net, data, info), data, info)
    assert task.evaluate(net, data, info) == scored
    assert set(task.columns[0][:1]) <= set(scored) and scored["count"] == 2


@pytest.mark.parametrize(
    ("task", "info"),
    [
        (Classification(), _info("classification")),
        (SemanticSegmentation(), _info("semantic-segmentation")),
        (Reconstruction(), _info("reconstruction", classes=2)),
    ],
)
def test_an_empty_set_scores_its_headline_as_nan(task, info):
    targets = torch.zeros((0, SIZE, SIZE) if task.per_pixel else (0,), dtype=torch.int64)
    empty = ImageSet(torch.zeros(0, 1, SIZE, SIZE), targets)
    metrics = task.evaluate(_PixelNet(1), empty, info)
    assert list(metrics) == [task.headline, "loss", "count"] and metrics["count"] == 0
    assert np.isnan(metrics[task.headline]) and np.isnan(metrics["loss"])


def test_reconstruction_scores_per_slice_leave_blank_slices_out():
    """Without subjects each slice is its own volume; a blank one has no data range (no PSNR), so it is
    left out of the means instead of stopping the evaluation."""
    info, task = _info("reconstruction", classes=2), Reconstruction()
    images = torch.rand(3, 1, SIZE, SIZE) + 0.1
    images[1] = 0
    outputs = images + 0.05 * torch.randn_like(images)
    masks = torch.zeros(3, SIZE, SIZE, dtype=torch.int64)
    scored = task.score(outputs, ImageSet(images, masks), info)
    kept = [0, 2]
    alone = task.score(outputs[kept], ImageSet(images[kept], masks[kept]), info)
    assert scored["count"] == 3 and math.isfinite(scored["psnr"])
    assert scored["psnr"] == pytest.approx(alone["psnr"]) and scored["ssim"] == pytest.approx(alone["ssim"])
    blank = task.score(outputs[[1]], ImageSet(images[[1]], masks[[1]]), info)
    assert math.isnan(blank["ssim"]) and math.isnan(blank["psnr"]) and blank["count"] == 1


def test_classification_evaluates_batch_by_batch():
    info = _info("classification")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(SIZE * SIZE, 3))
    data = _class_set()
    metrics = Classification().evaluate(net, data, info, batch_size=2)
    logits = Classification().outputs(net, data, info)
    assert metrics["accuracy"] == int((logits.argmax(1) == data.y).sum()) / 5
    assert metrics["count"] == 5 and metrics["loss"] == pytest.approx(
        float(nn.functional.cross_entropy(logits, data.y)), rel=1e-6
    )


def test_make_task_keeps_options_and_kind():
    task = make_task(_info("reconstruction", classes=2), {"acceleration": 8.0})
    assert isinstance(task, Reconstruction) and task.acceleration == 8.0 and task.per_pixel


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        # `--set task.hd95=False` arrives as the text 'False', which was taken as true
        ("semantic-segmentation", {"hd95": "False"}, "task.hd95 must be true or false"),
        ("semantic-segmentation", {"dice_weight": "0.5"}, "task.dice_weight must be a finite number"),
        ("semantic-segmentation", {"dice_weight": True}, "task.dice_weight must be a finite number"),
        ("instance-segmentation", {"foreground_weight": math.inf}, "task.foreground_weight must be a finite"),
        ("reconstruction", {"residual": "no"}, "task.residual must be true or false"),
        ("reconstruction", {"mask_seed": 1.5}, "task.mask_seed must be an integer"),
    ],
)
def test_task_options_of_the_wrong_type_are_refused_naming_the_option(kind, options, message):
    with pytest.raises(ConfigError, match=message):
        make_task(_info(kind, classes=2), options)


def test_task_options_keep_their_values_as_given():
    task = make_task(_info("reconstruction", classes=2), {"acceleration": 8, "residual": False})
    assert task.acceleration == 8 and task.residual is False


# ------------------------------------------------------------------------------------------------
# generic modules ask the task


GENERIC = [*sorted((PACKAGE / "run").rglob("*.py")), PACKAGE / "algorithms" / "base.py", PACKAGE / "plots.py"]
#: Summaries written before tasks existed name no headline: their reader falls back to classification's.
LEGACY_READERS = {PACKAGE / "run" / "summary.py"}
TASK_WORDS = set(TASKS) | {"class index", "mask", "instance map", "image"}


def _strings(tree: ast.AST) -> list[ast.Constant]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _compared_constants(node: ast.Compare) -> list[object]:
    values = []
    for side in (node.left, *node.comparators):
        items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
        values += [item.value for item in items if isinstance(item, ast.Constant)]
    return values


@pytest.mark.parametrize("path", GENERIC, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_generic_modules_name_no_task_metric_and_compare_no_task_names(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if path not in LEGACY_READERS:
        named = [n.lineno for n in _strings(tree) if "test_accuracy" in n.value]
        assert not named, f"{path.name} names test_accuracy (lines {named}); use the task's headline"
    switches = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Compare)
        and TASK_WORDS & {v for v in _compared_constants(n) if isinstance(v, str)}
    ]
    assert not switches, f"{path.name} compares task names (lines {switches}); ask the task instead"


def test_no_module_outside_tasks_switches_on_a_tasks_name_or_target():
    """`<...>task.name == "..."` or `<...>task.target != "..."`: a per-task behaviour belongs to the task."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if (PACKAGE / "tasks") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            sides = (node.left, *node.comparators)
            on_task = any(
                isinstance(side, ast.Attribute)
                and side.attr in ("name", "target")
                and "task" in ast.unparse(side.value)
                for side in sides
            )
            if on_task and any(isinstance(v, str) for v in _compared_constants(node)):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not found, f"string switches on a task: {found}"
