"""One-shot FedAvg and one-shot FedDF: every site's stage-1 model (FedIOD's teacher, from the same cache
entry) crosses once; FedAvg averages them once, FedDF fuses them once by distillation."""

import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from fedistill.algorithms.one_shot.baselines import _Ensemble
from fedistill.algorithms.shared.training import evaluate_model
from fedistill.config import RunConfig, build_config
from fedistill.data.registry import load_dataset
from fedistill.engine.launch import run_suite
from fedistill.errors import ConfigError
from fedistill.federation.ledger import UP, read_ledger

TINY = {"clients": 3, "rounds": 1, "model": "lenet-fedmdcg", "alpha": 1.0, "batch_size": 32}
STAGE1 = {"teacher_epochs": 2}


def _config(tmp_path, algorithms: str, **extra) -> RunConfig:
    tables = {name: dict(STAGE1) for name in algorithms.split(",")}
    tables.get("feddf-oneshot", {}).update(steps=20, eval_every_steps=10)
    tables.get("fediod", {}).update(iters_per_epoch=1, synthetic_batch_size=8, generator_width=8,
                                    discriminator_width=8)  # fmt: skip
    return build_config(RunConfig(), TINY, tables, {"algorithm": algorithms, "out": str(tmp_path)}, extra)


def test_parameters_cross_once_and_every_method_sees_fediods_teachers(tmp_path):
    summaries = run_suite(
        _config(tmp_path, "fediod,fedavg-oneshot,feddf-oneshot"), tmp_path / "s", progress=False
    )
    fediod, fedavg, feddf = summaries
    assert fedavg["final"]["teachers_from_cache"] == feddf["final"]["teachers_from_cache"] == 3.0
    for summary in (fedavg, feddf):
        assert summary["final"]["teacher_mean_accuracy"] == pytest.approx(
            fediod["final"]["teacher_mean_accuracy"]
        )
        records = read_ledger(tmp_path / "s" / summary["algorithm"] / "ledger.jsonl")
        with_params = [r for r in records if r["direction"] == UP and "parameters" in r["kinds"]]
        assert sorted(r["client"] for r in with_params) == [0, 1, 2]  # once per site
        assert [r for r in records if r["direction"] == UP] == with_params  # and nothing else, ever
        assert summary["final"]["fraction_of_ensemble"] > 0


def test_one_shot_fedavg_is_the_sample_weighted_average_of_the_teachers(tmp_path):
    run_suite(_config(tmp_path, "fediod,fedavg-oneshot"), tmp_path / "s", progress=False)
    cache = sorted((tmp_path / ".cache" / "stage1").glob("teacher-*.safetensors"))  # client 0, 1, 2
    assert len(cache) == 3
    states = [load_file(str(p)) for p in cache]
    partition = json.loads((tmp_path / "s" / "fedavg-oneshot" / "partition.json").read_text())
    sizes = partition["client_train_sizes"]
    average = {
        k: sum(s[k].double() * n for s, n in zip(states, sizes, strict=True)) / sum(sizes) for k in states[0]
    }
    saved = load_file(str(tmp_path / "s" / "fedavg-oneshot" / "models" / "global.safetensors"))
    for name, value in saved.items():
        if value.is_floating_point():
            torch.testing.assert_close(value.double(), average[name], rtol=1e-5, atol=1e-6)


def test_a_one_shot_method_runs_one_round(tmp_path):
    with pytest.raises(ConfigError, match="set rounds = 1"):
        run_suite(_config(tmp_path, "fedavg-oneshot", rounds=2), tmp_path / "s", progress=False)


def test_scoring_the_ensemble_ceiling_leaves_the_local_models_in_eval_mode():
    """The ceiling's ensemble shares its members' layers with the local models; an evaluation harness that
    restores "train" on it must not switch those models' BatchNorm layers to training."""
    info = load_dataset("digits").info
    models = [
        nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.LazyLinear(10)) for _ in "ab"
    ]
    for m in models:
        m(torch.zeros(2, 1, 8, 8))
        m.eval()
    ensemble = _Ensemble(models)
    ensemble.train()  # what evaluate_model does after scoring a model it found in train mode
    evaluate_model(ensemble, load_dataset("digits").test, info)
    assert all(not layer.training for m in models for layer in m.modules())


@pytest.mark.parametrize("algorithm", ["fedavg-oneshot", "feddf-oneshot"])
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("dp_enabled", True),
        ("drop_worst", "drop"),
        ("weighting", "uniform"),
        ("groups", "lenet5,mlp"),
        ("student_init", "previous"),
        ("prox_mu", 0.1),
        ("aggregate", "median"),
        ("fuse_precision", "full"),
        ("distill", False),
        ("aggregate_trim", 0.1),
    ],
)
def test_a_round_option_the_one_shot_baselines_ignore_is_refused(algorithm, key, value):
    """The one-shot options reuse FedDF's class; a FedDF round key they never read (differential privacy
    above all: the sites would upload unsanitised models) is refused, naming the table, not ignored."""
    from fedistill.algorithms.registry import get_algorithm
    from fedistill.config import options_for

    config = build_config(RunConfig(), {algorithm: {key: value}})
    with pytest.raises(ConfigError, match=rf"^{algorithm}\.{key} "):
        options_for(config, algorithm, get_algorithm(algorithm).options)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("source", "dataset:mnist"),
        ("steps", 100),
        ("distill_lr", 0.01),
        ("temperature", 2.0),
        ("student_bn", "adapt"),
        ("patience", 2),
    ],
)
def test_one_shot_fedavg_refuses_the_distillation_keys_only_one_shot_feddf_reads(key, value):
    """fedavg-oneshot averages and never distils: a distillation key set in its table would change nothing,
    so it is refused and the message points to feddf-oneshot, which reads it."""
    from fedistill.algorithms.registry import get_algorithm
    from fedistill.config import options_for

    config = build_config(RunConfig(), {"fedavg-oneshot": {key: value}, "feddf-oneshot": {key: value}})
    with pytest.raises(ConfigError, match=rf"^fedavg-oneshot\.{key} = .*feddf-oneshot"):
        options_for(config, "fedavg-oneshot", get_algorithm("fedavg-oneshot").options)
    fused = options_for(config, "feddf-oneshot", get_algorithm("feddf-oneshot").options)
    assert getattr(fused, key) == value


@pytest.mark.parametrize(("key", "value"), [("source", "hold-out"), ("student_bn", "froze")])
def test_one_shot_fedavg_refuses_a_misspelt_distillation_key_as_one_it_never_reads(key, value):
    """Not with the values feddf-oneshot would take: fedavg-oneshot takes none but the default."""
    from fedistill.algorithms.registry import get_algorithm
    from fedistill.config import options_for

    config = build_config(RunConfig(), {"fedavg-oneshot": {key: value}})
    with pytest.raises(ConfigError, match=rf"^fedavg-oneshot\.{key} = {value!r} is a distillation key"):
        options_for(config, "fedavg-oneshot", get_algorithm("fedavg-oneshot").options)


@pytest.mark.parametrize(
    ("algorithm", "extra", "match"),
    [
        ("feddf-oneshot", {"val_fraction": 0.0}, "set val_fraction > 0"),
        ("feddf-oneshot", {"feddf-oneshot": {"source": "generator:no-such.safetensors"}}, "does not exist"),
        ("feddf-oneshot", {"feddf-oneshot": {"source": "dataset:digits"}}, "federation's own dataset"),
        ("fedavg-oneshot", {"fedavg-oneshot": {"teachers": "mlp"}}, "student's architecture"),
    ],
)
def test_a_one_shot_setting_that_cannot_work_is_refused_before_any_site_trains(
    tmp_path, monkeypatch, algorithm, extra, match
):
    """No validation split, a distillation source that cannot be built or that holds the clients' own training
    images, or (FedAvg) no site of the student's architecture is known at the start: the run fails there,
    not after every site has trained."""
    import fedistill.algorithms.one_shot.dense.client as client

    def never(*args, **kwargs):
        raise AssertionError("a site trained before the run was refused")

    monkeypatch.setattr(client, "train_teacher", never)
    with pytest.raises(ConfigError, match=match):
        run_suite(_config(tmp_path, algorithm, **extra), tmp_path / "s", progress=False)


def test_a_distillation_source_error_names_the_one_shot_table(tmp_path):
    """feddf-oneshot reads `source` from its own table: its messages say feddf-oneshot.source."""
    from fedistill.algorithms.registry import get_algorithm
    from fedistill.algorithms.shared import distillation_data as dd
    from fedistill.config import options_for

    config = build_config(RunConfig(), {"feddf-oneshot": {"source": "imagenet"}})
    with pytest.raises(ConfigError, match=r"^feddf-oneshot\.source must be"):
        options_for(config, "feddf-oneshot", get_algorithm("feddf-oneshot").options)
    with pytest.raises(ConfigError, match=r"^feddf-oneshot\.source: generator file .* does not exist"):
        dd.load_generator(tmp_path / "none.safetensors", key="feddf-oneshot.source")
    with pytest.raises(ConfigError, match=r"^feddf-oneshot\.source = 'holdout' distils"):
        dd.split_holdout(None, 0.1, 0, key="feddf-oneshot.source")


def test_the_one_shot_options_say_which_feddf_keys_they_refuse():
    """The options reference leaves out the FedDF keys the one-shot tables refuse; the class's own doc
    names them."""
    from fedistill.algorithms.one_shot.baselines import UNUSED_ROUND_KEYS, OneShotOptions

    doc = " ".join((OneShotOptions.__doc__ or "").split())
    assert [key for key in UNUSED_ROUND_KEYS if f"`{key}`" not in doc] == []
