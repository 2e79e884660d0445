"""Per-client accounting against Opacus' own analysis, the DP config, and gradient sanitisation."""

import json
import pickle
import warnings

import numpy as np
import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from fedistill.errors import ConfigError, UserError
from fedistill.privacy import (
    ClientAccountant,
    DPConfig,
    PrivacyBudgetExceeded,
    calibrate_noise,
    clip_per_sample,
    sanitize_per_sample,
    sanitize_sum,
)

ALPHAS = RDPAccountant.DEFAULT_ALPHAS


def opacus_epsilon(phases: list[tuple[float, float, int]], delta: float) -> float:
    """Epsilon straight from Opacus' RDP analysis functions, no accountant object involved."""
    rdp = sum(compute_rdp(q=q, noise_multiplier=nm, steps=t, orders=ALPHAS) for nm, q, t in phases)
    eps, _ = get_privacy_spent(orders=ALPHAS, rdp=rdp, delta=delta)
    return float(eps)


# --------------------------------------------------------------------------------------------------
# ClientAccountant
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("noise", "rate", "steps", "delta"),
    [(1.0, 0.01, 1000, 1e-5), (0.8, 0.05, 300, 1e-6), (2.0, 1.0, 10, 1e-5), (1.1, 256 / 60000, 5000, 1e-5)],
)
def test_epsilon_equals_opacus(noise: float, rate: float, steps: int, delta: float) -> None:
    acc = ClientAccountant("a")
    acc.step(noise, rate, steps)
    assert acc.epsilon(delta) == pytest.approx(opacus_epsilon([(noise, rate, steps)], delta), abs=1e-6)


def test_heterogeneous_phases_compose_and_unit_steps_merge() -> None:
    acc = ClientAccountant("a")
    for _ in range(20):
        acc.step(1.0, 0.01)
    acc.step(1.0, 0.01, 480)
    acc.step(2.0, 0.05, 200)
    assert acc.history == [(1.0, 0.01, 500), (2.0, 0.05, 200)]
    assert acc.steps == 700
    expected = opacus_epsilon([(1.0, 0.01, 500), (2.0, 0.05, 200)], 1e-5)
    assert acc.epsilon() == pytest.approx(expected, abs=1e-6)


def test_no_steps_no_privacy_spent() -> None:
    acc = ClientAccountant("a")
    acc.step(1.0, 0.1, 0)
    assert acc.history == []
    assert acc.epsilon() == 0.0


def test_prv_accountant_matches_opacus_and_is_tighter_than_rdp() -> None:
    acc = ClientAccountant("a", accountant="prv")
    acc.step(1.0, 0.01, 500)
    direct = PRVAccountant()
    direct.history = [(1.0, 0.01, 500)]
    assert acc.epsilon(1e-5) == pytest.approx(direct.get_epsilon(delta=1e-5, eps_error=0.01), abs=1e-6)
    assert acc.epsilon(1e-5) < opacus_epsilon([(1.0, 0.01, 500)], 1e-5)


def test_prv_at_sample_rate_one_is_computed_without_numpy_warnings() -> None:
    """Every client in every round (FedAvg with fraction 1, FedIOD's release accounting) is sample rate 1,
    where Opacus' PRV takes log(1 - q) inside a `where` that discards it: the answer is right, and the
    "divide by zero" warnings it printed were noise."""
    acc = ClientAccountant("a", accountant="prv")
    acc.step(1.0, 1.0, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        epsilon = acc.epsilon(1e-5)
        calibrate_noise(3.0, 1e-5, 1.0, 3, "prv")
    assert 0 < epsilon < opacus_epsilon([(1.0, 1.0, 3)], 1e-5)  # PRV is tighter than RDP


def test_calibrate_noise_hits_target_within_opacus_tolerance() -> None:
    target, delta, rate, steps = 3.0, 1e-5, 0.01, 200
    sigma = calibrate_noise(target, delta, rate, steps)
    reached = opacus_epsilon([(sigma, rate, steps)], delta)
    assert target - 0.01 <= reached <= target


def test_calibrate_noise_unreachable_target_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot reach target epsilon"):
        calibrate_noise(0.01, 1e-5, 1.0, 1)


@pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha")  # the search's small-sigma probes
def test_a_target_below_what_the_rdp_accountant_can_certify_says_so() -> None:
    """At delta 1e-5 Opacus' RDP orders (up to 63) cannot certify much below 0.1 with any noise or step
    count: the error names that floor and the PRV accountant, not "run fewer steps"."""
    with pytest.raises(ConfigError) as info:
        calibrate_noise(0.05, 1e-5, 1.0, 1)
    message = str(info.value)
    assert "cannot certify less than about 0.103" in message
    assert "dp_accountant = 'prv'" in message and "fewer steps" not in message
    with pytest.raises(ConfigError, match="fewer steps"):  # a target the noise cap alone misses
        calibrate_noise(0.11, 1e-5, 1.0, 10**9)


def test_would_exceed_exactly_when_the_next_steps_cross_the_target() -> None:
    acc = ClientAccountant("a")
    acc.step(1.0, 0.01, 100)
    before = acc.epsilon()
    # A target strictly between the epsilons after 150 and after 151 steps.
    target = 0.5 * (opacus_epsilon([(1.0, 0.01, 150)], 1e-5) + opacus_epsilon([(1.0, 0.01, 151)], 1e-5))
    assert not acc.would_exceed(target, 1e-5, 1.0, 0.01, 0)
    assert not acc.would_exceed(target, 1e-5, 1.0, 0.01, 50)
    assert acc.would_exceed(target, 1e-5, 1.0, 0.01, 51)
    assert acc.would_exceed(target, 1e-5, 1.0, 0.01, 200)
    # Reaching the target exactly is not exceeding it.
    at_target = acc.epsilon_after(1e-5, 1.0, 0.01, 50)
    assert not acc.would_exceed(at_target, 1e-5, 1.0, 0.01, 50)
    # Nothing was spent by asking.
    assert acc.history == [(1.0, 0.01, 100)]
    assert acc.epsilon() == before


def test_step_within_refuses_and_names_client_epsilon_and_target() -> None:
    acc = ClientAccountant("hospital-3")
    eps = acc.step_within(10.0, 1e-5, 1.0, 0.01, 100)
    assert eps == pytest.approx(acc.epsilon())
    with pytest.raises(PrivacyBudgetExceeded) as info:
        acc.step_within(eps + 0.01, 1e-5, 1.0, 0.01, 1000)
    message = str(info.value)
    assert "hospital-3" in message
    assert f"{info.value.epsilon:.4g}" in message
    assert f"{eps + 0.01:.4g}" in message
    assert isinstance(info.value, UserError)
    assert acc.history == [(1.0, 0.01, 100)]
    copy = pickle.loads(pickle.dumps(info.value))
    assert str(copy) == message


def test_state_round_trip_through_json_resumes_the_same_budget() -> None:
    acc = ClientAccountant(7)
    acc.step(1.0, 0.02, 300)
    acc.step(1.5, 0.02, 100)
    state = json.loads(json.dumps(acc.state_dict()))
    resumed = ClientAccountant(7)
    resumed.load_state_dict(state)
    assert resumed.history == acc.history
    assert resumed.epsilon() == acc.epsilon()
    acc.step(1.5, 0.02, 50)
    resumed.step(1.5, 0.02, 50)
    assert resumed.history == acc.history == [(1.0, 0.02, 300), (1.5, 0.02, 150)]


def test_load_state_refuses_another_client_accountant_or_bad_history() -> None:
    state = ClientAccountant("a").state_dict()
    with pytest.raises(ValueError, match="client a"):
        ClientAccountant("b").load_state_dict(state)
    with pytest.raises(ValueError, match="prv"):
        ClientAccountant("a", accountant="prv").load_state_dict(state)
    with pytest.raises(ValueError, match="history"):
        ClientAccountant("a").load_state_dict({"client": "a", "accountant": "rdp"})
    with pytest.raises(ValueError, match="sample_rate"):
        ClientAccountant("a").load_state_dict({"client": "a", "accountant": "rdp", "history": [[1, 2, 3]]})


@pytest.mark.parametrize(
    ("args", "match"),
    [((0.0, 0.1), "noise_multiplier"), ((1.0, 0.0), "sample_rate"), ((1.0, 1.5), "sample_rate")],
)
def test_step_rejects_bad_arguments(args: tuple[float, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ClientAccountant("a").step(*args)


def test_a_numpy_integer_step_count_is_an_integer() -> None:
    """Step counts often come out of NumPy (a sum of sampled rounds): np.int64 is as good as int, and the
    history keeps plain ints (JSON)."""
    acc = ClientAccountant("a")
    acc.step(1.0, 0.1, np.int64(3))
    assert acc.epsilon_after(1e-5, 1.0, 0.1, np.int32(2)) == pytest.approx(
        opacus_epsilon([(1.0, 0.1, 5)], 1e-5)
    )
    assert acc.history == [(1.0, 0.1, 3)] and type(acc.history[0][2]) is int
    json.dumps(acc.state_dict())
    for bad in (2.0, True, -1):
        with pytest.raises(ValueError, match="steps must be an integer >= 0"):
            acc.step(1.0, 0.1, bad)


def test_unknown_accountant_suggests_the_closest() -> None:
    with pytest.raises(ConfigError, match="did you mean 'prv'"):
        ClientAccountant("a", accountant="pvr")


# --------------------------------------------------------------------------------------------------
# DPConfig
# --------------------------------------------------------------------------------------------------


def test_dp_config_defaults_are_valid_and_frozen() -> None:
    config = DPConfig()
    config.validate()
    DPConfig(enabled=True, noise_multiplier=1.1).validate()
    DPConfig(enabled=True, target_epsilon=8.0).validate()
    with pytest.raises(AttributeError):
        config.enabled = True  # type: ignore[misc]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"clip_norm": 0.0}, "dp.clip_norm must be a finite number > 0, got 0.0"),
        ({"clip_norm": float("nan")}, "dp.clip_norm"),
        ({"noise_multiplier": -1.0}, "dp.noise_multiplier must be a finite number >= 0"),
        ({"target_epsilon": -2.0}, "dp.target_epsilon"),
        ({"delta": 1.0}, r"dp.delta must be a finite number in \(0, 1\), got 1.0"),
        ({"delta": "1e-5"}, "dp.delta"),
        ({"accountant": "gdp"}, "unknown dp.accountant 'gdp'"),
        ({"enabled": "yes"}, "dp.enabled must be true or false"),
        ({"enabled": True}, "needs dp.noise_multiplier > 0 or dp.target_epsilon > 0"),
    ],
)
def test_dp_config_validate_names_the_field_and_value(changes: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DPConfig(**changes).validate()


# --------------------------------------------------------------------------------------------------
# sanitisation
# --------------------------------------------------------------------------------------------------


def test_clip_bounds_every_norm_and_leaves_small_ones_unchanged() -> None:
    g = torch.Generator().manual_seed(0)
    grads = torch.randn(64, 3, 4, 4, generator=g) * torch.logspace(-2, 1, 64).reshape(64, 1, 1, 1)
    clipped, norms = clip_per_sample(grads, clip_norm=1.5)
    assert torch.allclose(norms, grads.flatten(1).norm(dim=1))
    after = clipped.flatten(1).norm(dim=1)
    assert (after <= 1.5 * (1 + 1e-6)).all()
    small = norms <= 1.5
    assert 0 < int(small.sum()) < 64
    assert torch.equal(clipped[small], grads[small])
    assert torch.allclose(after[~small], torch.full_like(after[~small], 1.5))
    # Clipping only rescales: directions are kept.
    cosine = torch.nn.functional.cosine_similarity(clipped.flatten(1), grads.flatten(1), dim=1)
    assert torch.allclose(cosine, torch.ones(64))


def test_clip_handles_zero_gradients_and_empty_batches() -> None:
    clipped, norms = clip_per_sample(torch.zeros(3, 5), 1.0)
    assert torch.equal(clipped, torch.zeros(3, 5)) and torch.equal(norms, torch.zeros(3))
    clipped, norms = clip_per_sample(torch.zeros(0, 2, 2), 1.0)
    assert clipped.shape == (0, 2, 2) and norms.shape == (0,)
    with pytest.raises(ValueError, match="clip_norm"):
        clip_per_sample(torch.ones(2, 2), 0.0)


def test_per_sample_noise_has_std_noise_multiplier_times_clip_norm() -> None:
    clip_norm, noise_multiplier = 0.5, 1.3
    grads = torch.zeros(2000, 100)
    out = sanitize_per_sample(grads, clip_norm, noise_multiplier, torch.Generator().manual_seed(1))
    std = noise_multiplier * clip_norm
    # 200 000 draws: the sample std is within 0.16% of the truth at one standard error; allow 1%.
    assert out.std().item() == pytest.approx(std, rel=0.01)
    assert abs(out.mean().item()) < 5 * std / 200_000**0.5
    # Each sample gets its own draw.
    assert not torch.equal(out[0], out[1])


def test_per_sample_sanitize_is_reproducible_and_clips_first() -> None:
    grads = torch.randn(8, 10, generator=torch.Generator().manual_seed(0)) * 10
    a = sanitize_per_sample(grads, 1.0, 0.7, torch.Generator().manual_seed(3))
    b = sanitize_per_sample(grads, 1.0, 0.7, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    clipped, _ = clip_per_sample(grads, 1.0)
    assert torch.equal(sanitize_per_sample(grads, 1.0, 0.0, None), clipped)
    noise = a - clipped
    expected_noise = torch.randn(8, 10, generator=torch.Generator().manual_seed(3)) * 0.7
    assert torch.allclose(noise, expected_noise, atol=1e-6)


def test_sanitize_sum_adds_one_noise_draw_to_the_clipped_sum() -> None:
    grads = torch.randn(32, 6, generator=torch.Generator().manual_seed(0)) * 5
    clipped, _ = clip_per_sample(grads, 2.0)
    assert torch.allclose(sanitize_sum(grads, 2.0, 0.0, None), clipped.sum(0))
    out = sanitize_sum(grads, 2.0, 1.1, torch.Generator().manual_seed(4))
    expected = clipped.sum(0) + torch.randn(6, generator=torch.Generator().manual_seed(4)) * 2.2
    assert out.shape == (6,)
    assert torch.allclose(out, expected, atol=1e-5)
    # The noise std does not grow with the batch: one draw of std noise_multiplier * clip_norm.
    big = sanitize_sum(torch.zeros(50, 40_000), 2.0, 1.1, torch.Generator().manual_seed(5))
    assert big.std().item() == pytest.approx(2.2, rel=0.02)


def test_a_non_finite_per_sample_gradient_is_released_as_noise_alone() -> None:
    """A NaN or infinite per-sample gradient passed through clipping as NaN, so the released tensor (and
    the receiver's refusal of a non-finite reply) showed the data's doing, beyond the clip norm's bound.
    Such a sample now contributes nothing: its released row is the noise alone, the others are unchanged."""
    grads = torch.tensor([[3.0, 4.0], [float("nan"), 1.0], [float("inf"), 0.0], [0.3, 0.4]])
    clipped, norms = clip_per_sample(grads, 1.0)
    assert torch.isfinite(clipped).all()
    assert torch.equal(clipped[1:3], torch.zeros(2, 2))
    assert torch.allclose(clipped[[0, 3]], torch.tensor([[0.6, 0.8], [0.3, 0.4]]))
    assert not torch.isfinite(norms[1:3]).any()  # the norms before clipping are reported as they were
    noisy = sanitize_per_sample(grads, 1.0, 0.5, torch.Generator().manual_seed(7))
    noise = torch.randn(4, 2, generator=torch.Generator().manual_seed(7)) * 0.5
    assert torch.allclose(noisy[1:3], noise[1:3])
    total = sanitize_sum(grads, 1.0, 0.0, None)
    assert torch.allclose(total, torch.tensor([0.9, 1.2]))


def test_prv_running_out_of_memory_names_the_accountant_and_the_way_out(monkeypatch) -> None:
    """At small noise the PRV accountant's discretised privacy loss needs gigabytes (about 2.8 GB at an
    accounted sigma of 0.0625 over 100 steps): the run stops with a line naming RDP, not a MemoryError."""

    def out_of_memory(self, **kwargs):
        raise MemoryError

    monkeypatch.setattr(PRVAccountant, "get_epsilon", out_of_memory)
    acc = ClientAccountant("a", accountant="prv")
    acc.step(0.0625, 1.0, 100)
    with pytest.raises(UserError, match=r"PRV accountant ran out of memory .*dp_accountant = 'rdp'"):
        acc.epsilon(1e-5)
