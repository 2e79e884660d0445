"""FedIOD across the message boundary: what crosses it, that the distributed gradient is the true
one, and that the student learns on real data."""

import copy
import dataclasses

import pytest
import torch

from algorithm_helpers import TINY_FEDIOD, fediod_parts
from fedistill.algorithms.fediod import FedIODOptions, FedIODServer
from fedistill.algorithms.fediod import losses as L
from fedistill.config import RunConfig, build_config, options_for
from fedistill.engine.launch import run_suite
from fedistill.errors import ConfigError
from fedistill.federation.ledger import UP, Ledger, read_ledger
from fedistill.transports.inprocess import InProcessFleet

TINY = TINY_FEDIOD


def _config(**fediod) -> RunConfig:
    layer = copy.deepcopy(TINY)
    layer["fediod"].update(fediod)
    return build_config(RunConfig(), layer, {"algorithm": "fediod"})


def _build(config: RunConfig):
    clients, server, _ = fediod_parts(config)
    return clients, server


@pytest.mark.parametrize("weighting", ["eq8", "uniform"])
def test_clients_send_no_parameters_and_label_counts_only_when_needed(tmp_path, weighting):
    config = _config(ensemble_weighting=weighting)
    summary = run_suite(config, tmp_path / "s", progress=False)[0]
    up = summary["communication"][UP]["per_kind"]
    assert "parameters" not in up
    assert ("label-statistics" in up) == (weighting == "eq8")
    records = read_ledger(tmp_path / "s" / "fediod" / "ledger.jsonl")
    sent_by_clients = {kind for r in records if r["direction"] == UP for kind in r["kinds"]}
    assert sent_by_clients <= {
        "logits",
        "discriminator-outputs",
        "input-gradients",
        "metrics",
        "label-statistics",
    }
    types = {r["type"] for r in records}
    assert {"train", "query.generate", "query.backprop", "query.student", "evaluate.student"} <= types
    # one generate + one backprop per client per G-step; S-step targets ride on the next generate,
    # so a separate student query happens once per epoch (2 epochs x 2 G-steps, 3 clients)
    steps, epochs = 2 * 2, 2
    expected = {"query.generate": 3 * steps, "query.backprop": 3 * steps, "query.student": 3 * epochs}
    for kind, count in expected.items():
        assert sum(r["type"] == kind and r["direction"] == UP for r in records) == count
    assert summary["final"]["selection"].startswith("best on the clients' validation")
    assert 0.0 <= summary["test_accuracy"] <= 1.0


def test_distributed_generator_gradient_equals_the_centralised_one():
    """The gradient G receives, assembled from what clients return, equals autograd through everything."""
    # full-precision messages: the protocol's gradient is exact only without the compact wire's rounding
    config = _config(w_adv=0.7, w_unique=1.3, w_conf=0.9, w_gan=1.1, wire="float32")
    clients, server = _build(config)
    fleet = InProcessFleet(clients, Ledger(None))
    server.setup(fleet)
    g_before = copy.deepcopy(server.generator)
    s_before = copy.deepcopy(server.student)
    step = server.step
    server.distillation_step(fleet)
    protocol_grad = [p.grad.clone() for p in server.generator.parameters()]

    # centralised reference: the same x, the clients' models (D_k as updated in this step), S before the step
    from fedistill.seeding import torch_generator

    options = server.options
    g_before.train()
    s_before.train()
    latent_gen = torch_generator(config.seed, "latent", step)
    x = g_before(g_before.sample_latent(options.synthetic_batch_size, latent_gen))
    ids = sorted(clients)
    pi = server.federation.pi(ids)
    z = torch.stack([clients[k].teacher(x) for k in ids])
    d = [clients[k].discriminator(x) for k in ids]
    loss = sum(
        options.w_gan * pi[i] * L.generator_gan_loss(d[i]) + options.w_conf * pi[i] * L.entropy(z[i]).mean()
        for i in range(len(ids))
    )
    with torch.no_grad():
        ratio = torch.stack(
            [L.density_ratio(L.patch_scores(clients[k].discriminator(x)), clients[k].real_mean) for k in ids]
        )
    weights = L.importance_weights(server.federation.share(ids, z.shape[-1]), ratio)
    loss = loss + options.w_unique * L.unique_loss(z, pi) + options.w_balance * L.balance_loss(z, pi)
    loss = loss - options.w_adv * L.mimic_loss(s_before(x), L.ensemble_logits(z, weights))
    reference = torch.autograd.grad(loss, list(g_before.parameters()))
    for got, want in zip(protocol_grad, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_official_code_preset_and_best_on_test_labelling():
    options = options_for(
        build_config(RunConfig(), {"fediod": {"preset": "official-code", "w_adv": 0.5}}),
        "fediod",
        FedIODOptions,
    )
    from fedistill.algorithms.fediod import resolve_options

    config = build_config(RunConfig(), {"fediod": {"preset": "official-code", "w_adv": 0.5}})
    resolved = resolve_options(config, options, per_pixel=False)
    assert resolved.ensemble_weighting == "class-share" and resolved.mimic == "kl-official"
    assert resolved.js == "official" and resolved.selection == "best-on-test"
    assert resolved.w_adv == 0.5  # an explicit setting wins over the preset


def test_validation_selection_without_validation_splits_is_refused_unless_the_preset_selects_otherwise():
    def check(fediod: dict) -> None:
        config = build_config(RunConfig(), {"val_fraction": 0.0, "fediod": fediod})
        options_for(config, "fediod", FedIODOptions).check_run(config)

    check({"preset": "official-code"})  # the released code's preset selects on the test set
    check({"selection": "last"})
    for fediod in ({}, {"preset": "official-code", "selection": "validation"}):
        with pytest.raises(ConfigError, match="needs validation splits: set val_fraction > 0"):
            check(fediod)


def test_stable_preset_switches_on_the_stabilisers_and_explicit_keys_win():
    from fedistill.algorithms.fediod import resolve_options
    from fedistill.errors import ConfigError

    def resolved_for(
        fediod: dict,
        *,
        per_pixel: bool = False,
        two_classes: bool = False,
        images: bool = False,
        mask_shaped: bool = False,
    ) -> FedIODOptions:
        config = build_config(RunConfig(), {"fediod": fediod})
        options = options_for(config, "fediod", FedIODOptions)
        return resolve_options(
            config,
            options,
            per_pixel=per_pixel,
            two_class_pixels=two_classes,
            image_outputs=images,
            mask_shapes_images=mask_shaped,
        )

    resolved = resolved_for({"preset": "stable", "tau": 2.0})
    assert (resolved.w_bn, resolved.pool_size, resolved.pool_steps) == (10.0, 20000, 30)
    assert (resolved.mimic, resolved.student_steps, resolved.tau) == ("kl", 2, 2.0)
    assert (resolved.iters_per_epoch, resolved_for({"iters_per_epoch": 3}).iters_per_epoch) == (12, 3)
    assert resolved.teacher_logits == "auto"
    assert (resolved.share_power, resolved_for({"share_power": 1.0}).share_power) == (0.5, 1.0)
    paper_options = resolved_for({"preset": "paper", "tau": 2.0})
    assert paper_options.share_power == 1.0
    assert (paper_options.pool_size, paper_options.teacher_logits, paper_options.mimic) == (0, "raw", "l2")
    assert paper_options.iters_per_epoch == "max"
    # the default preset is the stable one on classification and the lean one on per-pixel tasks: S learns
    # from G's own batches (pooled with their targets), margin logits only where a pixel has two classes
    assert FedIODOptions().preset == "auto"
    assert resolved_for({"tau": 2.0}) == dataclasses.replace(resolved, preset="stable")
    lean = {"student_steps": 0, "pool_generator_batch": True, "pool_size": 1000, "pool_steps": 2}
    pixels = resolved_for({"tau": 2.0}, per_pixel=True)
    assert pixels == dataclasses.replace(paper_options, preset="lean", **lean)
    assert pixels.pixel_logits == "all"
    # a two-class segmentation's small masks (lesions): one logit per pixel, one byte a value, a larger pool
    two_class = resolved_for({"tau": 2.0}, per_pixel=True, two_classes=True)
    assert two_class == dataclasses.replace(
        pixels, pixel_logits="margin", wire="compact8-sqrt", pool_size=2500, pool_steps=5
    )
    assert resolved_for({"wire": "compact"}, per_pixel=True, two_classes=True).wire == "compact"
    # image outputs (reconstruction): the teachers' plain mean instead of Eq. 8, unless a user names one, half
    # of each target the image G drew, 16 replay steps and a student lr of 2e-3
    images = resolved_for({"tau": 2.0}, per_pixel=True, images=True)
    assert images == dataclasses.replace(
        pixels, ensemble_weighting="uniform", truth_weight=0.5, pool_steps=16, lr_student=2e-3
    )
    assert resolved_for({"truth_weight": 0.0}, per_pixel=True, images=True).truth_weight == 0.0
    assert pixels.ensemble_weighting == "eq8"
    # masks that lay out G's image (nuclei): three quarters of the student's loss against them, and a share of
    # G's batch per site, each in that site's colours (tried both ways), labelled by its own site alone,
    # which is all it asks
    looks = {
        "truth_weight": 0.75,
        "generator_mixture": "per-client",
        "site_looks": True,
        "ensemble_weighting": "owner",
        "use_unique": False,
        "owner_queries": True,
        "w_adv": 0.1,
        "look_trials": 4,  # each site's colours tried both ways (look_trials.py)
        "w_gan": 5.0,  # the sites' discriminators weigh five times as much in G's loss
    }
    assert resolved_for({"tau": 2.0}, per_pixel=True, mask_shaped=True) == dataclasses.replace(
        pixels, **looks
    )
    nuclei = resolved_for({"tau": 2.0}, per_pixel=True, mask_shaped=True, two_classes=True)
    assert nuclei == dataclasses.replace(pixels, pixel_logits="margin", **looks)
    assert resolved_for({"truth_weight": 0.0}, per_pixel=True, mask_shaped=True).truth_weight == 0.0
    assert resolved_for({"preset": "paper"}, per_pixel=True, mask_shaped=True).truth_weight == 0.0
    assert (
        resolved_for({"ensemble_weighting": "eq8"}, per_pixel=True, images=True).ensemble_weighting == "eq8"
    )
    # a user's S-steps stay theirs; the paper's exchanges are one preset away
    assert resolved_for({"student_steps": 2}, per_pixel=True).student_steps == 2
    # no S-steps is the lean preset's own setting: a user may name it (or the preset) on a per-pixel task;
    # on classification the stable preset has no G-batch pool to learn from, and says so
    assert resolved_for({"student_steps": 0}, per_pixel=True).pool_generator_batch
    assert resolved_for({"preset": "lean", "student_steps": 0}, per_pixel=True).preset == "lean"
    with pytest.raises(ConfigError, match=r"pool_generator_batch.*preset = 'stable'"):
        resolved_for({"student_steps": 0})
    paper_pixels = resolved_for({"preset": "paper", "tau": 2.0}, per_pixel=True, two_classes=True)
    assert paper_pixels == dataclasses.replace(paper_options, preset="paper")
    # a user may change the preset's replay steps without repeating its pool
    resolved = resolved_for({"preset": "stable", "pool_steps": 15})
    assert (resolved.pool_size, resolved.pool_steps) == (20000, 15)
    assert resolved_for({"pool_steps": 15}).pool_size == 20000
    # the preset's replay steps without a pool are refused, as when a user sets them so
    for preset in ("stable", "auto"):
        with pytest.raises(ConfigError, match="pool_size"):
            resolved_for({"preset": preset, "pool_size": 0})


def test_validation_selection_needs_a_validation_split(tmp_path):
    from fedistill.errors import ConfigError

    config = build_config(_config(), {"val_fraction": 0.0})
    with pytest.raises(ConfigError, match="val_fraction > 0"):
        run_suite(config, tmp_path / "s", progress=False)


def test_best_on_test_outside_the_preset_is_refused():
    from fedistill.errors import ConfigError

    with pytest.raises(ConfigError, match="official-code"):
        options_for(build_config(RunConfig(), {"fediod.selection": "best-on-test"}), "fediod", FedIODOptions)


def test_student_beats_the_standalone_mean_on_digits(tmp_path):
    """Real data, fixed seed: the distilled student must beat the mean of the clients' own models."""
    config = build_config(
        RunConfig(),
        {
            "algorithm": "fediod",
            "clients": 5,
            "alpha": 0.5,
            "rounds": 8,
            "model": "lenet-fedmdcg",
            "fediod": {"iters_per_epoch": 20, "generator_width": 32, "discriminator_width": 32},
        },
    )
    final = run_suite(config, tmp_path / "s", progress=False)[0]["final"]
    assert final["test_accuracy"] > final["teacher_mean_accuracy"] + 0.05, final
    assert final["fraction_of_ensemble"] > 0.5


def test_an_interrupted_run_resumes_to_the_same_result(tmp_path, monkeypatch):
    from fedistill.engine.launch import resume_suite
    from fedistill.engine.rundir import read_jsonl

    config = _config()
    run_suite(config, tmp_path / "ref", progress=False)
    original = FedIODServer.run_round

    def crash_in_round_2(self, fleet, round):
        if round == 2:
            raise KeyboardInterrupt
        return original(self, fleet, round)

    monkeypatch.setattr(FedIODServer, "run_round", crash_in_round_2)
    with pytest.raises(KeyboardInterrupt):
        run_suite(config, tmp_path / "cut", progress=False)
    monkeypatch.setattr(FedIODServer, "run_round", original)
    resume_suite(tmp_path / "cut", progress=False)

    def rows(path):
        return [
            {k: v for k, v in r.items() if not k.endswith("_s")}
            for r in read_jsonl(path / "fediod" / "metrics.jsonl")
        ]

    assert rows(tmp_path / "cut") == rows(tmp_path / "ref")


def test_a_students_dropout_follows_the_run_seed_not_torchs_global_stream():
    """VGG-9 drops out in the G-step's L_mimic, the S-steps and the replay: its masks come from the run's
    seed, so two G-steps give the same G and student whatever drew from torch's global RNG before."""
    config = _config(student="vgg9", pool_size=64, pool_steps=1)
    clients, server = _build(config)
    server.setup(InProcessFleet(clients, Ledger(None)))

    def two_steps(global_seed: int) -> list[torch.Tensor]:
        sites, run = copy.deepcopy((clients, server))
        fleet = InProcessFleet(sites, Ledger(None))
        torch.manual_seed(global_seed)  # whatever ran before in the process
        run.distillation_step(fleet)
        run.distillation_step(fleet)
        return [p.detach().clone() for m in (run.student, run.generator) for p in m.parameters()]

    for got, want in zip(two_steps(1), two_steps(2), strict=True):
        assert torch.equal(got, want)


def test_heterogeneous_teachers_and_student(tmp_path):
    config = _config(teachers="lenet5,lenet-fedmdcg,mlp", student="mlp")
    clients, _ = _build(config)
    assert [type(clients[k].teacher).__name__ for k in sorted(clients)] == ["LeNet5", "LeNetFedMDCG", "MLP"]
    summary = run_suite(config, tmp_path / "s", progress=False)[0]
    assert "parameters" not in summary["communication"][UP]["per_kind"]
    assert summary["final"]["teacher_mean_accuracy"] > 0


def test_merged_student_queries_give_the_same_run_with_fewer_exchanges(tmp_path):
    """Carrying step t's S-step inputs in step t+1's query.generate is the same arithmetic."""
    from safetensors.torch import load_file

    from fedistill.federation.ledger import read_ledger

    base = {
        "algorithm": "fediod",
        "clients": 3,
        "rounds": 2,
        "model": "lenet-fedmdcg",
        # the default (stable) preset: the replay pool and the student's input noise ride along too
        "fediod": {"teacher_epochs": 2, "iters_per_epoch": 4, "generator_width": 16, "student_noise": 0.5},
    }
    runs = {}
    for merged in (False, True):
        config = build_config(RunConfig(), base, {"fediod.merge_student_queries": merged})
        summary = run_suite(config, tmp_path / str(merged), progress=False)[0]
        ledger = read_ledger(tmp_path / str(merged) / "fediod" / "ledger.jsonl")
        runs[merged] = (summary, ledger)
    (plain, plain_ledger), (merged, merged_ledger) = runs[False], runs[True]
    assert merged["final"]["test_accuracy"] == plain["final"]["test_accuracy"]
    assert merged["final"]["val_accuracy"] == plain["final"]["val_accuracy"]
    students = [tmp_path / str(m) / "fediod" / "models" / "student.safetensors" for m in (False, True)]
    a, b = (load_file(str(p)) for p in students)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6)

    def student_queries(ledger):
        return sum(1 for r in ledger if r["type"] == "query.student" and r["direction"] == "server->client")

    assert student_queries(plain_ledger) == 2 * 4 * 3  # every G-step, every client
    assert student_queries(merged_ledger) == 2 * 3  # once per epoch (the flush), every client


def test_auto_generator_upsamples_keep_the_base_grid_at_4_px_or_more():
    """auto: the paper's 2 upsamplings unless G's base grid would be under 4 px; set values stick."""
    from fedistill.models.generator import resolve_upsamples

    auto = FedIODOptions()
    assert auto.generator_upsamples == "auto"
    sizes = {4: 0, 8: 1, 12: 1, 16: 2, 28: 2, 30: 1, 32: 2, 64: 2}
    assert {size: resolve_upsamples(auto.generator_upsamples, size) for size in sizes} == sizes
    assert resolve_upsamples(FedIODOptions(generator_upsamples=2).generator_upsamples, 8) == 2
    for bad, says in ((3, "3"), (-1, "-1"), ("twice", "'twice'"), (True, "True")):
        config = build_config(RunConfig(), {"fediod": {"generator_upsamples": bad}})
        with pytest.raises(ConfigError, match=f"fediod.generator_upsamples.*{says}"):
            options_for(config, "fediod", FedIODOptions)


def test_auto_network_widths_suit_the_image_size():
    """Width 0 (the default): 32 / 32 on images up to 16 px, the paper's 64 / 128 above; set values stick."""
    from fedistill.algorithms.fediod.options import network_widths
    from fedistill.models.discriminator import build_discriminator
    from fedistill.models.generator import build_generator

    auto = FedIODOptions()
    assert network_widths(auto, 8) == (32, 32)
    assert network_widths(auto, 28) == (64, 128) and network_widths(auto, 32) == (64, 128)
    assert network_widths(FedIODOptions(generator_width=48, discriminator_width=16), 8) == (48, 16)
    layer = copy.deepcopy(TINY_FEDIOD)
    for key in ("generator_width", "discriminator_width"):
        layer["fediod"].pop(key)
    clients, server, _ = fediod_parts(build_config(RunConfig(), layer, {"algorithm": "fediod"}))
    info = server.ctx.info
    assert info.image_size == 8  # digits

    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    assert count(server.generator) == count(
        build_generator(info, latent_dim=server.options.latent_dim, width=32, upsamples=1)
    )
    assert count(clients[0].discriminator) == count(build_discriminator(info, width=32))
    assert server.generator.upsamples == 1 and server.generator.init_size == 4  # auto on 8x8: from 4x4
    with pytest.raises(ConfigError, match=r"fediod\.generator_width .*-1"):
        options_for(build_config(RunConfig(), {"fediod": {"generator_width": -1}}), "fediod", FedIODOptions)
