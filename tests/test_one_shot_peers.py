"""DENSE and Co-Boosting: their defining steps on hand-made cases, what crosses the boundary (each
site's parameters once), that they distil exactly FedIOD's stage-1 models, that the student beats the
mean standalone client on digits, and exact resume."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from algorithm_helpers import TINY_FEDIOD, check_resume_after_crash, run_recording
from fedistill.algorithms.base import ServerContext
from fedistill.algorithms.fediod import FedIODOptions
from fedistill.algorithms.one_shot.coboosting import (
    CoBoostingOptions,
    CoBoostingServer,
    discrepancy_perturbation,
    ods_perturbation,
    reweight_step,
)
from fedistill.algorithms.one_shot.dense import DenseOptions, DenseServer
from fedistill.algorithms.one_shot.dense import losses as L
from fedistill.config import RunConfig, build_config, options_for
from fedistill.data.registry import load_dataset
from fedistill.engine.launch import run_suite
from fedistill.engine.rundir import read_jsonl
from fedistill.errors import ConfigError
from fedistill.federation.ledger import UP, read_ledger

#: Tiny settings for DENSE and Co-Boosting, next to TINY_FEDIOD (3 clients, 2 teacher epochs).
TINY_ONE_SHOT = {
    "teacher_epochs": 2,
    "synthetic_batch_size": 16,
    "kd_batch_size": 16,
    "g_steps": 2,
    "kd_steps": 2,
    "generator_width": 8,
    "latent_dim": 16,
    "samples_every": 0,
}


def _tiny(algorithms: str, rounds: int = 2, **table) -> RunConfig:
    layer = copy.deepcopy(TINY_FEDIOD)
    layer["fediod"] |= {"iters_per_epoch": 1, "samples_every": 0}
    for name in ("dense", "coboosting"):
        layer[name] = TINY_ONE_SHOT | (table if name in algorithms.split(",") else {})
    return build_config(RunConfig(), layer, {"algorithm": algorithms, "rounds": rounds})


# --- the defining steps, by hand ----------------------------------------------------------------------
A = math.e / (1 + math.e)  # softmax([1, 0])[0]
B = 1 / (1 + math.e**2)  # softmax([0, 2])[0]


class _Teacher(nn.Sequential):
    """BatchNorm (eps 0, fixed running statistics) -> flatten -> linear: hand-computable logits."""

    def __init__(self, mean: float, var: float, weight: list[list[float]]) -> None:
        bn = nn.BatchNorm2d(1, eps=0.0, affine=False)
        bn.running_mean.fill_(mean)
        bn.running_var.fill_(var)
        linear = nn.Linear(2, 2)
        with torch.no_grad():
            linear.weight.copy_(torch.tensor(weight))
            linear.bias.zero_()
        super().__init__(bn, nn.Flatten(), linear)
        self.eval()


def _student() -> nn.Module:
    linear = nn.Linear(2, 2)
    with torch.no_grad():
        linear.weight.zero_()
        linear.bias.copy_(torch.tensor([0.0, 1.0]))  # logits [0, 1] on every input
    return nn.Sequential(nn.Flatten(), linear).eval()


def _hand_server(server_type: type[DenseServer], **options) -> DenseServer:
    """A server whose ensemble is two hand-made teachers. On x = [[1, 0], [0, 1]] (two samples, one
    channel, 1x2 pixels) teacher A (running mean 0, var 1) gives [2, 0] and [0, 1]; teacher B (running
    mean 1, var 4, so it sees (x - 1) / 2) gives [0, 0] and [0, 3]: uniform ensemble [1, 0] and [0, 2]."""
    config = build_config(RunConfig(), {"clients": 2})
    info = load_dataset("digits", "data").info
    kind = CoBoostingOptions if server_type is CoBoostingServer else DenseOptions
    ctx = ServerContext(info, config, kind(**options), 2, lambda m: {"accuracy": 0.0, "loss": 0.0})
    server = server_type(ctx)
    server.clients = [0, 1]
    server.teachers = [_Teacher(0.0, 1.0, [[2, 0], [0, 1]]), _Teacher(1.0, 4.0, [[0, 0], [-6, 0]])]
    server.weights = torch.tensor([0.5, 0.5])
    server.student = _student()
    return server


X = torch.tensor([[1.0, 0.0], [0.0, 1.0]]).view(2, 1, 1, 2)
LABELS = torch.tensor([0, 0])


def test_dense_generator_loss_terms_on_a_hand_made_ensemble():
    server = _hand_server(DenseServer, w_ce=1.0, w_bn=2.0, w_adv=0.5)
    terms = server.generator_terms(X, LABELS)
    # CE of the ensemble against the sampled labels: -log softmax([1, 0])[0], -log softmax([0, 2])[0]
    ce = (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(2))) / 2
    # batch-norm matching: the batch has mean 0.5 and variance 0.25; A expects (0, 1), B (1, 4)
    bn = (0.5 + 0.75) + (0.5 + 3.75)
    # S says [0, 1] everywhere: it disagrees with the ensemble on sample 0 only (the mask keeps that one);
    # KL(softmax([1, 0]) || softmax([0, 1])) = (2a - 1) ln(a / (1 - a)) = 2a - 1
    adv = -(2 * A - 1) / 2
    assert terms["ce"].item() == pytest.approx(ce, rel=1e-6)
    assert terms["bn"].item() == pytest.approx(bn, rel=1e-6)
    assert terms["adv"].item() == pytest.approx(adv, rel=1e-6)
    assert terms["total"].item() == pytest.approx(ce + 2.0 * bn + 0.5 * adv, rel=1e-6)


def test_the_adversarial_term_unmasked_and_at_a_temperature():
    ensemble, student = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    terms = L.generator_losses(
        ensemble, student, LABELS, torch.zeros(()), w_ce=1, w_bn=0, w_adv=1, temperature=2.0, mask=False
    )

    def kl(p: list[float], q: list[float]) -> float:
        return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))

    def soft(z: list[float]) -> list[float]:
        e = [math.exp(v / 2) for v in z]
        return [v / sum(e) for v in e]

    hand = 4 * (kl(soft([1, 0]), soft([0, 1])) + kl(soft([0, 2]), soft([0, 1]))) / 2  # T^2 = 4
    assert terms["adv"].item() == pytest.approx(-hand, rel=1e-6)


def test_a_weighted_ensemble_averages_logits_by_weight():
    logits = torch.tensor([[[2.0, 0.0]], [[0.0, 4.0]]])
    assert L.weighted_logits(logits, torch.tensor([3.0, 1.0])).tolist() == [[1.5, 1.0]]


def test_coboosting_weights_the_generator_cross_entropy_towards_hard_samples():
    server = _hand_server(CoBoostingServer, w_ce=1.0, w_bn=0.0, w_adv=0.0, hard_power=1.0)
    terms = server.generator_terms(X, LABELS)
    # weights 1 - p(y): 1 - a on the easy sample 0, 1 - b on the hard sample 1
    ce = ((1 - A) * math.log(1 + math.exp(-1)) + (1 - B) * math.log(1 + math.exp(2))) / 2
    assert terms["ce"].item() == pytest.approx(ce, rel=1e-6)


def test_the_hard_sample_perturbation_raises_the_student_ensemble_discrepancy():
    rng = torch.Generator().manual_seed(0)
    for _ in range(20):
        w_e, w_s = torch.randn(4, 3, generator=rng), torch.randn(4, 3, generator=rng)

        def ensemble(x: torch.Tensor, w: torch.Tensor = w_e) -> torch.Tensor:
            return x.flatten(1) @ w

        def student(x: torch.Tensor, w: torch.Tensor = w_s) -> torch.Tensor:
            return torch.tanh(x.flatten(1)) @ w

        x = torch.randn(8, 1, 2, 2, generator=rng)
        hard = discrepancy_perturbation(x, ensemble, student, 0.01, 3.0)
        before = L.kl_to_ensemble(student(x), ensemble(x), 3.0)
        after = L.kl_to_ensemble(student(hard), ensemble(hard), 3.0)
        assert after.sum() > before.sum()
        assert torch.allclose((hard - x).abs(), torch.full_like(x, 0.01), atol=1e-6)


def test_ods_moves_each_input_by_eps_in_a_random_output_direction():
    def ensemble(x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ torch.tensor([[1.0, -1.0], [0.5, 2.0]])

    x = torch.tensor([[[[0.3, -0.2]]], [[[1.0, 0.4]]]])
    first = ods_perturbation(x, ensemble, 0.03, 4.0, torch.Generator().manual_seed(7))
    again = ods_perturbation(x, ensemble, 0.03, 4.0, torch.Generator().manual_seed(7))
    assert torch.equal(first, again)
    assert torch.allclose((first - x).abs(), torch.full_like(x, 0.03), atol=1e-6)


def test_ensemble_reweighting_on_a_hand_made_case():
    # one sample of class 0; teacher A says [2, 0] (right), B [0, 2] (wrong). At w = (1/2, 1/2) the
    # ensemble is [1, 1], dCE/dz = p - e_0 = [-1/2, 1/2], dz/dw_k = (z_k - z) / sum(w): A [1, -1], B [-1, 1]
    logits = torch.tensor([[[2.0, 0.0]], [[0.0, 2.0]]])
    label = torch.tensor([0])
    assert reweight_step(logits, label, torch.tensor([0.5, 0.5]), 0.1).tolist() == pytest.approx([0.6, 0.4])
    # the same signs from (1, 0.05): A would pass 1, B would fall below 0; both are clipped to [0, 1]
    assert reweight_step(logits, label, torch.tensor([1.0, 0.05]), 0.1).tolist() == [1.0, 0.0]


def test_the_server_reweights_once_per_pool_batch_with_a_decaying_step():
    server = _hand_server(CoBoostingServer, kd_batch_size=2, reweight_lr=0.1, reweight_decay=0.5)
    server.pool.add(X, LABELS)  # sample 0: A is right, B wrong; sample 1: both wrong, B more so
    assert server._after_synthesis(0) == {
        "ensemble_weight_0": 0.5,
        "ensemble_weight_1": 0.5,
    }  # not at epoch 0
    metrics = server._after_synthesis(2)  # one batch of two samples, step 0.1 * 0.5^2
    assert [metrics["ensemble_weight_0"], metrics["ensemble_weight_1"]] == pytest.approx([0.525, 0.475])


def test_the_reweighting_makes_one_pass_over_the_pool_whatever_the_students_kd_steps():
    """With `kd_steps` = 200 the student takes 200 random batches; the re-weighting still takes one step per
    batch of one pass (here one batch: the same weights as without kd_steps), not 200 steps that would
    drive the weights to the bounds of [0, 1]."""
    weights = []
    for kd_steps in (0, 200):
        server = _hand_server(
            CoBoostingServer, kd_batch_size=2, kd_steps=kd_steps, reweight_lr=0.1, reweight_decay=0.5
        )
        server.pool.add(X, LABELS)
        metrics = server._after_synthesis(2)
        weights.append([metrics["ensemble_weight_0"], metrics["ensemble_weight_1"]])
        assert len(server.pool_batches(torch.Generator().manual_seed(0))) == (kd_steps or 1)
    assert weights[0] == pytest.approx([0.525, 0.475]) and weights[1] == pytest.approx(weights[0])


@pytest.mark.parametrize("server_type", [DenseServer, CoBoostingServer])
def test_a_students_dropout_follows_the_run_seed_not_torchs_global_stream(server_type):
    """VGG-9 drops out; its masks must come from the run's seed, so that the same run (or a resumed one)
    distils the same student whatever drew from torch's global RNG before it."""
    from fedistill.algorithms.shared.training import new_model

    config = build_config(RunConfig(), {"clients": 2, "model": "lenet-fedmdcg"})
    info = load_dataset("digits", "data").info
    kind = CoBoostingOptions if server_type is CoBoostingServer else DenseOptions

    def distilled(global_seed: int) -> torch.Tensor:
        options = kind(student="vgg9", kd_batch_size=8, synthetic_batch_size=16, selection="last")
        ctx = ServerContext(info, config, options, 2, lambda m: {"accuracy": 0.0, "loss": 0.0})
        server = server_type(ctx)
        torch.manual_seed(0)
        server.clients = [0, 1]
        server.teachers = [new_model(config, info, "lenet-fedmdcg").eval() for _ in range(2)]
        server.weights = torch.tensor([0.5, 0.5])
        draw = torch.Generator().manual_seed(0)
        x = torch.randn(16, info.channels, info.image_size, info.image_size, generator=draw)
        server.pool.add(x, torch.randint(info.num_classes, (16,), generator=draw))
        torch.manual_seed(global_seed)  # whatever ran before in the process
        server._distil(0)
        return torch.cat([p.detach().flatten() for p in server.student.parameters()])

    assert torch.equal(distilled(1), distilled(2))


# --- options --------------------------------------------------------------------------------------------
def test_both_train_their_local_models_as_fediod_by_default():
    assert (
        DenseOptions().teacher_epochs == CoBoostingOptions().teacher_epochs == FedIODOptions().teacher_epochs
    )
    assert DenseOptions().teachers == CoBoostingOptions().teachers == FedIODOptions().teachers == ""


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"dense": {"g_steps": 0}}, "dense.g_steps must be >= 1"),
        # one synthetic sample: the first epoch's pool holds no batch of two, so the student would not train
        ({"dense": {"synthetic_batch_size": 1}}, "dense.synthetic_batch_size must be >= 2"),
        ({"dense": {"selection": "test"}}, "dense.selection must be one of clients, server, last"),
        ({"dense": {"pool_size": 10}}, "cannot hold one synthetic batch"),
        ({"dense": {"lr_student": 0.0}}, "dense.lr_student must be a finite number > 0"),
        ({"coboosting": {"perturbation": "pgd"}}, "coboosting.perturbation must be one of ods"),
        ({"coboosting": {"reweight_decay": 1.5}}, "coboosting.reweight_decay must be in"),
        ({"coboosting": {"w_adv": -1.0}}, "coboosting.w_adv must be a finite number >= 0"),
        ({"dense": {"generator_upsamples": 3}}, "dense.generator_upsamples must be auto, 0, 1 or 2; got 3"),
        ({"dense": {"generator_layout": "dcgan"}}, "dense.generator_layout must be one of fediod, dense"),
        # a Co-Boosting option its own switch turns off would be ignored: refused, naming the switch
        (
            {"coboosting": {"perturbation": "none", "perturb_eps": 0.1}},
            r"coboosting.perturb_eps = 0.1 .*coboosting.perturbation = 'none'",
        ),
        (
            {"coboosting": {"perturbation": "discrepancy", "ods_temperature": 2.0}},
            r"coboosting.ods_temperature = 2.0 .*coboosting.perturbation = 'discrepancy'",
        ),
        (
            {"coboosting": {"reweight": False, "reweight_passes": 3}},
            r"coboosting.reweight_passes = 3 .*coboosting.reweight = false",
        ),
    ],
)
def test_bad_options_are_named(table, message):
    name = next(iter(table))
    kind = DenseOptions if name == "dense" else CoBoostingOptions
    with pytest.raises(ConfigError, match=message):
        options_for(build_config(RunConfig(), table), name, kind)


@pytest.mark.parametrize("server_type", [DenseServer, CoBoostingServer])
def test_their_generator_starts_from_a_4x4_grid_on_digits_as_fediods(server_type):
    """auto (the default): 8x8 digits from 4x4, like FedIOD's G; 2 gives the code's 2x2."""
    kind = CoBoostingOptions if server_type is CoBoostingServer else DenseOptions
    config = build_config(RunConfig(), {"clients": 2})
    info = load_dataset("digits", "data").info

    def grid(**options) -> int:
        ctx = ServerContext(info, config, kind(**options), 2, lambda m: {"accuracy": 0.0, "loss": 0.0})
        return server_type(ctx).generator.init_size

    assert kind().generator_upsamples == FedIODOptions().generator_upsamples == "auto"
    assert (grid(), grid(generator_upsamples=2)) == (4, 2)


def test_the_dense_generator_layout_runs_with_the_official_codes_channels(tmp_path):
    """generator_layout = "dense": DENSE's released G (2w channels before the first convolution, not
    FedIOD's 4w), listed by `fedistill list --options dense`; the default stays FedIOD's."""
    from fedistill.reference.options import format_options

    assert DenseOptions().generator_layout == "fediod"
    assert "generator_layout = " in format_options("dense")
    config = build_config(_tiny("dense", rounds=1, generator_layout="dense"), {"val_fraction": 0.0},
                          {"dense": {"selection": "last"}})  # fmt: skip
    summary = run_suite(config, tmp_path / "s", progress=False)[0]
    assert summary["final"]["test_accuracy"] >= 0.0
    info = load_dataset("digits", "data").info
    options = options_for(config, "dense", DenseOptions)
    ctx = ServerContext(info, config, options, 2, lambda m: {"accuracy": 0.0, "loss": 0.0})
    generator = DenseServer(ctx).generator
    assert generator.layout == "dense" and generator.l1[0].out_features == 2 * 8 * 4 * 4


def test_the_official_code_preset_takes_the_released_codes_values_unless_set():
    from fedistill.algorithms.one_shot.coboosting import resolve_options

    config = build_config(RunConfig(), {"coboosting": {"preset": "official-code", "w_bn": 0.5}})
    resolved = resolve_options(config, options_for(config, "coboosting", CoBoostingOptions))
    assert (resolved.adv_temperature, resolved.adv_mask, resolved.kd_temperature) == (3.0, False, 4.0)
    assert (resolved.schedule, resolved.synthetic_batch_size, resolved.w_bn) == ("cosine", 128, 0.5)
    assert resolve_options(RunConfig(), CoBoostingOptions()) == CoBoostingOptions()


def test_selection_on_validation_needs_a_validation_split(tmp_path):
    with pytest.raises(ConfigError, match="val_fraction > 0"):
        run_suite(build_config(_tiny("dense"), {"val_fraction": 0.0}), tmp_path / "s", progress=False)


# --- across the boundary ------------------------------------------------------------------------------
def test_parameters_cross_once_and_the_three_methods_distil_the_same_teachers(tmp_path):
    summaries, seen = run_recording(_tiny("fediod,dense,coboosting"), tmp_path / "suite")
    fediod, dense, coboosting = (summaries[a]["final"] for a in ("fediod", "dense", "coboosting"))
    # the same stage-1 models: FedIOD trained them, DENSE and Co-Boosting loaded all three from the cache
    assert (
        fediod["teachers_from_cache"],
        dense["teachers_from_cache"],
        coboosting["teachers_from_cache"],
    ) == (
        0.0,
        3.0,
        3.0,
    )
    assert len(list((tmp_path / ".cache" / "stage1").glob("teacher-*.safetensors"))) == 3
    for key in ("teacher_mean_accuracy", "teacher_std_accuracy"):
        assert fediod[key] == dense[key] == coboosting[key], key
    assert dense["ensemble_accuracy"] == coboosting["ensemble_accuracy"]
    assert dense["ensemble_accuracy"] == pytest.approx(fediod["ensemble_uniform_accuracy"], abs=1 / 360)
    for algorithm in ("dense", "coboosting"):
        up = [m for m in seen[algorithm] if m.direction == UP]
        with_parameters = [m for m in up if "parameters" in m.arrays]
        assert len(with_parameters) == 3 and {m.type for m in with_parameters} == {"train"}
        assert all(m.arrays == {} for m in up if m not in with_parameters)  # metrics only
        records = read_ledger(tmp_path / "suite" / algorithm / "ledger.jsonl")
        kinds = {kind for r in records if r["direction"] == UP for kind in r["kinds"]}
        assert kinds == {"parameters", "metrics"}
        assert sum("parameters" in r["kinds"] for r in records if r["direction"] == UP) == 3
        assert summaries[algorithm]["final"]["selection"] == "best on the clients' validation splits"
        assert summaries[algorithm]["final"]["fraction_of_ensemble"] > 0.0
        rows = {r["round"]: r for r in read_jsonl(tmp_path / "suite" / algorithm / "metrics.jsonl")}
        final = summaries[algorithm]["final"]
        assert final["val_accuracy"] == rows[final["selected_epoch"]]["val_accuracy"]  # the selected epoch's


def test_each_beats_the_mean_standalone_client_on_digits(tmp_path):
    """Five clients on Dirichlet(0.5) digits, FedIOD's 30 teacher epochs; 20 epochs of a smaller generator
    and batches than the papers' CIFAR settings, ten distillation steps an epoch at a higher learning
    rate. `teacher_mean_accuracy` is the mean standalone client: the very local models distilled."""
    small = {
        "synthetic_batch_size": 64,
        "kd_batch_size": 64,
        "generator_width": 16,
        "latent_dim": 64,
        "kd_steps": 10,
        "lr_student": 0.05,
        "samples_every": 0,
    }
    layer = {"clients": 5, "alpha": 0.5, "model": "lenet-fedmdcg", "rounds": 20, "batch_size": 32}
    config = build_config(
        RunConfig(), layer, {"algorithm": "dense,coboosting", "dense": small, "coboosting": small}
    )
    runs = {s["algorithm"]: s["final"] for s in run_suite(config, tmp_path / "s", progress=False)}
    for algorithm, final in runs.items():
        assert final["test_accuracy"] > final["teacher_mean_accuracy"] + 0.1, (algorithm, final)
        assert final["fraction_of_ensemble"] > 0.6, (algorithm, final)


@pytest.mark.parametrize(
    ("algorithm", "server", "table"),
    [
        ("dense", DenseServer, {"reset_generator": True}),
        ("coboosting", CoBoostingServer, {"perturbation": "discrepancy", "pool_size": 32}),
        ("coboosting", CoBoostingServer, {"kd_steps": 0, "selection": "server"}),
    ],
)
def test_a_resumed_run_ends_exactly_as_an_uninterrupted_one(tmp_path, algorithm, server, table):
    config = _tiny(algorithm, rounds=4, **table)
    run_dir = check_resume_after_crash(config, server, tmp_path, crash_round=3)
    assert (run_dir / "summary.md").is_file()
