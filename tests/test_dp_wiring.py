"""Differential privacy wired into the algorithms: what leaves a DP client is clipped and noised as
configured, each client's epsilon is Opacus' for its (noise, rate, steps, delta), the budget stops a run
cleanly at the right step, and the accountants survive a resume."""

import copy
import json
import logging
import math
import warnings

import pytest
import torch
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from algorithm_helpers import TINY_FEDIOD, fediod_parts
from fedistill.algorithms.base import StopRun
from fedistill.algorithms.classic.fedavg import FedAvgClient, FedAvgOptions, PrivacyReport
from fedistill.algorithms.feddf.feddf import FedDFClient, FedDFOptions
from fedistill.algorithms.fediod import FedIODClient, FedIODOptions, FedIODServer
from fedistill.algorithms.registry import get_algorithm
from fedistill.algorithms.shared.training import new_model
from fedistill.config import RunConfig, build_config, options_for
from fedistill.engine.launch import resume_suite, run_suite
from fedistill.engine.rundir import read_jsonl
from fedistill.engine.setup import client_contexts, prepare_data
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.ledger import Ledger
from fedistill.federation.messages import Message
from fedistill.privacy.accounting import DPConfig
from fedistill.privacy.budget import ClientBudget, warn_if_delta_too_large
from fedistill.seeding import torch_generator
from fedistill.transports.inprocess import InProcessFleet

pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha")  # sigma ~ 0 probes

TINY = {**TINY_FEDIOD, "fediod": {**TINY_FEDIOD["fediod"], "dp_enabled": True}}
B = TINY["fediod"]["synthetic_batch_size"]
STEPS = TINY["fediod"]["iters_per_epoch"] * TINY["rounds"]


def opacus_epsilon(noise: float, rate: float, steps: int, delta: float = 1e-5) -> float:
    """Epsilon straight from Opacus' RDP analysis, with its accountant's default orders."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rdp = compute_rdp(q=rate, noise_multiplier=noise, steps=steps, orders=RDPAccountant.DEFAULT_ALPHAS)
        eps, _ = get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)
    return float(eps)


def _fediod_config(**fediod) -> RunConfig:
    layer = copy.deepcopy(TINY)
    layer["fediod"].update(fediod)
    return build_config(RunConfig(), layer, {"algorithm": "fediod"})


class RecordingFleet(InProcessFleet):
    """The in-process transport, keeping every reply as it crossed the boundary."""

    def __init__(self, clients):
        super().__init__(clients, Ledger(None))
        self.replies: list[tuple[str, int, Message]] = []

    def send(self, requests, *, step=None, timeout=None, expect=None):
        replies = super().send(requests, step=step, timeout=timeout, expect=expect)
        types = {cid: m.type for cid, m in requests.items()}
        self.replies += [(types[cid], cid, r.message) for cid, r in replies.items() if r.ok]
        return replies


def _fediod(config: RunConfig):
    clients, server, sizes = fediod_parts(config)
    fleet = RecordingFleet(clients)
    server.setup(fleet)
    return clients, server, fleet, sizes


def _input_gradients(fleet: RecordingFleet) -> dict[int, torch.Tensor]:
    return {
        cid: m.tensor("input-gradients", "x") for kind, cid, m in fleet.replies if kind == "query.backprop"
    }


# --------------------------------------------------------------------------------------------------
# options
# --------------------------------------------------------------------------------------------------


def test_dp_options_are_checked_with_their_own_names():
    def options(algorithm, options_type, **dp):
        return options_for(build_config(RunConfig(), {algorithm: dp}), algorithm, options_type)

    with pytest.raises(ConfigError, match="dp_enabled = true needs dp_noise_multiplier > 0"):
        options("fediod", FedIODOptions, dp_enabled=True)
    with pytest.raises(ConfigError, match="dp_enabled = false"):
        options("fedavg", FedAvgOptions, dp_target_epsilon=4.0)
    with pytest.raises(ConfigError, match="dp_clip_norm"):
        options("feddf", FedDFOptions, dp_enabled=True, dp_noise_multiplier=1.0, dp_clip_norm=-1.0)
    with pytest.raises(ConfigError, match="dp_accounting"):
        options("fediod", FedIODOptions, dp_enabled=True, dp_noise_multiplier=1.0, dp_accounting="x")
    dp = options("fedprox", FedAvgOptions, dp_enabled=True, dp_target_epsilon=3.0, dp_delta=1e-6).dp
    assert (dp.enabled, dp.target_epsilon, dp.delta, dp.noise_multiplier) == (True, 3.0, 1e-6, 0.0)


@pytest.mark.parametrize("algorithm", ["fedavg-oneshot", "feddf-oneshot"])
def test_one_shot_baselines_refuse_dp_they_would_not_apply(algorithm):
    """Their options come from FedDF's, dp_* keys included, but their clients upload the raw stage-1
    models: dp_enabled = true was accepted and the run went on without clipping, noise or epsilon."""
    options = get_algorithm(algorithm).options
    dp = {"dp_enabled": True, "dp_noise_multiplier": 1.0}
    with pytest.raises(ConfigError, match=f"{algorithm} does not offer differential privacy"):
        options_for(build_config(RunConfig(), {algorithm: dp}, {"algorithm": algorithm}), algorithm, options)
    options_for(build_config(RunConfig(), {"algorithm": algorithm}), algorithm, options)  # off: fine


# --------------------------------------------------------------------------------------------------
# FedIOD: the sanitised input-gradients
# --------------------------------------------------------------------------------------------------


def test_every_fediod_input_gradient_that_leaves_a_client_is_clipped():
    """Noise-free limit (noise multiplier 1e-9): each returned per-sample gradient has norm <= C."""
    clip = 1e-3  # below the typical per-sample norm here, so the bound is active
    # full-precision messages: the bound is checked on what left the site before any wire rounding (rounding
    # afterwards is post-processing of the sanitised release)
    config = _fediod_config(dp_noise_multiplier=1e-9, dp_clip_norm=clip, wire="float32")
    clients, server, fleet, _ = _fediod(config)
    for _ in range(2):
        server.distillation_step(fleet)
    grads = [m.tensor("input-gradients", "x") for kind, _, m in fleet.replies if kind == "query.backprop"]
    assert len(grads) == 2 * len(clients)
    norms = torch.cat([g.flatten(1).norm(dim=1) for g in grads])
    assert norms.numel() == 2 * len(clients) * B
    assert norms.max() <= clip * (1 + 1e-4)
    assert norms.min() > 0.99 * clip  # every one was above the bound and scaled onto it


def test_fediod_noise_has_the_configured_scale():
    """Same run with noise multiplier 1e-9 and 2: the first step's returned gradients differ by the noise
    alone (same seed, same draw), which must be N(0, (sigma C)^2) per coordinate."""
    sigma, clip = 2.0, 1e-3
    returned = {}
    for noise in (1e-9, sigma):
        _, server, fleet, _ = _fediod(_fediod_config(dp_noise_multiplier=noise, dp_clip_norm=clip))
        server.distillation_step(fleet)
        returned[noise] = _input_gradients(fleet)
    z = torch.cat([(returned[sigma][c] - returned[1e-9][c]).flatten() for c in returned[sigma]])
    z = z.double() / (sigma * clip)
    n = z.numel()
    assert abs(float(z.mean())) < 4 / math.sqrt(n)
    assert abs(float(z.std()) - 1.0) < 4 / math.sqrt(2 * n)
    within = float((z.abs() < 1).double().mean())
    assert abs(within - 0.6827) < 4 * math.sqrt(0.6827 * 0.3173 / n)


# --------------------------------------------------------------------------------------------------
# FedIOD: accounting, the summary, the budget stop, resume
# --------------------------------------------------------------------------------------------------


def test_fediod_epsilon_per_client_in_the_summary_equals_opacus(tmp_path):
    noise = 1.3
    config = _fediod_config(dp_noise_multiplier=noise)
    summary = run_suite(config, tmp_path / "s", progress=False)[0]
    final, sizes = summary["final"], summary["partition"]["sizes"]
    expected = {k: opacus_epsilon(noise, min(B, n) / n, STEPS) for k, n in enumerate(sizes)}
    for k, eps in expected.items():
        assert final[f"epsilon_client_{k}"] == pytest.approx(eps, rel=1e-9)
    assert final["epsilon_max"] == pytest.approx(max(expected.values()), rel=1e-9)
    assert final["dp_delta"] == 1e-5 and final["dp_accounting"] == "d-step"
    assert summary["stopped"] is None
    rows = read_jsonl(tmp_path / "s" / "fediod" / "metrics.jsonl")
    assert all("epsilon_max" in row for row in rows)  # reported every epoch
    assert all(row["loss_discriminator"] is None for row in rows)  # the real-batch loss stays home


def test_fediod_calibrated_noise_spends_the_target_over_the_planned_steps(tmp_path):
    target = 3.0
    summary = run_suite(_fediod_config(dp_target_epsilon=target), tmp_path / "s", progress=False)[0]
    assert summary["stopped"] is None
    for k in range(3):
        assert target - 0.02 <= summary["final"][f"epsilon_client_{k}"] <= target


def test_fediod_release_accounting_is_the_unamplified_batch_bound(tmp_path):
    noise = 40.0
    summary = run_suite(
        _fediod_config(dp_noise_multiplier=noise, dp_accounting="release"), tmp_path / "s", progress=False
    )[0]
    expected = opacus_epsilon(noise / (2 * math.sqrt(B)), 1.0, STEPS)
    for k in range(3):
        assert summary["final"][f"epsilon_client_{k}"] == pytest.approx(expected, rel=1e-9)


def test_fediod_release_calibration_covers_the_largest_release_a_step_can_make():
    """`owner_queries` asks a site about its own rows of each batch only, so what it releases per step
    varies: noise calibrated on the first (small) release must still cover a full batch's on every
    later step, so the planned steps end within the target instead of being refused."""
    target, planned = 3.0, 10
    config = _fediod_config(dp_target_epsilon=target, dp_accounting="release")
    options = options_for(config, "fediod", FedIODOptions)
    ctx = client_contexts(config, get_algorithm("fediod"), options, prepare_data(config))[0]
    client = FedIODClient(ctx)
    client._spend(B, 2, planned)  # step 1: two of the batch's B samples are this site's
    for _ in range(planned - 1):
        client._spend(B, B, planned)  # later steps: all of them
    assert client.budget.epsilon() <= target


def test_fediod_budget_stop_at_the_right_step_ends_the_run_cleanly(tmp_path):
    noise = 1.0
    probe = run_suite(_fediod_config(dp_noise_multiplier=noise), tmp_path / "probe", progress=False)[0]
    rates = {k: min(B, n) / n for k, n in enumerate(probe["partition"]["sizes"])}
    # a target just above the most exposed client's epsilon after 3 steps: its 4th step (G-step 3,
    # the second of epoch 2) must be refused
    target = max(opacus_epsilon(noise, q, 3) for q in rates.values()) + 1e-6
    refusing = sorted(k for k, q in rates.items() if opacus_epsilon(noise, q, 4) > target)
    assert refusing

    config = _fediod_config(dp_noise_multiplier=noise, dp_target_epsilon=target)
    summary = run_suite(config, tmp_path / "s", progress=False)[0]
    run = tmp_path / "s" / "fediod"
    assert summary["stopped"].startswith("stopped at G-step 3: client(s) ")
    assert summary["stopped"].split("client(s) ")[1].startswith(", ".join(map(str, refusing)) + " refused")
    assert "privacy budget exceeded" in summary["stopped"]
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2] and rows[-1]["stopped"] is True
    assert "test_accuracy" in rows[-1]  # the partial epoch was evaluated
    final = summary["final"]
    for k, q in rates.items():
        spent = 3 if k in refusing else 4
        assert final[f"epsilon_client_{k}"] == pytest.approx(opacus_epsilon(noise, q, spent), rel=1e-9)
        assert final[f"epsilon_client_{k}"] <= target
    assert 0.0 <= final["test_accuracy"] <= 1.0 and final["selected_epoch"] in (1, 2)
    assert (run / "summary.json").is_file() and "stopped early" in (run / "summary.md").read_text()
    assert (run / "models" / "student.safetensors").is_file()
    # the refusal crossed as a reply, not as a failure: nobody was dropped
    assert summary["dropped_clients"] == {}


def test_fediod_accountants_round_trip_through_resume(tmp_path, monkeypatch):
    """Compared with a second, uninterrupted run, so the noise comes from the run seed here (`dp_noise_seed =
    "run"`); with the default secret noise a resumed run reads its sites' secrets back (test below)."""
    config = _fediod_config(dp_target_epsilon=4.0, dp_noise_seed="run")
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
    resumed = resume_suite(tmp_path / "cut", progress=False)[0]

    def rows(path):
        return [
            {k: v for k, v in r.items() if not k.endswith("_s")}
            for r in read_jsonl(path / "fediod" / "metrics.jsonl")
        ]

    assert rows(tmp_path / "cut") == rows(tmp_path / "ref")
    assert resumed["final"]["epsilon_max"] == pytest.approx(rows(tmp_path / "ref")[-1]["epsilon_max"])


def test_fediod_client_state_keeps_the_accountant_and_the_calibrated_noise():
    clients, server, fleet, _ = _fediod(_fediod_config(dp_target_epsilon=5.0))
    server.distillation_step(fleet)
    client = clients[0]
    state = client.state_dict()
    fresh = FedIODClient(client.ctx)
    fresh.load_state_dict(copy.deepcopy(state))
    assert fresh.budget.accountant.history == client.budget.accountant.history
    assert fresh.budget.accountant.steps == 1
    assert fresh.budget.noise == client.budget.noise > 0
    assert fresh.budget.epsilon() == client.budget.epsilon() > 0


# --------------------------------------------------------------------------------------------------
# FedAvg family: the clipped and noised update
# --------------------------------------------------------------------------------------------------

SMALL = {"clients": 5, "alpha": 0.5, "rounds": 3, "model": "mlp", "batch_size": 32, "lr": 0.05}


def _fedavg_client(cls, algorithm: str, **dp):
    config = build_config(RunConfig(), SMALL, {"algorithm": algorithm, algorithm: {"dp_enabled": True, **dp}})
    alg = get_algorithm(algorithm)
    options = options_for(config, algorithm, alg.options)
    ctx = client_contexts(config, alg, options, prepare_data(config))[0]
    return cls(ctx), new_model(config, ctx.info).state_dict()


def _train(client, global_state, round=1):
    request = Message.build(
        "train",
        arrays={"parameters": global_state},
        scalars={"config": {"round": round, "prox_mu": 0.0, "evaluate_local": False}},
    )
    return client.handle(request)


def _update(reply, global_state) -> torch.Tensor:
    sent = reply.tensors("parameters")
    return torch.cat([(sent[k] - global_state[k]).flatten() for k in global_state])


@pytest.mark.parametrize(("cls", "algorithm"), [(FedAvgClient, "fedavg"), (FedDFClient, "feddf")])
def test_dp_client_updates_are_clipped_and_noised_as_configured(cls, algorithm):
    clip, sigma = 0.05, 3.0
    client, global_state = _fedavg_client(cls, algorithm, dp_noise_multiplier=1e-9, dp_clip_norm=clip)
    clipped = _update(_train(client, global_state), global_state)
    assert clip * 0.999 <= float(clipped.norm()) <= clip * (1 + 1e-6)  # the raw update is longer

    noisy_client, _ = _fedavg_client(cls, algorithm, dp_noise_multiplier=sigma, dp_clip_norm=clip)
    reply = _train(noisy_client, global_state)
    z = (_update(reply, global_state) - clipped).double() / (sigma * clip)
    n = z.numel()
    assert abs(float(z.mean())) < 4 / math.sqrt(n)
    assert abs(float(z.std()) - 1.0) < 4 / math.sqrt(2 * n)
    assert "train_loss" not in reply.scalars["metrics"]  # computed on private data, not sanitised
    assert reply.scalar("metrics", "noise_multiplier") == sigma


def test_dp_refuses_batchnorm_models():
    with pytest.raises(ConfigError, match="BatchNorm"):
        config = build_config(
            RunConfig(),
            SMALL,
            {"model": "lenet-fedmdcg", "fedavg": {"dp_enabled": True, "dp_noise_multiplier": 1.0}},
        )
        alg = get_algorithm("fedavg")
        ctx = client_contexts(
            config, alg, options_for(config, "fedavg", FedAvgOptions), prepare_data(config)
        )[0]
        FedAvgClient(ctx)


def test_dp_fedavg_epsilons_with_client_sampling_and_budget_stop(tmp_path):
    noise, fraction = 1.5, 0.6  # 3 of 5 clients per round: q = 0.6, one step per round for every client
    dp = {"dp_enabled": True, "dp_noise_multiplier": noise, "dp_clip_norm": 0.5}
    config = build_config(RunConfig(), SMALL, {"algorithm": "fedavg", "fraction": fraction, "fedavg": dp})
    summary = run_suite(config, tmp_path / "s", progress=False)[0]
    expected = opacus_epsilon(noise, 0.6, SMALL["rounds"])
    for k in range(5):
        assert summary["final"][f"epsilon_client_{k}"] == pytest.approx(expected, rel=1e-9)
    assert summary["final"]["epsilon_max"] == pytest.approx(expected, rel=1e-9)
    assert summary["final"]["dp_sample_rate"] == 0.6 and summary["final"]["dp_rounds"] == SMALL["rounds"]
    assert summary["communication"]["client->server"]["per_kind"].keys() >= {"parameters", "metrics"}

    target = opacus_epsilon(noise, 0.6, 2) + 1e-6  # round 3 must be refused
    config = build_config(config, {"fedavg.dp_target_epsilon": target})
    stopped = run_suite(config, tmp_path / "stop", progress=False)[0]
    assert stopped["stopped"].startswith("stopped at round 3")
    assert [r["round"] for r in read_jsonl(tmp_path / "stop" / "fedavg" / "metrics.jsonl")] == [1, 2, 3]
    for k in range(5):  # every client caught up to the 2 completed rounds
        assert stopped["final"][f"epsilon_client_{k}"] == pytest.approx(target - 1e-6, rel=1e-9)


def test_dp_fedavg_client_state_round_trips():
    client, global_state = _fedavg_client(FedAvgClient, "fedavg", dp_target_epsilon=6.0)
    _train(client, global_state, round=1)
    _train(client, global_state, round=3)  # not sampled in round 2: that round is recorded too
    fresh, _ = _fedavg_client(FedAvgClient, "fedavg", dp_target_epsilon=6.0)
    fresh.load_state_dict(copy.deepcopy(client.state_dict()))
    assert fresh.budget.accountant.steps == client.budget.accountant.steps == 3
    assert fresh.accounted_round == 3 and fresh.budget.noise == client.budget.noise
    assert fresh.budget.epsilon() == pytest.approx(client.budget.epsilon())
    plain, _ = _fedavg_client(FedAvgClient, "fedavg", dp_target_epsilon=6.0)
    plain.budget = None
    with pytest.raises(FederationError, match="FedAvgClient keeps no state but a checkpoint holds some"):
        plain.load_state_dict(client.state_dict())  # a client without DP refuses DP state


def test_stop_run_carries_the_partial_metrics():
    stop = StopRun("why", {"a": 1.0})
    assert str(stop) == "why" and stop.metrics == {"a": 1.0}


def test_dp_over_flower_with_a_fresh_process_per_message_matches_in_process(tmp_path):
    """The accountants live in the nodes' stored client state (a fresh ClientApp per message) and
    `query.privacy` crosses Flower: the epsilons and results equal the in-process ones."""
    pytest.importorskip("flwr")
    from fedistill.engine.flower import node as flower_node
    from fedistill.engine.flower.apps import make_client_app
    from flower_local_grid import LocalGrid, run_on_grid

    layer = copy.deepcopy(TINY)
    # two runs compared: the noise from the run seed (the default secret noise differs between runs)
    layer["fediod"].update(dp_noise_multiplier=1.3, dp_target_epsilon=50.0, dp_noise_seed="run")
    fedavg = {"dp_enabled": True, "dp_noise_multiplier": 1.0, "dp_clip_norm": 0.5, "dp_noise_seed": "run"}
    config = build_config(
        RunConfig(), layer, {"algorithm": "fedavg,fediod", "model": "mlp", "fraction": 0.67, "fedavg": fedavg}
    )
    here = run_suite(config, tmp_path / "inprocess", progress=False)
    app = make_client_app(config, state_root=tmp_path / "nodes")

    def ephemeral(message, context):
        flower_node._NODES.clear()
        return app(message, context)

    grid = LocalGrid(ephemeral, config.clients)
    there = run_on_grid(config, tmp_path / "flower", grid)
    for a, b in zip(here, there, strict=True):
        assert b["transport"] == "flower"
        for k in range(3):
            key = f"epsilon_client_{k}"
            assert b["final"][key] == pytest.approx(a["final"][key], rel=1e-12) and a["final"][key] > 0
        assert b["final"]["test_accuracy"] == pytest.approx(a["final"]["test_accuracy"], abs=1e-6)


# --------------------------------------------------------------------------------------------------
# where the noise comes from (`dp_noise_seed`)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("noise_seed", ["run", "secret"])
def test_only_noise_from_the_run_seed_can_be_taken_off_by_the_server(noise_seed):
    """The server knows the run seed, the client and the round. From them it regenerates noise seeded by the
    run (`dp_noise_seed = "run"`) and recovers the clipped update exactly; the default secret noise it
    cannot: what is left after taking off its guess is as large as the noise."""
    clip, sigma = 0.05, 3.0
    quiet, global_state = _fedavg_client(FedAvgClient, "fedavg", dp_noise_multiplier=1e-9, dp_clip_norm=clip)
    clipped = _update(_train(quiet, global_state), global_state)
    client, _ = _fedavg_client(
        FedAvgClient, "fedavg", dp_noise_multiplier=sigma, dp_clip_norm=clip, dp_noise_seed=noise_seed
    )
    released = _update(_train(client, global_state), global_state)
    known = torch_generator(client.ctx.config.seed, "dp-update", client.ctx.client_id, 1)
    guess = torch.randn((released.numel(),), generator=known) * sigma * clip
    left = float((released - guess - clipped).norm())
    noise = sigma * clip * math.sqrt(released.numel())
    if noise_seed == "run":
        assert left < 1e-3 * clip
    else:
        assert left > 0.5 * noise


def test_secret_noise_differs_between_clients_runs_and_repeated_rounds_and_survives_a_checkpoint():
    """Each client draws its own secret; a round the server asks for twice gets fresh noise (the same
    noise twice would cancel in the difference of the two releases); the client's state carries the
    secret and the count of releases, so a restored client draws exactly the noise the original would."""
    config = DPConfig(enabled=True, noise_multiplier=1.0)
    a, b = ClientBudget(config, 0, run_seed=0), ClientBudget(config, 0, run_seed=0)
    assert a.secret is not None and a.secret != b.secret
    first, again = a.noise_generator("dp-update", 1), a.noise_generator("dp-update", 1)
    assert not torch.equal(torch.randn(8, generator=first), torch.randn(8, generator=again))
    restored = ClientBudget(config, 0, run_seed=0)
    restored.load_state_dict(a.state_dict())
    assert torch.equal(
        torch.randn(8, generator=restored.noise_generator("dp-update", 2)),
        torch.randn(8, generator=a.noise_generator("dp-update", 2)),
    )
    seeded = ClientBudget(DPConfig(enabled=True, noise_multiplier=1.0, noise_seed="run"), 3, run_seed=7)
    assert seeded.secret is None
    assert torch.equal(
        torch.randn(8, generator=seeded.noise_generator("dp-update", 5)),
        torch.randn(8, generator=torch_generator(7, "dp-update", 3, 5)),
    )


def test_the_secret_never_crosses_the_boundary(tmp_path):
    """No message of a DP run carries the clients' secrets: the ledger's payloads hold none of their bytes
    and no scalar equals one."""
    clients, server, fleet, _ = _fediod(_fediod_config(dp_noise_multiplier=1.0))
    server.distillation_step(fleet)
    secrets_ = {c.budget.secret for c in clients.values()}
    assert None not in secrets_ and len(secrets_) == len(clients)
    for _, _, message in fleet.replies:
        scalars = repr(message.scalars)
        assert not any(str(s) in scalars for s in secrets_)


def test_an_unknown_noise_seed_is_refused():
    with pytest.raises(ConfigError, match="noise_seed"):
        options_for(_fediod_config(dp_noise_multiplier=1.0, dp_noise_seed="public"), "fediod", FedIODOptions)


def test_a_round_asked_for_again_is_accounted_again():
    """An honest server asks for each round once; a round asked for twice is a second release and costs a
    second step, not nothing."""
    client, global_state = _fedavg_client(FedAvgClient, "fedavg", dp_noise_multiplier=1.0)
    _train(client, global_state, round=1)
    once = client.budget.epsilon()
    _train(client, global_state, round=1)
    assert client.budget.epsilon() > once


def _refusal(**extra_metrics):
    from fedistill.privacy.accounting import PrivacyBudgetExceeded
    from fedistill.privacy.budget import refusal

    reply = refusal("train", PrivacyBudgetExceeded("client 0", 3.0, 2.0, 1e-5), 1.5)
    if not extra_metrics:
        return reply
    return type(reply).build("train", scalars={"metrics": {**reply.scalars["metrics"], **extra_metrics}})


def test_a_refusal_is_valid_only_where_the_request_takes_one_and_carries_nothing_else():
    """A reply flagged as a refusal skipped every check: it carried arrays of any shape to servers that
    never read refusals (FedMD-CG broadcast them into its weights)."""
    import numpy as np

    from fedistill.errors import FederationError
    from fedistill.federation.messages import ArraySpec, Message
    from fedistill.federation.reply_spec import ReplySpec

    spec = {"parameters": {"w": ArraySpec("float32", (2,))}}
    ReplySpec(spec, ("num_samples",), refusable=True).check(_refusal())  # the honest refusal
    with pytest.raises(FederationError, match="a privacy-budget refusal, which this request does not take"):
        ReplySpec(spec, ("num_samples",)).check(_refusal())
    smuggled = Message.build(
        "train",
        arrays={"parameters": {"w": np.zeros(1, dtype=np.float32)}},
        scalars=_refusal().scalars,
    )
    with pytest.raises(FederationError, match="refusal that carries arrays"):
        ReplySpec(spec, refusable=True).check(smuggled)
    with pytest.raises(FederationError, match=r"refusal with other scalars \(\['num_samples'\]\)"):
        ReplySpec(spec, refusable=True).check(_refusal(num_samples=5))
    with pytest.raises(FederationError, match="'epsilon' is 'x', not a number"):
        ReplySpec(spec, refusable=True).check(_refusal(epsilon="x"))


def test_a_metric_that_is_not_a_number_makes_the_reply_invalid_even_when_the_spec_does_not_name_it():
    """FedAvg reads `train_loss` (and the privacy report `epsilon`) with float() when a reply has one: a
    string there crashed the server instead of dropping the reply."""
    import numpy as np

    from fedistill.errors import FederationError
    from fedistill.federation.messages import Message
    from fedistill.federation.reply_spec import ReplySpec

    arrays = {"parameters": {"w": np.zeros(2, dtype=np.float32)}}
    spec = ReplySpec({}, ("num_samples",))
    spec.check(Message.build("train", arrays=arrays, scalars={"metrics": {"num_samples": 3, "flag": True}}))
    bad = Message.build("train", arrays=arrays, scalars={"metrics": {"num_samples": 3, "train_loss": "x"}})
    with pytest.raises(FederationError, match="metric 'train_loss' is 'x', not a number"):
        spec.check(bad)


def test_a_fediod_model_card_says_what_its_epsilon_does_not_cover(tmp_path):
    """A card printed a bare "epsilon E at delta D" for a student distilled from un-noised logits, under
    an accounting the docs call no bound on what a site sends, and with noise from the run's seed."""
    import fedistill

    config = _fediod_config(dp_noise_multiplier=1.3, dp_noise_seed="run")
    run_suite(config, tmp_path / "s", progress=False)
    path = fedistill.export(tmp_path / "s", "fediod")
    card = (path.parent / f"{path.name}.card.md").read_text(encoding="utf-8")
    assert "at delta 1e-05." in card and "carries no differential-privacy guarantee" in card
    assert "the paper's convention" in card and "anyone who knows it can regenerate" in card


def test_a_fedavg_model_card_says_what_its_epsilon_does_not_cover():
    """Client-level DP bounds each client's noised update; its sample count travels un-noised, and with
    fewer than all clients per round the epsilon counts on an amplification the server (which picks them)
    does not grant. The card said it covered "what each client releases"."""
    from fedistill.inference.model_card import privacy

    final = {"epsilon_max": 2.0, "epsilon_client_0": 2.0, "dp_delta": 1e-5, "dp_sample_rate": 0.6}
    covers = privacy(final, {"dp_noise_seed": "secret"})["covers"]
    assert "update" in covers and "sample counts" in covers and "not the server" in covers
    everyone = privacy(final | {"dp_sample_rate": 1.0}, {"dp_noise_seed": "secret"})["covers"]
    assert "sample counts" in everyone and "server" not in everyone


def test_a_fedavg_model_card_names_every_metric_a_dp_client_sends_un_noised():
    """Besides its sample count, a DP client sends its local step count and, on evaluation rounds, its
    noised model's accuracy on its own test share, all un-noised; the card named the sample counts alone."""
    from fedistill.inference.model_card import privacy

    client, global_state = _fedavg_client(FedAvgClient, "fedavg", dp_noise_multiplier=1.0)
    request = Message.build(
        "train",
        arrays={"parameters": global_state},
        scalars={"config": {"round": 1, "prox_mu": 0.0, "evaluate_local": True}},
    )
    sent = set(client.handle(request).scalars["metrics"])
    assert {"num_samples", "steps", "local_accuracy", "local_count"} <= sent and "train_loss" not in sent
    final = {"epsilon_max": 2.0, "epsilon_client_0": 2.0, "dp_delta": 1e-5, "dp_sample_rate": 1.0}
    covers = privacy(final, {"dp_noise_seed": "secret"})["covers"]
    assert "sample counts" in covers and "step counts" in covers and "own test share" in covers


def test_a_fedkd_model_card_states_the_pate_guarantee_of_its_labels():
    """FedKD's student learns from GNMax's noisy labels alone, and the summary holds their PATE epsilons;
    its card said "Trained without differential privacy". It now states the data-independent epsilon (the
    one that may be published) and what it leaves out; without noise there is none."""
    from fedistill.inference.model_card import privacy

    final = {
        "pate_sigma": 40.0,
        "pate_delta": 1e-5,
        "pate_epsilon_data_independent": 5.9,
        "pate_epsilon_data_dependent": 1.2,
    }
    card = privacy(final, {"pate_noise_seed": "secret"})
    assert (card["epsilon"], card["delta"], card["accounting"]) == (5.9, 1e-5, "pate")
    assert "labels" in card["covers"] and "client" in card["covers"] and "votes" in card["covers"]
    assert "regenerate" in privacy(final, {"pate_noise_seed": "run"})["covers"]
    assert privacy({"test_accuracy": 0.9}, {"pate_noise_seed": "secret"}) is None  # pate_sigma = 0


def _interrupt_fedavg_after(monkeypatch, config: RunConfig, out, stop_round: int):
    """Run `config` until its sites have released round `stop_round`, then interrupt it there (before
    that round's checkpoint); returns FedAvg's own `run_round`, for the resume."""
    from fedistill.algorithms.classic.fedavg import FedAvgServer

    original = FedAvgServer.run_round

    def stop_after(self, fleet, round):
        metrics = original(self, fleet, round)
        if round == stop_round:
            raise KeyboardInterrupt
        return metrics

    monkeypatch.setattr(FedAvgServer, "run_round", stop_after)
    with pytest.raises(KeyboardInterrupt):
        run_suite(config, out, progress=False)
    return original


def test_releases_after_the_checkpoint_count_and_get_fresh_noise_on_resume(tmp_path, monkeypatch):
    """A run stopped after its sites released round 2 but before its checkpoint resumes from round 1: the
    sites' journals (privacy/journal.py) make the accountants count round 2's first releases too, and the
    repeats draw new noise streams, so no two releases share noise (the checkpoint alone counted 3 rounds
    for 4 releases and re-drew round 2's noise)."""
    from fedistill.algorithms.classic.fedavg import FedAvgServer
    from fedistill.privacy.journal import journal_file

    dp = {"dp_enabled": True, "dp_noise_multiplier": 1.0, "dp_clip_norm": 1.0}
    config = build_config(RunConfig(), SMALL, {"algorithm": "fedavg", "fedavg": dp})
    reference = run_suite(config, tmp_path / "ref", progress=False)[0]
    original = _interrupt_fedavg_after(monkeypatch, config, tmp_path / "cut", 2)  # its checkpoint unwritten
    run = tmp_path / "cut" / "fedavg"
    kept = json.loads(journal_file(run, 0).read_text())
    assert kept["releases"] == 2 and kept["accountant"]["history"][0][2] == 2
    monkeypatch.setattr(FedAvgServer, "run_round", original)
    resumed = resume_suite(tmp_path / "cut", progress=False)[0]
    rate = 1.0  # every site every round
    assert reference["final"]["epsilon_max"] == pytest.approx(opacus_epsilon(1.0, rate, 3), rel=1e-9)
    assert resumed["final"]["epsilon_max"] == pytest.approx(opacus_epsilon(1.0, rate, 4), rel=1e-9)
    assert json.loads(journal_file(run, 0).read_text())["releases"] == 4  # round 2's repeat: stream 3


def test_releases_of_a_run_stopped_before_its_first_checkpoint_count_when_it_starts_over(
    tmp_path, monkeypatch
):
    """A run stopped after its sites released round 1 but before any checkpoint starts over on resume,
    with new sites: their journals still make the accountants count round 1's first releases, and the
    repeats draw later noise streams of the same secret (starting over alone counted 3 rounds for 4
    releases, and drew the repeat's noise from a new secret the accountant knew nothing of)."""
    from fedistill.algorithms.classic.fedavg import FedAvgServer
    from fedistill.engine.resume import resume_point
    from fedistill.privacy.journal import journal_file

    dp = {"dp_enabled": True, "dp_noise_multiplier": 1.0, "dp_clip_norm": 1.0}
    config = build_config(RunConfig(), SMALL, {"algorithm": "fedavg", "fedavg": dp})
    original = _interrupt_fedavg_after(monkeypatch, config, tmp_path / "cut", 1)  # no checkpoint yet
    run = tmp_path / "cut" / "fedavg"
    assert resume_point(run) is None  # nothing to resume from: the run starts over
    first = json.loads(journal_file(run, 0).read_text())
    assert first["releases"] == 1
    monkeypatch.setattr(FedAvgServer, "run_round", original)
    resumed = resume_suite(tmp_path / "cut", progress=False)[0]
    assert resumed["final"]["epsilon_max"] == pytest.approx(opacus_epsilon(1.0, 1.0, 4), rel=1e-9)
    kept = json.loads(journal_file(run, 0).read_text())
    assert kept["secret"] == first["secret"] and kept["releases"] == 4


def test_noise_from_the_run_seed_keeps_no_journal(tmp_path):
    from fedistill.privacy.journal import journal_file

    dp = {"dp_enabled": True, "dp_noise_multiplier": 1.0, "dp_clip_norm": 1.0}
    for seed, kept in (("run", False), ("secret", True)):  # the secret's journal: where the other would be
        fedavg = {**dp, "dp_noise_seed": seed}
        config = build_config(RunConfig(), SMALL, {"algorithm": "fedavg", "rounds": 1, "fedavg": fedavg})
        run_suite(config, tmp_path / seed, progress=False)
        assert journal_file(tmp_path / seed / "fedavg", 0).parent.exists() is kept, seed


# --------------------------------------------------------------------------------------------------
# delta against the number of individuals protected
# --------------------------------------------------------------------------------------------------


def test_a_delta_not_below_one_over_the_records_is_warned_about(caplog):
    """delta >= 1/n allows a mechanism that releases some record outright. FedIOD's accounting protects
    one record of a site's training set: the server says so once, for the smallest site, when stage 1 has
    reported their sizes; a delta well below 1/n stays silent."""
    caplog.set_level(logging.WARNING, logger="fedistill")
    _, _, _, sizes = _fediod(_fediod_config(dp_noise_multiplier=1.0, dp_delta=0.5))
    smallest = min(sizes, key=lambda c: (sizes[c], c))
    assert caplog.text.count("dp_delta = 0.5 is not below") == 1
    assert f"1/{sizes[smallest]} for client {smallest}'s {sizes[smallest]} training records" in caplog.text
    caplog.clear()
    warn_if_delta_too_large(1e-5, sizes[smallest], "records")
    assert "dp_delta" not in caplog.text


def test_a_client_level_delta_not_below_one_over_the_clients_is_warned_about(caplog):
    """User-level DP (FedAvg, FedDF) protects a client's whole data: delta is held against 1/K."""
    caplog.set_level(logging.WARNING, logger="fedistill")
    dp = {"dp_enabled": True, "dp_noise_multiplier": 1.0}
    PrivacyReport(FedAvgOptions(**dp, dp_delta=0.25), 1.0, clients=5)
    assert "dp_delta = 0.25 is not below 1/5" in caplog.text and "clients" in caplog.text
    caplog.clear()
    PrivacyReport(FedAvgOptions(**dp, dp_delta=1e-5), 1.0, clients=5)
    PrivacyReport(FedAvgOptions(), 1.0, clients=5)  # no DP: nothing to say
    assert "dp_delta" not in caplog.text
