"""`[task] decision_threshold`: a two-class segmentation's foreground threshold, a number or chosen on the
sites' validation splits from the pixel counts they report, recorded with the exported model and applied
by its evaluation, `load_model` and `fedistill predict`."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open

from algorithm_helpers import SMALL_LESIONS
from fedistill.config import RunConfig, build_config
from fedistill.data.base import DatasetInfo
from fedistill.engine.decision_threshold import check_algorithm
from fedistill.engine.launch import run_suite
from fedistill.errors import ConfigError
from fedistill.federation.client import ClientLogic
from fedistill.federation.ledger import UP, read_ledger
from fedistill.inference.loading import load_model
from fedistill.inference.predict import predict_path
from fedistill.metrics.thresholds import THRESHOLDS, chosen_threshold, threshold_counts
from fedistill.tasks import make_task

SEMANTIC = DatasetInfo("brats", 1, 4, 2, (0.0,), (1.0,), task="semantic-segmentation")
NUCLEI = DatasetInfo("monuseg", 3, 16, 2, (0.5,) * 3, (0.25,) * 3, task="instance-segmentation")


def _logits(probabilities: list[list[float]]) -> torch.Tensor:
    """Two-class logits (N, 2, 1, W) whose softmax gives the foreground `probabilities`."""
    p = torch.tensor(probabilities, dtype=torch.float64)
    return torch.stack([torch.zeros_like(p), torch.log(p / (1 - p))], 1)[:, :, None].float()


def test_counts_at_every_threshold_and_the_threshold_they_choose_by_hand():
    # two images of four pixels: foreground probabilities and truth
    logits = _logits([[0.32, 0.42, 0.08, 0.62], [0.47, 0.12, 0.02, 0.9]])
    truth = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0]])[:, None]
    counts = threshold_counts(logits, truth)
    by = dict(zip(THRESHOLDS, counts.T.tolist(), strict=True))
    # at 0.5 (argmax): 0.62 is a true positive, 0.9 a false positive, 0.32, 0.42, 0.47 missed
    assert by[0.5] == [1, 1, 3]
    # at 0.3: 0.32, 0.42, 0.62, 0.47 found, 0.9 false: Dice 8 / 9, the best (0.10 adds 0.12, 0.05 0.08)
    assert by[0.3] == [4, 1, 0] and by[0.1] == [4, 2, 0] and by[0.05] == [4, 3, 0]
    assert by[0.95] == [0, 0, 4]
    assert counts.shape == (3, 19) and counts.dtype == np.int64
    assert chosen_threshold(counts) == 0.3  # 0.3 and 0.15, 0.2, 0.25 tie at Dice 8/9: the nearest 0.5
    assert by[0.15] == by[0.2] == by[0.25] == by[0.3]
    # sites' counts add up before the choice; nothing to find and nothing found keeps argmax's 0.5
    assert chosen_threshold(counts + threshold_counts(_logits([[0.9, 0.9]]), torch.ones(1, 1, 2))) == 0.3
    assert chosen_threshold(np.zeros((3, 19), dtype=np.int64)) == 0.5


def test_the_task_decodes_at_its_threshold_and_argmax_at_the_default():
    logits = _logits([[0.32, 0.42, 0.08, 0.62]])
    assert make_task(SEMANTIC).decode(logits).tolist() == [[[0, 0, 0, 1]]]
    assert make_task(SEMANTIC, {"decision_threshold": 0.3}).decode(logits).tolist() == [[[1, 1, 0, 1]]]
    assert make_task(SEMANTIC, {"decision_threshold": "validation"}).decode(logits).tolist() == [
        [[0, 0, 0, 1]]
    ]
    tie = torch.zeros(1, 2, 1, 3)  # p = 0.5 exactly: argmax's background, and the threshold's too
    assert make_task(SEMANTIC, {"decision_threshold": 0.5}).decode(tie).sum() == 0
    for bad in (0, 1, 1.5, "valid", True):
        with pytest.raises(ConfigError, match="decision_threshold"):
            make_task(SEMANTIC, {"decision_threshold": bad})
    with pytest.raises(ConfigError, match="two-class"):
        make_task(NUCLEI, {"decision_threshold": 0.3})


def _config(algorithm: str, threshold: object) -> RunConfig:
    layer = {
        **SMALL_LESIONS,
        "rounds": 1,
        "task": {"hd95": False, "decision_threshold": threshold},
    }
    return build_config(RunConfig(), layer, {"algorithm": algorithm})


def test_a_run_chooses_its_threshold_on_validation_counts_records_it_and_predict_uses_it(tmp_path):
    summary = run_suite(_config("fedavg", "validation"), tmp_path, progress=False)[0]
    threshold = summary["final"]["decision_threshold"]
    assert threshold in THRESHOLDS and threshold != 0.5  # this seed's student is under-confident
    records = read_ledger(tmp_path / "fedavg" / "ledger.jsonl")
    asked = [r for r in records if r["type"] == "evaluate.threshold"]
    assert {r["client"] for r in asked if r["direction"] == UP} == {0, 1}
    assert all(set(r["kinds"]) == {"metrics"} for r in asked if r["direction"] == UP)  # counts, no image
    with safe_open(str(tmp_path / "fedavg" / "models" / "global.safetensors"), "pt") as handle:
        assert json.loads(handle.metadata()["task_options"])["decision_threshold"] == threshold
    model = load_model(tmp_path, "fedavg")
    assert model.task.decision_threshold == threshold
    # the sites' counts, recomputed here from their validation splits, choose the same threshold
    from fedistill.engine.setup import prepare_data

    data = prepare_data(_config("fedavg", "validation"))
    val = data.dataset.train.subset(np.concatenate(data.split.client_val))
    outputs = model.task.outputs(model.module, val, model.info)
    assert chosen_threshold(threshold_counts(outputs, val.y)) == threshold
    # the final test Dice is scored at it, and predict (API and command) applies it
    test = data.dataset.test
    assert summary["final"]["test_dice"] == pytest.approx(
        model.task.evaluate(model.module, test, model.info)["dice"]
    )
    images = (test.x[:4, 0]).numpy()
    margin = model.outputs(images)
    expected = (margin[:, 1] - margin[:, 0] > math.log(threshold / (1 - threshold))).long()
    assert torch.equal(model.predict(images), expected)
    folder = tmp_path / "images"
    folder.mkdir()
    for i, image in enumerate(images):
        Image.fromarray(image).save(folder / f"{i}.png")
    predict_path(model, folder, tmp_path / "masks")
    written = np.stack([np.asarray(Image.open(tmp_path / "masks" / f"{i}.png")) for i in range(4)])
    np.testing.assert_array_equal(written, expected.numpy())


def test_a_fixed_threshold_scores_the_run_at_it_and_an_algorithm_without_counts_is_refused(tmp_path):
    summary = run_suite(_config("fedavg", 0.3), tmp_path, progress=False)[0]
    assert "decision_threshold" not in summary["final"]
    model = load_model(tmp_path, "fedavg")
    assert model.task.decision_threshold == 0.3
    from fedistill.engine.setup import prepare_data

    test = prepare_data(_config("fedavg", 0.3)).dataset.test
    assert summary["final"]["test_dice"] == pytest.approx(
        model.task.evaluate(model.module, test, model.info)["dice"]
    )
    plain = SimpleNamespace(name="plain", client=ClientLogic)  # sites that cannot count
    check_algorithm(make_task(SEMANTIC, {"decision_threshold": 0.3}), plain)
    with pytest.raises(ConfigError, match="decision_threshold"):
        check_algorithm(make_task(SEMANTIC, {"decision_threshold": "validation"}), plain)


def test_an_exported_models_card_says_the_threshold_its_logits_are_read_at():
    from types import SimpleNamespace as Model

    from fedistill.inference.model_card import output_description

    at = make_task(SEMANTIC, {"decision_threshold": 0.35})
    for format in ("safetensors", "onnx"):
        text = output_description(Model(task=at), format)
        assert "0.35" in text and f"{math.log(0.35 / 0.65):.4f}" in text
    assert "argmax" in output_description(Model(task=make_task(SEMANTIC)), "onnx")


def test_over_a_flower_grid_the_sites_count_and_the_run_chooses_as_in_process(tmp_path):
    pytest.importorskip("flwr")
    from fedistill.engine.flower.apps import make_client_app
    from flower_local_grid import LocalGrid, run_on_grid

    config = _config("fedavg", "validation")
    here = run_suite(config, tmp_path / "inprocess", progress=False)[0]
    grid = LocalGrid(make_client_app(config, state_root=tmp_path / "nodes"), config.clients)
    there = run_on_grid(config, tmp_path / "flower", grid)[0]
    assert there["transport"] == "flower"
    assert there["final"]["decision_threshold"] == here["final"]["decision_threshold"]
    assert there["final"]["test_dice"] == pytest.approx(here["final"]["test_dice"], abs=1e-6)
