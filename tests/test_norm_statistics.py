"""`recalibrate_norm = true`: after the last round the exported model's BatchNorm statistics are recomputed
from the per-channel moments each site reports of its training split, pooled by the server; the final test
metrics are scored with them and the exported model carries them."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from torch import nn

from algorithm_helpers import SMALL_LESIONS
from fedistill.algorithms.shared import norm_statistics
from fedistill.algorithms.shared.norm_statistics import pooled, site_moments, write_statistics
from fedistill.algorithms.shared.training import task_of
from fedistill.config import RunConfig, build_config
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.transforms import to_float
from fedistill.engine.launch import resume_suite, run_suite
from fedistill.engine.norm_statistics import check_algorithm
from fedistill.engine.setup import prepare_data, resolve, validate_setup
from fedistill.errors import ConfigError
from fedistill.federation.ledger import DOWN, UP, read_ledger
from fedistill.inference.loading import load_model
from fedistill.models.norm import norm_layers
from fedistill.tasks import make_task

SEMANTIC = DatasetInfo("brats", 1, 4, 2, (0.0,), (1.0,), task="semantic-segmentation")


class Probe(nn.Module):
    """A BatchNorm over the input and one after a convolution: inputs no batch's statistics change."""

    def __init__(self) -> None:
        super().__init__()
        self.over_input = nn.BatchNorm2d(1)
        self.conv = nn.Conv2d(1, 2, 3, padding=1, bias=False)
        self.after_conv = nn.BatchNorm2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after_conv(self.conv(x)) + self.over_input(x)


def _site(values: torch.Tensor) -> ImageSet:
    """A site of float images (in [0, 1], the model's inputs as they are: mean 0, std 1)."""
    return ImageSet(values.float(), torch.zeros(values.shape[0], 4, 4, dtype=torch.int64))


def test_pooled_statistics_are_those_of_the_union_of_the_sites_training_data():
    task, model = make_task(SEMANTIC), Probe()
    # by hand: 2 images all 0.2 and 3 all 0.6 -> mean 0.44, variance (2 * 0.04 + 3 * 0.36) / 5 - 0.44^2
    flat = [_site(torch.full((2, 1, 4, 4), 0.2)), _site(torch.full((3, 1, 4, 4), 0.6))]
    answers = [(site_moments(model, task, site, SEMANTIC, 2), len(site)) for site in flat]
    statistics, total = pooled(answers, norm_layers(model))
    assert total == 5
    mean, variance = statistics["over_input"]
    assert mean == pytest.approx([0.44]) and variance == pytest.approx([0.0384])
    # three sites of different sizes and means: the pooled moments are the union's, whatever the batches
    generator = torch.Generator().manual_seed(0)
    sites = [
        _site(torch.rand(n, 1, 4, 4, generator=generator) * 0.4 + s) for n, s in ((3, 0), (5, 0.3), (8, 0.6))
    ]
    answers = [(site_moments(model, task, site, SEMANTIC, 3), len(site)) for site in sites]
    statistics, total = pooled(answers, norm_layers(model))
    assert total == 16
    write_statistics(model, statistics)
    union = torch.cat([to_float(site.x, SEMANTIC) for site in sites]).double()
    with torch.no_grad():
        convolved = nn.functional.conv2d(union, model.conv.weight.double(), padding=1)
    for layer, inputs in ((model.over_input, union), (model.after_conv, convolved)):
        torch.testing.assert_close(layer.running_mean.double(), inputs.mean((0, 2, 3)), rtol=0, atol=1e-6)
        torch.testing.assert_close(
            layer.running_var.double(), inputs.var((0, 2, 3), unbiased=False), rtol=0, atol=1e-6
        )
    # a site without training data adds nothing, and an empty federation has nothing to pool
    empty = _site(torch.zeros(0, 1, 4, 4))
    again, _ = pooled([*answers, (site_moments(model, task, empty, SEMANTIC, 3), 0)], norm_layers(model))
    assert np.allclose(again["after_conv"][0], statistics["after_conv"][0])
    with pytest.raises(Exception, match="no site holds a training sample"):
        pooled([(site_moments(model, task, empty, SEMANTIC, 3), 0)], norm_layers(model))


def _config(algorithm: str = "fedavg", **keys: object) -> RunConfig:
    layer = {**SMALL_LESIONS, "rounds": 1, "task": {"hd95": False}, "recalibrate_norm": True}
    return build_config(RunConfig(), layer, {"algorithm": algorithm, **keys})


@pytest.fixture(scope="module")
def recalibrated_run(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("recalibrated")
    return run_suite(_config(), out, progress=False)[0], out


def test_a_fedavg_run_scores_and_exports_the_model_with_the_pooled_statistics(recalibrated_run):
    summary, out = recalibrated_run
    config, data = _config(), prepare_data(_config())
    sites = [data.dataset.train.subset(indices) for indices in data.split.client_train]
    assert summary["final"]["norm_statistics_samples"] == sum(len(site) for site in sites)
    model = load_model(out, "fedavg")
    # the exported statistics are those the sites' training splits pool to under the final weights
    task, info = task_of(config, data.dataset.info), data.dataset.info
    probe = copy.deepcopy(model.module)
    answers = [(site_moments(probe, task, site, info, config.batch_size), len(site)) for site in sites]
    statistics, _ = pooled(answers, norm_layers(probe))
    layers = norm_layers(model.module)
    assert len(layers) == len(statistics) > 2
    for name, (mean, variance) in statistics.items():
        np.testing.assert_allclose(layers[name].running_mean.cpu().numpy(), mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(layers[name].running_var.cpu().numpy(), variance, rtol=1e-5, atol=1e-6)
    # the first BatchNorm's input (a convolution of the images) is the same in every batch: the union's
    first, seen = next(iter(layers.values())), []
    hook = first.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0].detach().double()))
    union = torch.cat([to_float(site.x, info) for site in sites])
    with torch.no_grad():
        model.module.eval()(union)
    hook.remove()
    np.testing.assert_allclose(first.running_mean.cpu().numpy(), seen[0].mean((0, 2, 3)).numpy(), atol=1e-5)
    np.testing.assert_allclose(
        first.running_var.cpu().numpy(), seen[0].var((0, 2, 3), unbiased=False).numpy(), rtol=1e-4
    )
    # the final test metrics are the recalibrated model's, not the last round's
    scored = model.task.evaluate(model.module, data.dataset.test, info)
    assert summary["final"]["test_dice"] == pytest.approx(scored["dice"])
    assert summary["final"]["test_loss"] == pytest.approx(scored["loss"])
    last = [json.loads(line) for line in (out / "fedavg" / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["test_loss"] != pytest.approx(summary["final"]["test_loss"])


def test_the_ledger_shows_the_query_with_parameters_down_and_only_statistics_up(recalibrated_run):
    _, out = recalibrated_run
    records = [
        r for r in read_ledger(out / "fedavg" / "ledger.jsonl") if r["type"] == "evaluate.norm_statistics"
    ]
    assert {r["client"] for r in records if r["direction"] == DOWN} == {0, 1}
    assert all(set(r["kinds"]) == {"parameters", "config"} for r in records if r["direction"] == DOWN)
    up = [r for r in records if r["direction"] == UP]
    assert {r["client"] for r in up} == {0, 1}
    assert all(set(r["kinds"]) == {"activation-statistics", "metrics"} for r in up)  # no image, no weight
    layers = norm_layers(load_model(out, "fedavg").module)
    channels = sum(layer.num_features for layer in layers.values())
    assert all(r["kinds"]["activation-statistics"] == 2 * 8 * channels for r in up)  # two float64 a channel


def test_an_unasked_run_moves_nothing_and_saves_its_config_as_before(tmp_path):
    config = _config(recalibrate_norm=False)
    assert "recalibrate_norm" not in config.to_dict()
    summary = run_suite(config, tmp_path, progress=False)[0]
    assert "norm_statistics_samples" not in summary["final"]
    types = {r["type"] for r in read_ledger(tmp_path / "fedavg" / "ledger.jsonl")}
    assert "evaluate.norm_statistics" not in types
    assert "recalibrate_norm" not in (tmp_path / "config.toml").read_text()


def test_refusals_before_round_1(tmp_path):
    what = "recalibrate_norm = true recomputes, over the sites' training splits, the BatchNorm statistics"
    tables = "set it in the tables of the algorithms that do ([fedavg] recalibrate_norm = true)"
    cases = {
        "fediod": f"{what} of a model trained on their data; fediod does not take it (its student learned "
        f"from the generator's images): {tables}",
        "standalone": f"{what} of a model trained on their data; standalone does not take it (its sites do "
        f"not compute them): {tables}",
        "feddf": f"{what} of a model trained on their data; feddf does not take it (its fused models learn "
        f"last from the server's distillation data): {tables}",
        "asyndgan": f"{what} of a model trained on their data; asyndgan does not take it (its segmenter "
        f"learned from the generator's images): {tables}",
    }
    for name, message in cases.items():
        resolved = resolve(_config(name), name)
        with pytest.raises(ConfigError) as refused:
            check_algorithm(resolved.config, resolved.algorithm, resolved.options)
        assert str(refused.value) == message
    resolved = resolve(_config(fedavg={"dp_enabled": True, "dp_noise_multiplier": 1.0}), "fedavg")
    with pytest.raises(ConfigError) as refused:
        check_algorithm(resolved.config, resolved.algorithm, resolved.options)
    assert str(refused.value) == (
        f"{what} of fedavg's model, which its differential privacy does not account for: turn one of them off"
    )
    with pytest.raises(ConfigError) as refused:
        validate_setup(_config(norm="group"))
    assert str(refused.value) == (
        f"{what} of fedavg's model, and model 'unet' with norm = 'group' has no BatchNorm layer: "
        "leave it false"
    )
    # a suite refuses before its first algorithm runs; an algorithm's own table applies it to it alone
    with pytest.raises(ConfigError, match="fediod does not take it"):
        run_suite(_config("fedavg,fediod"), tmp_path / "suite", progress=False)
    assert not (tmp_path / "suite" / "fedavg").exists()
    own = build_config(
        RunConfig(), {**SMALL_LESIONS, "algorithm": "fedavg,fediod", "fedavg": {"recalibrate_norm": True}}
    )
    validate_setup(own)


def test_a_crash_while_recalibrating_resumes_to_the_uninterrupted_result(recalibrated_run, tmp_path):
    reference, out = recalibrated_run
    write = norm_statistics.write_statistics

    def crash(model, statistics):
        raise RuntimeError("simulated crash")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(norm_statistics, "write_statistics", crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_suite(_config(), tmp_path, progress=False)
    assert norm_statistics.write_statistics is write
    resumed = resume_suite(tmp_path, progress=False)[0]
    assert resumed["final"] == pytest.approx(reference["final"])

    def messages(path):
        return [(r["type"], r["direction"], r["client"], r["kinds"]) for r in read_ledger(path)]

    assert messages(tmp_path / "fedavg" / "ledger.jsonl") == messages(out / "fedavg" / "ledger.jsonl")
    there = norm_layers(load_model(tmp_path, "fedavg").module)
    for name, layer in norm_layers(load_model(out, "fedavg").module).items():
        assert torch.equal(there[name].running_var, layer.running_var)


def test_centralized_recalibrates_over_its_pooled_data(tmp_path):
    summary = run_suite(_config("centralized"), tmp_path, progress=False)[0]
    data = prepare_data(_config())
    assert summary["final"]["norm_statistics_samples"] == sum(len(i) for i in data.split.client_train)
    records = read_ledger(tmp_path / "centralized" / "ledger.jsonl")
    assert [r["direction"] for r in records if r["type"] == "evaluate.norm_statistics"] == [DOWN, UP]
    # the segmentation tables score the model Centralized exports, not its checkpoint's (averaged) one
    from fedistill.reproduce.segmentation_scores import saved_models

    scored = saved_models(tmp_path / "centralized", "centralized", _config("centralized"), data.dataset)
    exported = norm_layers(load_model(tmp_path, "centralized").module)
    for name, layer in norm_layers(scored[0]).items():
        assert torch.equal(exported[name].running_var, layer.running_var)


def test_over_a_flower_grid_the_sites_answer_and_the_run_ends_as_in_process(recalibrated_run, tmp_path):
    pytest.importorskip("flwr")
    from fedistill.engine.flower.apps import make_client_app
    from flower_local_grid import LocalGrid, run_on_grid

    here, _ = recalibrated_run
    config = _config()
    grid = LocalGrid(make_client_app(config, state_root=tmp_path / "nodes"), config.clients)
    there = run_on_grid(config, tmp_path / "flower", grid)[0]
    assert there["transport"] == "flower"
    assert there["final"]["norm_statistics_samples"] == here["final"]["norm_statistics_samples"]
    assert there["final"]["test_dice"] == pytest.approx(here["final"]["test_dice"], abs=1e-6)
    assert there["final"]["test_loss"] == pytest.approx(here["final"]["test_loss"], abs=1e-6)


def test_the_model_card_says_the_statistics_were_recomputed_at_the_sites(recalibrated_run):
    from fedistill.inference.model_card import card_markdown, model_card

    summary, out = recalibrated_run
    model = load_model(out, "fedavg")
    card = model_card(model, summary, out / "global.safetensors", "safetensors")
    samples = summary["final"]["norm_statistics_samples"]
    said = f"recomputed after the last round over the sites' training data ({int(samples)} samples)"
    assert card["model"]["batchnorm_statistics"] == said
    assert f"- BatchNorm statistics: {said}" in card_markdown(card)
    plain = model_card(model, summary | {"final": {}}, out / "global.safetensors", "safetensors")
    assert plain["model"]["batchnorm_statistics"] is None
    assert "BatchNorm statistics" not in card_markdown(plain)
