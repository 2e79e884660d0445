"""FedDF: the AVGLOGITS loss by hand, drop-worst, early stopping, the distillation sources, mixed
architectures end to end, and FedDF against FedAvg on non-IID digits."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedistill.algorithms.feddf.feddf import FedDFOptions, distill, ensemble_loss
from fedistill.algorithms.shared import distillation_data as dd
from fedistill.algorithms.shared.drop_worst import drop_worst_weights
from fedistill.cli import main
from fedistill.config import RunConfig, build_config
from fedistill.data.base import DatasetInfo, ImageSet, LoadedDataset
from fedistill.data.registry import load_dataset
from fedistill.engine.checkpoint import latest_checkpoint, read_checkpoint, save_model
from fedistill.engine.launch import run_suite
from fedistill.engine.rundir import read_jsonl
from fedistill.errors import ConfigError
from fedistill.federation.ledger import DOWN, UP, read_ledger
from fedistill.models.generator import build_generator
from fedistill.seeding import seeded


def _info(channels: int = 1, size: int = 8, mean: float = 0.25, std: float = 0.5) -> DatasetInfo:
    return DatasetInfo("synthetic", channels, size, 10, (mean,) * channels, (std,) * channels)


def _in_unit_range(x: torch.Tensor, info: DatasetInfo) -> bool:
    mean = torch.tensor(info.mean).view(1, -1, 1, 1)
    std = torch.tensor(info.std).view(1, -1, 1, 1)
    x01 = x * std + mean
    return bool((x01 >= -1e-5).all() and (x01 <= 1 + 1e-5).all())


# --- the loss ----------------------------------------------------------------------------------
def _kl(p: list[float], q: list[float]) -> float:
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))


def _softmax(z: list[float]) -> list[float]:
    e = [math.exp(v) for v in z]
    return [v / sum(e) for v in e]


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_avg_logits_is_the_kl_to_the_softmax_of_the_mean_logits(temperature):
    teachers = torch.tensor([[[2.0, 0.0, 1.0]], [[0.0, 0.0, -1.0]]])  # (K=2, B=1, C=3)
    student = torch.tensor([[0.5, -0.5, 0.0]])
    mean = [1.0, 0.0, 0.0]  # (z1 + z2) / 2
    p = _softmax([v / temperature for v in mean])
    q = _softmax([v / temperature for v in [0.5, -0.5, 0.0]])
    half = torch.tensor([0.5, 0.5])
    got = ensemble_loss(student, teachers, half, mode="avg-logits", temperature=temperature)
    assert float(got) == pytest.approx(_kl(p, q), rel=1e-5)
    scaled = ensemble_loss(student, teachers, half, temperature=temperature, t_squared=True)
    assert float(scaled) == pytest.approx(temperature**2 * _kl(p, q), rel=1e-5)
    # the other two fusions of the released code, by hand as well
    p1, p2 = (_softmax([v / temperature for v in z]) for z in ([2.0, 0.0, 1.0], [0.0, 0.0, -1.0]))
    avg_probs = [(a + b) / 2 for a, b in zip(p1, p2, strict=True)]
    probs = ensemble_loss(student, teachers, half, mode="avg-probs", temperature=temperature)
    assert float(probs) == pytest.approx(_kl(avg_probs, q), rel=1e-5)
    losses = ensemble_loss(student, teachers, half, mode="avg-losses", temperature=temperature)
    assert float(losses) == pytest.approx(0.5 * _kl(p1, q) + 0.5 * _kl(p2, q), rel=1e-5)


def test_avg_logits_uses_the_weights_and_averages_over_the_batch():
    teachers = torch.randn(3, 4, 5)
    student = torch.randn(4, 5)
    w = torch.tensor([0.5, 0.5, 0.0])
    assert torch.allclose(ensemble_loss(student, teachers, w), ensemble_loss(student, teachers[:2], w[:2]))
    per_row = [float(ensemble_loss(student[i : i + 1], teachers[:, i : i + 1], w)) for i in range(4)]
    assert float(ensemble_loss(student, teachers, w)) == pytest.approx(np.mean(per_row), rel=1e-5)


# --- drop-worst ----------------------------------------------------------------------------------
def test_drop_worst_removes_models_below_1_2x_random_guess_first():
    acc = [0.9, 0.8, 0.11, 0.85]  # 0.11 < 1.2 / 10; then the outlier rule is not applied
    assert drop_worst_weights(acc, 10) == pytest.approx([1 / 3, 1 / 3, 0.0, 1 / 3])
    assert drop_worst_weights(acc, 10, weighted=True) == pytest.approx(
        [0.9 / 2.55, 0.8 / 2.55, 0.0, 0.85 / 2.55]
    )


def test_drop_worst_outlier_rule_without_the_best_model():
    acc = [0.9, 0.8, 0.82, 0.3, 0.81]  # all above chance; without 0.9: mean 0.6825, std 0.2210
    rest = np.array([0.8, 0.82, 0.3, 0.81])
    assert rest.mean() - 1.5 * rest.std() == pytest.approx(0.3511, abs=1e-4)  # 0.3 is below it
    assert drop_worst_weights(acc, 10) == pytest.approx([0.25, 0.25, 0.25, 0.0, 0.25])
    kept = 0.9 + 0.8 + 0.82 + 0.81
    assert drop_worst_weights(acc, 10, weighted=True) == pytest.approx(
        [0.9 / kept, 0.8 / kept, 0.82 / kept, 0.0, 0.81 / kept]
    )
    assert drop_worst_weights([0.5, 0.52, 0.51], 10) == pytest.approx([1 / 3] * 3)  # nothing to drop


def test_drop_worst_keeps_everyone_when_all_are_at_chance(caplog):
    assert drop_worst_weights([0.1, 0.05], 10) == pytest.approx([0.5, 0.5])
    assert "keeping them all" in caplog.text
    assert drop_worst_weights([0.7], 10) == [1.0]


# --- early stopping ----------------------------------------------------------------------------
class _Scripted:
    """A validation curve given in advance; remembers the student's weights at each evaluation."""

    def __init__(self, curve: list[float]) -> None:
        self.curve, self.seen = list(curve), []

    def __call__(self, model: nn.Module) -> float:
        self.seen.append(torch.cat([p.detach().flatten().clone() for p in model.parameters()]))
        return self.curve[len(self.seen) - 1]


def _tiny_models(info: DatasetInfo) -> tuple[nn.Module, list[nn.Module]]:
    def linear() -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(info.channels * info.image_size**2, info.num_classes))

    teachers = [seeded(k, linear, "teacher") for k in range(2)]
    return seeded(9, linear, "student"), teachers


def test_distillation_stops_after_patience_evaluations_and_keeps_the_best_student():
    info = _info(size=4)
    student, teachers = _tiny_models(info)
    # start, then evaluations at steps 2, 4, 6, 8, 10: best at step 4, three without improvement after
    validate = _Scripted([0.5, 0.6, 0.7, 0.65, 0.68, 0.69, 0.99, 0.99])
    options = FedDFOptions(steps=100, eval_every_steps=2, patience=3, distill_batch_size=8)
    report = distill(
        student,
        teachers,
        [0.5, 0.5],
        dd.NoiseSource(info),
        validate,
        options,
        torch.Generator().manual_seed(0),
    )
    assert report.steps == 10 and report.stopped_early
    assert [s for s, _ in report.evaluations] == [0, 2, 4, 6, 8, 10]
    assert report.selected_step == 4 and report.selected_accuracy == 0.7
    final = torch.cat([p.detach().flatten() for p in student.parameters()])
    assert torch.equal(final, validate.seen[2])  # the student as it was at step 4
    assert not torch.equal(final, validate.seen[-1])


def test_the_averaged_model_wins_only_with_fallback_to_average():
    info = _info(size=4)
    for fallback, step in ((True, 0), (False, 2)):
        student, teachers = _tiny_models(info)
        validate = _Scripted([0.9, 0.5, 0.4, 0.3, 0.2])
        options = FedDFOptions(
            steps=20, eval_every_steps=2, patience=3, distill_batch_size=8, fallback_to_average=fallback
        )
        report = distill(
            student, teachers, [1.0, 1.0], dd.NoiseSource(info), validate, options, torch.Generator()
        )
        assert report.selected_step == step
        final = torch.cat([p.detach().flatten() for p in student.parameters()])
        assert torch.equal(final, validate.seen[0 if fallback else 1])


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_distillation_brings_the_student_to_the_ensemble(optimizer):
    info = _info(size=4)
    student, teachers = _tiny_models(info)
    source = dd.NoiseSource(info)
    probe = source.batch(256, torch.Generator().manual_seed(123))
    w = torch.tensor([0.5, 0.5])

    def kl() -> float:
        with torch.no_grad():
            return float(ensemble_loss(student(probe), torch.stack([t(probe) for t in teachers]), w))

    before = kl()
    lr = 1e-2 if optimizer == "adam" else 0.1
    options = FedDFOptions(
        steps=150, eval_every_steps=50, patience=10, distill_batch_size=32, distill_lr=lr,
        distill_optimizer=optimizer,
    )  # fmt: skip
    report = distill(student, teachers, [0.5, 0.5], source, lambda m: 0.0, options, torch.Generator())
    assert report.steps == 150 and kl() < 0.1 * before
    assert np.mean(report.losses[-10:]) < np.mean(report.losses[:10])


@pytest.mark.parametrize(
    ("key", "value"), [("schedule", "cosin"), ("distill_optimizer", "adamw"), ("student_bn", "freeze")]
)
def test_distill_refuses_an_unknown_choice_instead_of_falling_back(key, value):
    """`distill` is public, and options built in a script need not have gone through `validate`: a
    misspelt schedule ran constant, a misspelt optimiser Adam, a misspelt BatchNorm mode `adapt`."""
    info = _info(size=4)
    student, teachers = _tiny_models(info)
    options = FedDFOptions(steps=2, distill_batch_size=8, **{key: value})
    with pytest.raises(ConfigError, match=rf"^feddf\.{key} must be one of .*got '{value}'"):
        distill(
            student, teachers, [0.5, 0.5], dd.NoiseSource(info), lambda m: 0.0, options, torch.Generator()
        )


# --- distillation sources -------------------------------------------------------------------------
def test_parse_source_accepts_the_three_kinds_and_rejects_the_rest():
    assert dd.parse_source("noise") == ("noise", "")
    assert dd.parse_source("dataset:fashion-mnist") == ("dataset", "fashion-mnist")
    assert dd.parse_source("generator: runs/x/models/generator.safetensors")[0] == "generator"
    for bad in ("", "dataset", "dataset:", "gan:x", "noise:3"):
        with pytest.raises(ConfigError, match=r"feddf\.source"):
            dd.parse_source(bad)


def test_noise_batches_are_normalised_images_in_range():
    info = _info(channels=3, size=8)
    x = dd.NoiseSource(info).batch(16, torch.Generator().manual_seed(0))
    assert x.shape == (16, 3, 8, 8) and x.dtype == torch.float32 and _in_unit_range(x, info)
    again = dd.NoiseSource(info).batch(16, torch.Generator().manual_seed(0))
    assert torch.equal(x, again)


def test_fit_images_resizes_and_rechannels():
    grey = torch.rand(2, 1, 8, 8)
    colour = dd.fit_images(grey, 3, 16)
    assert colour.shape == (2, 3, 16, 16) and torch.equal(colour[:, 0], colour[:, 2])
    rgb = torch.rand(2, 3, 32, 32)
    back = dd.fit_images(rgb, 1, 8)
    assert back.shape == (2, 1, 8, 8) and back.min() >= 0 and back.max() <= 1
    assert torch.allclose(dd.fit_images(rgb, 1, 32), rgb.mean(1, keepdim=True))
    with pytest.raises(ConfigError, match="cannot turn 2-channel images into 3-channel ones"):
        dd.fit_images(torch.rand(1, 2, 4, 4), 3, 4)


def test_dataset_source_fits_another_dataset_and_never_reads_its_labels(monkeypatch):
    info = _info(channels=3, size=16)  # a "federation" of 3x16x16 images; digits are 1x8x8
    source = dd.build_source("dataset:digits", info, data_dir="unused", size=100, seed=0)
    assert len(source.images) == 100 and source.images.dtype == torch.uint8
    x = source.batch(32, torch.Generator().manual_seed(1))
    assert x.shape == (32, 3, 16, 16) and x.dtype == torch.float32 and _in_unit_range(x, info)

    digits = load_dataset("digits")
    scrambled = ImageSet(digits.train.x, torch.zeros_like(digits.train.y))  # labels changed, images kept
    monkeypatch.setattr(
        dd, "load_dataset", lambda *a, **k: LoadedDataset(digits.info, scrambled, digits.test)
    )
    same = dd.build_source("dataset:digits", info, data_dir="unused", size=100, seed=0)
    assert torch.equal(same.batch(32, torch.Generator().manual_seed(1)), x)


def test_generator_source_rebuilds_a_saved_generator_from_its_weights(tmp_path):
    trained_on = _info(channels=1, size=8, mean=0.1, std=0.3)
    original = seeded(0, lambda: build_generator(trained_on, latent_dim=8, width=4), "g")
    with torch.no_grad():  # move the BatchNorm statistics away from their defaults
        original.train()
        original(original.sample_latent(64, torch.Generator().manual_seed(5)))
    path = tmp_path / "fediod" / "models" / "generator.safetensors"
    path.parent.mkdir(parents=True)
    save_model(original, path, {"algorithm": "fediod"})

    federation = _info(channels=1, size=8)
    source = dd.build_source(f"generator:{path}", federation, data_dir="unused", size=0, seed=0)
    assert isinstance(source, dd.GeneratorSource)
    assert (source.generator.latent_dim, source.generator.width) == (8, 4)
    x = source.batch(10, torch.Generator().manual_seed(3))
    original.eval()
    with torch.no_grad():
        want = original.forward_unit(original.sample_latent(10, torch.Generator().manual_seed(3)))
    assert torch.allclose(x, (want - 0.25) / 0.5, atol=1e-6)  # same samples, the federation's normalisation
    assert not any(p.requires_grad for p in source.generator.parameters())

    bigger = _info(channels=3, size=16)
    y = dd.build_source(f"generator:{path}", bigger, data_dir="unused", size=0, seed=0).batch(
        6, torch.Generator()
    )
    assert y.shape == (6, 3, 16, 16) and y.dtype == torch.float32 and _in_unit_range(y, bigger)
    with pytest.raises(ConfigError, match="does not exist"):
        dd.build_source(f"generator:{tmp_path / 'none.safetensors'}", bigger, data_dir=".", size=0, seed=0)


@pytest.mark.parametrize("kind", ["noise", "dataset", "generator"])
def test_every_source_hands_its_batches_to_the_run_s_device(kind, tmp_path, monkeypatch):
    """On a GPU the teachers and the student live on the card: a batch left on the CPU stops the run.
    `meta` stands in for the card (no data, only the device), with a `to` that records the move."""
    info = _info(channels=1, size=8)
    spec = {"noise": "noise", "dataset": "dataset:digits"}.get(kind)
    if spec is None:
        path = tmp_path / "generator.safetensors"
        save_model(seeded(0, lambda: build_generator(info, latent_dim=8, width=4), "g"), path, {})
        spec = f"generator:{path}"
    source = dd.build_source(spec, info, data_dir="unused", size=50, seed=0)
    on_cpu = source.batch(4, torch.Generator().manual_seed(0))
    monkeypatch.setattr(dd.devices, "_current", torch.device("meta"))
    moved = source.batch(4, torch.Generator().manual_seed(0))
    assert on_cpu.device.type == "cpu" and moved.device.type == "meta"
    assert moved.shape == on_cpu.shape and moved.dtype == on_cpu.dtype


def test_a_saved_generator_records_its_upsamplings_and_loads_with_them(tmp_path):
    """The weights fix G's base grid, not how often it is upsampled: a G of 1 upsampling (4x4 -> 8x8)
    reloads as 8x8 from its file's metadata; a file without any (released weights) is the paper's 2."""
    info = _info(channels=1, size=8)
    original = seeded(0, lambda: build_generator(info, latent_dim=8, width=4, upsamples=1), "g").eval()
    path = tmp_path / "generator.safetensors"
    save_model(original, path, {"algorithm": "fediod", **original.export_metadata()})
    loaded = dd.load_generator(path)
    assert (loaded.upsamples, loaded.init_size) == (1, 4)
    z = original.sample_latent(5, torch.Generator().manual_seed(0))
    assert torch.equal(loaded.forward_unit(z), original.forward_unit(z))

    save_model(original, path, {"algorithm": "fediod"})  # no record: read as the paper's 2 upsamplings
    assert (dd.load_generator(path).upsamples, dd.load_generator(path).init_size) == (2, 4)
    save_model(original, path, {"upsamples": "3"})
    with pytest.raises(ConfigError, match="records '3' upsamplings"):
        dd.load_generator(path)


@pytest.mark.parametrize("layout", ["fediod", "dense"])
def test_a_saved_generator_of_either_layout_reloads_from_its_weights(tmp_path, layout):
    """FedIOD's G has 4w channels before its first convolution, DENSE's 2w: the weights tell which, so
    either reloads as it was saved, with the same images."""
    info = _info(channels=1, size=8)
    original = seeded(0, lambda: build_generator(info, latent_dim=8, width=4, layout=layout), "g").eval()
    state = original.state_dict()
    assert dd.infer_generator_shape(state) == {
        "latent_dim": 8, "width": 4, "channels": 1, "image_size": 8, "layout": layout
    }  # fmt: skip
    path = tmp_path / "generator.safetensors"
    save_model(original, path, {"algorithm": "dense", **original.export_metadata()})
    loaded = dd.load_generator(path)
    assert loaded.layout == layout
    z = original.sample_latent(5, torch.Generator().manual_seed(0))
    assert torch.equal(loaded.forward_unit(z), original.forward_unit(z))


def test_a_generator_of_neither_layout_is_refused_naming_both():
    state = build_generator(_info(channels=1, size=8), latent_dim=8, width=4).state_dict()
    state["conv_blocks.2.weight"] = torch.zeros(8, 12, 3, 3)  # 3w channels: neither 4w nor 2w
    with pytest.raises(ConfigError, match=r"takes 12 channels; .*width 4 has 16 \(fediod\) or 8 \(dense\)"):
        dd.infer_generator_shape(state)


def test_a_conditional_generator_is_refused_as_a_source_not_fed_noise_for_its_condition(tmp_path):
    """A per-client FedIOD G takes z and a condition; read back it looked unconditional with a longer z,
    and the source filled the condition with noise."""
    info = _info(channels=1, size=8)
    conditional = build_generator(info, latent_dim=8, width=4, upsamples=1, condition_dim=3).eval()
    path = tmp_path / "generator.safetensors"
    save_model(conditional, path, {"algorithm": "fediod", **conditional.export_metadata()})
    with pytest.raises(ConfigError, match=r"feddf\.source: .* is a conditional generator \(a condition of 3"):
        dd.load_generator(path)


# --- end to end ---------------------------------------------------------------------------------
FAST = {"steps": 30, "eval_every_steps": 10, "patience": 2, "distill_batch_size": 32}


def _suite(tmp_path: Path, **layer) -> list[dict]:
    config = build_config(RunConfig(), {"clients": 4, "rounds": 2, "model": "mlp", "alpha": 0.5}, layer)
    return run_suite(config, tmp_path / "suite", progress=False)


def test_two_architecture_groups_each_get_their_own_distilled_model(tmp_path):
    groups = ["mlp", "lenet-fedmdcg"]
    feddf = {**FAST, "groups": ",".join(groups), "fallback_to_average": True, "drop_worst": "drop"}
    summary = _suite(tmp_path, algorithm="feddf", feddf=feddf)[0]
    final = summary["final"]
    for name in groups:
        assert 0.0 <= final[f"test_accuracy_{name}"] <= 1.0
        assert (tmp_path / "suite" / "feddf" / "models" / f"global_{name}.safetensors").is_file()
    assert final["test_accuracy"] == pytest.approx(np.mean([final[f"test_accuracy_{n}"] for n in groups]))

    rows = read_jsonl(tmp_path / "suite" / "feddf" / "metrics.jsonl")
    for row in rows:
        assert row["members_mlp"] + row["members_lenet-fedmdcg"] + row["dropped"] == 4
        for name in groups:  # with fallback_to_average the kept student is never worse on validation
            assert row[f"val_accuracy_{name}"] >= row[f"val_accuracy_average_{name}"]

    records = [r for r in read_ledger(tmp_path / "suite" / "feddf" / "ledger.jsonl") if r["type"] == "train"]
    assert len(records) == 2 * 4 * 2  # every client, every round, both ways
    sizes = {(r["direction"], r["client"]): r["kinds"]["parameters"] for r in records}
    for client in range(4):  # the same model down and up, and the group decides which (client k: k % 2)
        assert sizes[(DOWN, client)] == sizes[(UP, client)] > 0
    assert sizes[(UP, 0)] == sizes[(UP, 2)] != sizes[(UP, 1)] == sizes[(UP, 3)]
    assert set(summary["communication"][UP]["per_kind"]) == {"parameters", "metrics"}

    # the checkpoint restores every group's model
    from fedistill.algorithms.base import ServerContext
    from fedistill.algorithms.feddf.feddf import FedDFServer

    digits = load_dataset("digits")
    config = build_config(RunConfig(), {"model": "mlp", "feddf": feddf})
    ctx = ServerContext(digits.info, config, FedDFOptions(**feddf), 4, lambda m: {}, validation=digits.test)
    server = FedDFServer(ctx)
    state = read_checkpoint(latest_checkpoint(tmp_path / "suite" / "feddf" / "checkpoints"))["server"]
    server.load_state_dict(state)
    for name, model in server.models().items():
        saved = state["models"][name.removeprefix("global_")]
        assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())


def test_without_distillation_feddf_is_fedavg_per_group(tmp_path):
    """`distill = false` is the per-group FedAvg baseline: with one group it is FedAvg itself."""
    runs = _suite(
        tmp_path, algorithm="fedavg,feddf", feddf={"distill": False}, fedavg={"weighting": "samples"}
    )
    fedavg, feddf = runs
    assert feddf["final"]["test_accuracy"] == pytest.approx(fedavg["final"]["test_accuracy"], abs=1e-6)
    rows = read_jsonl(tmp_path / "suite" / "feddf" / "metrics.jsonl")
    assert not any(key.startswith("distill_steps") for row in rows for key in row)


def test_feddf_beats_fedavg_on_non_iid_digits(tmp_path):
    """Measured (mlp, 5 clients, alpha 0.1, 5 local epochs, noise as distillation data): seed 0 with 5
    rounds 81.4% FedAvg vs 93.3% FedDF; seeds 1 and 2 with 4 rounds 69.7 vs 82.5 and 57.2 vs 73.3.
    The mlp has no BatchNorm; with BatchNorm models noise is the paper's worst case (see the report)."""
    config = build_config(
        RunConfig(),
        {"algorithm": "fedavg,feddf", "clients": 5, "alpha": 0.1, "rounds": 4, "model": "mlp", "seed": 1},
        {"local_epochs": 5},
    )
    runs = {s["algorithm"]: s for s in run_suite(config, tmp_path / "suite", progress=False)}
    fedavg, feddf = runs["fedavg"]["test_accuracy"], runs["feddf"]["test_accuracy"]
    assert feddf > fedavg + 0.05, (feddf, fedavg)
    rows = read_jsonl(tmp_path / "suite" / "feddf" / "metrics.jsonl")
    assert all(r["distill_loss_last_mlp"] < r["distill_loss_first_mlp"] for r in rows)


def test_fedavg_drop_worst_uses_the_same_filter(tmp_path, monkeypatch):
    """Client 0 sends a model that predicts one class (all weights zero: about 10% on the validation
    split, under 1.2 x random guess): FedAvg leaves it out of every round's average, which is then the
    sample-weighted mean of the other three models alone."""
    from fedistill.algorithms.classic.fedavg import FedAvgClient, FedAvgServer

    update, train, apply = FedAvgClient.local_update, FedAvgClient.train, FedAvgServer._apply
    sent: dict[int, list[tuple[dict, float]]] = {}
    averages: list[dict[str, torch.Tensor]] = []

    def zero_client_0(self, message, generator):
        metrics = update(self, message, generator)
        if self.ctx.client_id == 0:
            with torch.no_grad():
                for p in self.model.parameters():
                    p.zero_()
        return metrics

    def record_reply(self, message):
        reply = train(self, message)
        count = float(reply.scalar("metrics", "num_samples"))
        sent.setdefault(self.ctx.client_id, []).append((reply.tensors("parameters"), count))
        return reply

    def record_average(self, average):
        averages.append({k: v.clone() for k, v in average.items()})
        apply(self, average)

    monkeypatch.setattr(FedAvgClient, "local_update", zero_client_0)
    monkeypatch.setattr(FedAvgClient, "train", record_reply)
    monkeypatch.setattr(FedAvgServer, "_apply", record_average)
    summary = _suite(tmp_path, algorithm="fedavg", alpha=100.0, fedavg={"drop_worst": True})[0]
    rows = read_jsonl(tmp_path / "suite" / "fedavg" / "metrics.jsonl")
    assert [r["dropped"] for r in rows] == [1, 1]
    assert len(averages) == 2 and sorted(sent) == [0, 1, 2, 3]
    for round, average in enumerate(averages):
        kept = [sent[k][round] for k in (1, 2, 3)]
        total = sum(count for _, count in kept)
        for name, value in average.items():
            expected = sum(state[name].double() * count for state, count in kept) / total
            assert torch.allclose(value.double(), expected, atol=1e-6), (round, name)
    assert summary["test_accuracy"] > 0.5  # the three real models, not diluted by the zero one


@pytest.mark.parametrize(
    ("layer", "match"),
    [
        ({"algorithm": "feddf", "val_fraction": 0.0}, "val_fraction"),
        ({"algorithm": "fedavg", "val_fraction": 0.0, "fedavg": {"drop_worst": True}}, "val_fraction"),
        ({"algorithm": "feddf", "feddf": {"source": "dataset:digits"}}, "own dataset"),
        ({"algorithm": "feddf", "feddf": {"loss": "mse"}}, "feddf.loss"),
        ({"algorithm": "feddf", "feddf": {"drop_worst": "yes"}}, "feddf.drop_worst"),
        ({"algorithm": "feddf", "feddf": {"source": "imagenet"}}, "feddf.source"),
    ],
)
def test_bad_settings_fail_with_a_clear_error(tmp_path, layer, match):
    with pytest.raises(ConfigError, match=match):
        _suite(tmp_path, **layer)


def test_binary_clients_are_fused_in_full_precision(tmp_path, monkeypatch):
    """`fuse_precision = "full"` (FedDF Table 4): the server distils the binary group as the real network of
    its latent weights, and the summary scores both that network and the binarized one the clients run."""
    from fedistill.models.binary import BinaryConv2d

    seen: list[bool] = []
    forward = BinaryConv2d.forward

    def spy(self, x):
        seen.append(bool(torch.is_grad_enabled() and self.training and self.binarize))
        return forward(self, x)

    monkeypatch.setattr(BinaryConv2d, "forward", spy)
    summary = _suite(
        tmp_path, algorithm="feddf", model="resnet8-binary", feddf={**FAST, "fuse_precision": "full"}
    )[0]
    final = summary["final"]
    assert 0.0 <= final["test_accuracy"] <= 1.0 and 0.0 <= final["test_accuracy_full_precision"] <= 1.0
    # in-process clients train binarized (grad on, binarize on); the server's distillation steps
    # run with grad on and binarize off, so both kinds of training forward passes happened
    assert any(seen) and not all(seen)

    with pytest.raises(ConfigError, match=r"no group .* has binary layers"):
        _suite(tmp_path / "mlp", algorithm="feddf", feddf={**FAST, "fuse_precision": "full"})


def test_full_precision_is_the_plain_convolution_of_the_latent_weights():
    from fedistill.models.binary import BinaryConv2d, full_precision

    torch.manual_seed(0)
    conv, x = BinaryConv2d(2, 3, 3, padding=1, bias=False), torch.randn(2, 2, 6, 6)
    with full_precision(conv):
        assert torch.allclose(conv(x), F.conv2d(x, conv.weight, padding=1))
    alpha = conv.weight.abs().mean(dim=(1, 2, 3), keepdim=True)
    assert torch.allclose(
        conv(x), F.conv2d(torch.where(x >= 0, 1.0, -1.0), alpha * conv.weight.sign(), padding=1)
    )
    assert conv.binarize  # back to binary after the block


def test_student_from_previous_starts_where_the_last_round_ended(tmp_path, monkeypatch):
    """`student_init = "previous"` (FedDF Table 5): round 2's student starts from round 1's fused model,
    not from round 2's average, so its starting validation accuracy is round 1's selected one."""
    from fedistill.algorithms.classic import fedavg

    seen: list[float] = []
    train_local = fedavg.train_local

    def spy(*args, prox_mu: float = 0.0, **kwargs):
        seen.append(prox_mu)
        return train_local(*args, prox_mu=prox_mu, **kwargs)

    monkeypatch.setattr(fedavg, "train_local", spy)
    feddf = {**FAST, "student_init": "previous", "prox_mu": 0.01}
    _suite(tmp_path, algorithm="feddf", feddf=feddf)
    assert seen and set(seen) == {0.01}  # the clients train with FedProx's term (Table 8)
    first, second = read_jsonl(tmp_path / "suite" / "feddf" / "metrics.jsonl")[:2]
    assert second["val_accuracy_average_mlp"] == pytest.approx(first["val_accuracy_mlp"], abs=1e-9)


def test_each_group_starts_from_its_members_average_and_learns_from_all(tmp_path, monkeypatch):
    """Algorithm 3 by hand: with groups cycled over 5 clients (0, 2, 4 -> mlp; 1, 3 -> lenet-fedmdcg), each
    group's student starts from sum_k n_k x_k / sum_k n_k over ITS clients only (line 11), and is distilled
    from the ensemble of ALL received models with uniform weights 1/|S_t| (line 14, AVGLOGITS)."""
    from fedistill.algorithms.feddf import server as feddf_server

    calls: list[dict] = []
    distill_for_real = feddf_server.distill

    def spy(student, teachers, weights, *args, **kwargs):
        calls.append(
            {
                "start": {k: v.clone() for k, v in student.state_dict().items()},
                "teachers": [{k: v.clone() for k, v in t.state_dict().items()} for t in teachers],
                "weights": list(weights),
            }
        )
        return distill_for_real(student, teachers, weights, *args, **kwargs)

    monkeypatch.setattr(feddf_server, "distill", spy)
    groups = ["mlp", "lenet-fedmdcg"]
    config = build_config(
        RunConfig(),
        {"clients": 5, "rounds": 1, "model": "mlp", "alpha": 0.5, "algorithm": "feddf"},
        {"feddf": {**FAST, "groups": ",".join(groups)}},
    )
    summary = run_suite(config, tmp_path / "suite", progress=False)[0]
    sizes = summary["partition"]["sizes"]
    assert len(calls) == 2 and len(set(sizes)) > 1  # one distillation per group; unequal n_k
    for group, call in zip(groups, calls, strict=True):
        assert len(call["teachers"]) == 5 and call["weights"] == pytest.approx([0.2] * 5)
        members = [k for k in range(5) if groups[k % 2] == group]
        n = [sizes[k] for k in members]
        for name, value in call["start"].items():
            if not value.is_floating_point():
                continue
            expected = sum(call["teachers"][k][name].double() * w for k, w in zip(members, n, strict=True))
            assert torch.allclose(value.double(), expected / sum(n), atol=1e-6), (group, name)


def test_a_tiny_validation_split_is_named_in_a_warning(tmp_path, caplog):
    """`source = "holdout"` keeps `holdout_val_share` (2%) of the held-out split labelled: on digits that is
    3 samples, too few to select a student or stop on, and the log says so."""
    with caplog.at_level("WARNING", logger="fedistill.algorithms.feddf.server"):
        _suite(tmp_path, algorithm="feddf", rounds=1, feddf={**FAST, "source": "holdout"})
    assert "on 3 labelled validation samples only" in caplog.text and "holdout_val_share" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="fedistill.algorithms.feddf.server"):
        _suite(tmp_path / "noise", algorithm="feddf", rounds=1, feddf=FAST)  # 143 samples: no warning
    assert "validation samples only" not in caplog.text


@pytest.mark.parametrize("download", [False, True])
def test_feddfs_distillation_dataset_is_fetched_as_the_runs_own_dataset_is(download, monkeypatch):
    """`download = true` fetched the run's dataset but not `feddf.source = 'dataset:<name>'`, which then
    failed for want of files the run had been allowed to download."""
    from fedistill.algorithms.base import ServerContext
    from fedistill.algorithms.feddf.feddf import FedDFServer

    digits = load_dataset("digits")
    asked: list[tuple[str, bool]] = []

    def fake_load(name, data_dir=None, *, download=False, **options):
        asked.append((name, download))
        return digits

    monkeypatch.setattr(dd, "load_dataset", fake_load)
    feddf = {"source": "dataset:mnist", "source_size": 16}
    config = build_config(RunConfig(), {"model": "mlp", "download": download, "feddf": feddf})
    ctx = ServerContext(digits.info, config, FedDFOptions(**feddf), 2, lambda m: {}, validation=digits.test)
    FedDFServer(ctx)
    assert asked == [("mnist", download)]


def test_splits_of_one_release_count_as_one_dataset_for_the_distillation_data():
    """EMNIST's splits are cut from one NIST release: a letters federation distilling on byclass would put
    its clients' training characters on the server."""
    from fedistill.data.registry import same_images

    assert same_images("emnist-letters", "EMNIST_byclass") and same_images("fmnist", "fashion-mnist")
    assert same_images("mnist", "emnist-mnist")  # the same NIST scans, processed otherwise
    assert not same_images("digits", "mnist") and not same_images("cifar10", "cifar100")


def test_no_distillation_with_the_previous_student_is_refused():
    """Without distillation the group's model changes only by the average; `student_init = "previous"`
    skips that average, so the clients' training would never reach the model: refused, not run."""
    with pytest.raises(ConfigError, match=r"^feddf\.student_init = 'previous' .*feddf\.distill"):
        FedDFOptions(distill=False, student_init="previous").validate()
    FedDFOptions(distill=False).validate()
    FedDFOptions(student_init="previous").validate()


@pytest.mark.parametrize("key", ["distill_lr", "temperature"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_rate_or_temperature_that_is_not_a_finite_number_is_refused(key, value):
    """TOML reads nan and inf; either would reach the optimiser or the loss and fail far from the key."""
    with pytest.raises(ConfigError, match=rf"^feddf\.{key} must be > 0 and finite, got {value}"):
        FedDFOptions(**{key: value}).validate()


def test_a_non_finite_loss_names_the_table_and_what_can_cause_it():
    """A loss that is not finite before the first update comes from the ensemble, not the learning rate;
    the message names the table the run reads (the one-shot baseline's, not [feddf])."""
    from fedistill.algorithms.one_shot.baselines import FusionOneShotOptions
    from fedistill.errors import FederationError

    info = _info(size=4)
    student, teachers = _tiny_models(info)
    with torch.no_grad():
        teachers[0][1].bias.fill_(float("inf"))
    options = FusionOneShotOptions(steps=4, eval_every_steps=2, distill_batch_size=8)
    rng = torch.Generator()
    with pytest.raises(FederationError, match=r"at step 1: the ensemble's logits are not finite"):
        distill(student, teachers, [0.5, 0.5], dd.NoiseSource(info), lambda m: 0.0, options, rng)

    calls = []

    def diverge(model: nn.Module) -> float:  # the student's weights blow up after its first steps
        if calls:
            with torch.no_grad():
                model[1].weight.fill_(float("inf"))
        calls.append(1)
        return 0.0

    student, teachers = _tiny_models(info)
    with pytest.raises(FederationError, match=r"at step 3: lower feddf-oneshot\.distill_lr$"):
        distill(student, teachers, [0.5, 0.5], dd.NoiseSource(info), diverge, options, rng)


@pytest.mark.parametrize(("key", "value"), [("clip_grad_norm", float("nan")), ("prox_mu", float("inf"))])
def test_a_clip_norm_or_proximal_weight_that_is_not_finite_is_refused(key, value):
    """A nan clip norm turned clipping off without a word; an infinite proximal weight makes the clients'
    objective infinite while their reported loss stays finite."""
    with pytest.raises(ConfigError, match=rf"^feddf\.{key} must be >= 0"):
        FedDFOptions(**{key: value}).validate()


@pytest.mark.parametrize(
    "state",
    [
        {"l1.0.weight": torch.zeros(0, 8), "conv_blocks.2.weight": torch.zeros(0, 0, 3, 3),
         "conv_blocks.9.weight": torch.zeros(3, 0, 3, 3)},  # width 0
        {"l1.0.weight": torch.zeros(64, 8), "conv_blocks.2.weight": torch.zeros(16),
         "conv_blocks.9.weight": torch.zeros(3, 8, 3, 3)},  # a convolution stored flat
    ],
)  # fmt: skip
def test_a_generator_file_of_impossible_shapes_is_named_not_a_traceback(state):
    from fedistill.algorithms.shared.distillation_data import infer_generator_shape

    with pytest.raises(ConfigError, match="not a fedistill/FedIOD generator"):
        infer_generator_shape(state)


def test_feddf_without_a_validation_split_is_refused_before_the_run_folder(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text('algorithm = "feddf"\nclients = 2\nrounds = 1\nval_fraction = 0.0\n', encoding="utf-8")
    argv = ["run", "--config", str(config), "--quiet", "--out", str(tmp_path), "--name", "a"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "feddf needs the server's validation split" in err[0], err
    assert not (tmp_path / "a").exists()
