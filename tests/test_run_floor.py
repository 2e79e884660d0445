"""A reconstruction run reports its task's floor (the zero-filled input, after data consistency) beside its
own numbers, scored on the same test set; a classification run reports none."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from fedistill.config import RunConfig, build_config
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.engine.launch import run_suite
from fedistill.engine.summary import results_rows, summary_markdown
from fedistill.errors import RunDirError
from fedistill.inference.loading import load_model
from fedistill.tasks.reconstruction import Reconstruction

INFO = DatasetInfo("toy-mri", 1, 16, 1, (0.0,), (1.0,), task="reconstruction")


class Zeros(nn.Module):
    """A net that has learnt nothing: its correction is zero everywhere."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


def _slices(n: int = 6) -> ImageSet:
    x = torch.rand(n, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    return ImageSet(x / x.amax(dim=(1, 2, 3), keepdim=True), torch.ones(n, 16, 16, dtype=torch.int64))


@pytest.mark.parametrize("consistency", [True, False])
def test_the_floor_scores_what_a_net_that_learnt_nothing_returns(consistency):
    task = Reconstruction(data_consistency=consistency)
    label, model, scoring = task.trivial_baseline()
    data = _slices()
    assert label == "zero-filled input" + (" + data consistency" if consistency else "")
    floor = scoring.evaluate(model, data, INFO)
    untrained = task.evaluate(Zeros(), data, INFO)
    assert floor["ssim"] == pytest.approx(untrained["ssim"], abs=1e-6)
    assert floor["psnr"] == pytest.approx(untrained["psnr"], abs=1e-4)
    assert dataclasses.replace(task, residual=False).trivial_baseline()[0] == label
    assert dataclasses.replace(task, output_scale="none").trivial_baseline()[0] == label


def test_a_reconstruction_run_reports_its_floor_in_the_summary_and_the_results_table(tmp_path):
    layer = {
        "dataset": "mni152-t1",
        "mni152-t1": {"image_size": 32, "sites": 2},
        "model": "unet-fastmri",
        "model_options": {"chans": 4, "num_pool_layers": 2},
        "clients": 2,
        "rounds": 1,
        "local_steps": 1,
        "batch_size": 4,
    }
    config = build_config(RunConfig(), layer, {"algorithm": "fedavg"})
    summary = run_suite(config, tmp_path / "s", progress=False)[0]
    floor = summary["floor"]
    assert floor["label"] == "zero-filled input + data consistency"
    assert 0 < floor["test_ssim"] < 1 and floor["test_psnr"] > 0
    rows = results_rows([summary])
    assert rows[-1]["algorithm"] == floor["label"] and rows[-1]["SSIM"] == f"{floor['test_ssim']:.4f}"
    assert rows[-1]["time s"] == "-"
    assert "floor (zero-filled input + data consistency, no training)" in summary_markdown(summary)
    # the model file records the task it trained under, so a loaded model predicts as the run scored it
    run_dir = tmp_path / "s" / "fedavg"
    model = load_model(run_dir)
    assert model.task.output_scale == "slice" and model.task.residual
    # a file saved before `output_scale` existed (no task record) took its net's output as it is
    path = run_dir / "models" / "global.safetensors"
    with safe_open(str(path), framework="pt") as handle:
        metadata, state = handle.metadata(), handle.get_tensors()
    assert json.loads(metadata.pop("task_options"))["output_scale"] == "slice"
    save_file(state, str(path), metadata=metadata)
    assert load_model(run_dir).task.output_scale == "none"
    # a damaged record is refused with the file named, not guessed
    save_file(state, str(path), metadata={**metadata, "task_options": "{not json"})
    with pytest.raises(RunDirError, match=r"global\.safetensors: its record of the task options is damaged"):
        load_model(run_dir)


def test_a_classification_run_has_no_floor(tmp_path):
    config = build_config(RunConfig(), {"rounds": 1, "clients": 2, "local_steps": 1}, {"algorithm": "fedavg"})
    summary = run_suite(config, tmp_path / "s", progress=False)[0]
    assert "floor" not in summary
    assert len(results_rows([summary])) == 1
    # the peak memory is ru_maxrss (KiB) / 1024: MiB, where the summary's traffic is in MB of 10^6 bytes
    text = summary_markdown(summary)
    assert f"peak memory: {summary['peak_memory_mb']:.0f} MiB\n" in text
    assert (tmp_path / "s" / "fedavg" / "summary.md").read_text() == text
