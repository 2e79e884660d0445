"""`fediod.ratio_resolution = "patch"`: sites send Eq. 8's D_k ratios once per patch instead of once per
pixel. The server's upsampling gives the ratios, weights and ensemble the per-pixel reply gives, bit for
bit; a run moves the same numbers with fewer bytes; a bad value is one line."""

import copy

import pytest
import torch

from fedistill.algorithms.fediod import FedIODOptions
from fedistill.algorithms.fediod import losses as L
from fedistill.algorithms.fediod.task_view import TaskView
from fedistill.config import RunConfig, build_config, options_for
from fedistill.data.base import DatasetInfo
from fedistill.engine.launch import run_suite
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.ledger import UP
from fedistill.tasks import SemanticSegmentation
from test_fediod_dense import SEGMENTATION as DENSE_SEGMENTATION

#: the dense FedIOD tests' tiny segmentation run, one round
SEGMENTATION = {**DENSE_SEGMENTATION, "rounds": 1}


def _view(resolution: str, size: int = 4) -> TaskView:
    info = DatasetInfo("toy", 1, size, 2, (0.0,), (1.0,), task="semantic-segmentation")
    return TaskView(SemanticSegmentation(), info, 0).with_ratio_resolution(resolution)


def test_patch_ratios_upsampled_by_the_server_give_the_per_pixel_weights_and_ensemble_exactly():
    """Two sites, one 4x4 image, D_k's 2x2 patch map (each patch covers a 2x2 block). Site 0's scores
    0.8 (left) and 0.2 (right) over its real mean 0.4 give ratios 2 and 0.5 on every pixel of the block;
    site 1 the opposite. The patch reply holds 4 values per image instead of 16."""
    pixel, patch = _view("pixel"), _view("patch")
    maps = torch.logit(torch.tensor([[0.8, 0.2], [0.8, 0.2]]))
    sites = [maps.view(1, 1, 2, 2), maps.flip(1).view(1, 1, 2, 2)]
    per_pixel = torch.stack([pixel.pixel_ratio(m, 0.4) for m in sites])
    per_patch = torch.stack([patch.pixel_ratio(m, 0.4) for m in sites])
    assert per_pixel.shape == (2, 1, 4, 4) and per_patch.shape == (2, 1, 2, 2)
    assert pixel.ratio_shape(3) == (3, 4, 4) and patch.ratio_shape(3) == (3, None, None)
    rows = 16
    from_pixels = pixel.ratio_rows(per_pixel.reshape(2, -1), rows)
    from_patches = patch.ratio_rows(per_patch.reshape(2, -1), rows)
    assert torch.equal(from_pixels, from_patches)
    left, right = torch.tensor([2.0, 2.0, 0.5, 0.5]), torch.tensor([0.5, 0.5, 2.0, 2.0])
    torch.testing.assert_close(from_patches[0], torch.cat([left, left, left, left]))
    torch.testing.assert_close(from_patches[1], torch.cat([right, right, right, right]))
    share = L.class_share(torch.tensor([[30.0, 10.0], [10.0, 30.0]]))
    logits = torch.randn(2, rows, 2, generator=torch.Generator().manual_seed(0))
    weights_pixel = L.importance_weights(share, from_pixels)
    weights_patch = L.importance_weights(share, from_patches)
    assert torch.equal(weights_pixel, weights_patch)
    assert torch.equal(L.ensemble_logits(logits, weights_pixel), L.ensemble_logits(logits, weights_patch))


def test_patch_ratios_that_do_not_tile_the_images_are_refused():
    with pytest.raises(FederationError, match="square patch map"):
        _view("patch").ratio_rows(torch.ones(2, 6), 16)  # 6 values for one 4x4 image: not a square map


def test_a_bad_ratio_resolution_is_one_line():
    layer = copy.deepcopy(SEGMENTATION)
    layer["fediod"]["ratio_resolution"] = "sample"
    config = build_config(RunConfig(), layer, {"algorithm": "fediod"})
    with pytest.raises(ConfigError) as error:
        options_for(config, "fediod", FedIODOptions)
    message = str(error.value)
    assert "fediod.ratio_resolution" in message and "pixel, patch" in message and "\n" not in message


def _run(tmp_path, resolution: str) -> dict:
    layer = copy.deepcopy(SEGMENTATION)
    layer["fediod"]["ratio_resolution"] = resolution
    config = build_config(RunConfig(), layer, {"algorithm": "fediod"})
    return run_suite(config, tmp_path / resolution, progress=False)[0]


def test_a_patch_run_sends_fewer_discriminator_bytes_and_trains_the_same_student(tmp_path):
    pixel, patch = _run(tmp_path, "pixel"), _run(tmp_path, "patch")
    up_pixel = pixel["communication"][UP]["per_kind"]
    up_patch = patch["communication"][UP]["per_kind"]
    # 32 px images, a 2-layer D_k: a 6x6 patch map for 1024 pixels, plus each array's header
    assert up_patch["discriminator-outputs"] * 10 < up_pixel["discriminator-outputs"]
    for kind in set(up_pixel) - {"discriminator-outputs"}:
        assert up_patch[kind] == up_pixel[kind], kind
    assert patch["final"]["test_dice"] == pixel["final"]["test_dice"]
    assert patch["final"]["ensemble_dice"] == pixel["final"]["ensemble_dice"]


def test_the_benchmark_compares_the_default_with_the_paper_s_exchanges(tmp_path):
    """Its variants keep the meaning they were measured with (the paper's exchanges, 2 S-steps), except
    `default` (FedIOD's own: the lean preset) and `lean+eq8`."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import fediod_dense_communication as benchmark

    def sets(variant: str) -> list[str]:
        argv = benchmark.command("reconstruction", variant, tmp_path)
        return [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]

    assert not any("preset" in s or "student_steps" in s for s in sets("default"))
    assert {"fediod.preset='paper'", "fediod.student_steps=2"} <= set(sets("compact+patch"))
    assert "fediod.ensemble_weighting='eq8'" in sets("lean+eq8")
    assert "fediod.preset='paper'" not in sets("lean+eq8")


def _row(task: str, variant: str, up: int, down: int, quality: float) -> dict:
    metric = "dice" if task == "segmentation" else "ssim"
    other = {"dice": "hd95", "ssim": "psnr"}[metric]
    return {"task": task, "variant": variant, "seed": 0, "g_steps": 10, "up": {"total": up, "logits": up},
            "down": {"total": down}, "quality": {metric: quality, other: 1.0}, "wall_time_s": 1.0,
            "command": f"fedistill run ... {variant}"}  # fmt: skip


def test_the_reports_reading_of_the_bytes_is_the_rows_not_numbers_typed_into_the_script(
    tmp_path, monkeypatch
):
    """The report's recommendation names the byte ratio the rows measured: a rerun that measures another
    ratio (another seed, a --tag variant, later code) says so, instead of repeating an earlier run's."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import fediod_dense_communication as benchmark

    monkeypatch.setattr(benchmark, "RESULTS", tmp_path)
    rows = [
        _row("segmentation", "pixel", 800, 200, 0.40),
        _row("segmentation", "compact+patch", 300, 200, 0.41),
        _row("segmentation", "compact+patch+batch4", 200, 100, 0.35),
        _row("reconstruction", "pixel", 1000, 1000, 0.79),
        _row("reconstruction", "compact+patch", 250, 250, 0.79),
    ]
    text = "\n".join(benchmark.write(rows, "python benchmarks/fediod_dense_communication.py"))
    assert "0.50 of the `pixel` row's bytes on segmentation and 0.25 on reconstruction" in text
    assert "0.44" not in text and "0.36" not in text
    assert "their quality: Dice -6.00 points against `compact+patch` on segmentation." in text
