"""FedMD-CG loss terms, schedule, server helpers and feature generator against hand-computed tiny cases.

Expected values come from `math` or from plain numpy written out here, never from the torch code
under test. Logits such as ``[0, ln 3]`` make the softmax exact (``(1/4, 3/4)``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedistill.algorithms.fedmdcg.losses import (
    DIVERSITY_TYPES,
    GeneratorLambdas,
    LocalModelLambdas,
    crossed_distillation,
    distillation_active,
    diversity_div0,
    diversity_div1,
    diversity_div2,
    diversity_loss,
    feature_kd_from_local,
    feature_kd_to_global,
    generated_ce,
    generator_ce,
    generator_objective,
    label_distribution,
    label_weights,
    local_ce,
    local_model_objective,
    logit_kd_from_global,
    logit_kd_from_local,
    pairwise_distance,
    per_sample_label_weights,
    ramp_factor,
    sample_labels,
    server_kd_term,
    server_l1,
    server_l2,
    server_l3,
    weighted_average,
)
from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.models.feature_generator import (
    FeatureGenerator,
    build_feature_generator,
    feature_generator_for,
    fedmdcg_generator_sizes,
    sample_noise,
)
from fedistill.models.lenet import lenet_fedmdcg

LN2 = math.log(2.0)
LN3 = math.log(3.0)
TOL = 1e-6


def t(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def kl(p: list[float], q: list[float]) -> float:
    """KL(p ‖ q) in nats, straight from the definition."""
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True) if pi > 0)


def np_softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_diversity(noise: np.ndarray, feats: np.ndarray, codes: np.ndarray | None, kind: str) -> float:
    """The diversity losses with explicit double loops over the B×B pairs (diagonal included)."""
    b = noise.shape[0]
    inputs = np.concatenate([noise, codes], axis=1) if kind == "div1" else noise
    acc = 0.0
    for i in range(b):
        for j in range(b):
            d_eps = np.mean((inputs[i] - inputs[j]) ** 2)
            d_g = np.mean((feats[i] - feats[j]) ** 2)
            w = math.exp(np.mean(np.abs(codes[i] - codes[j]))) if kind == "div2" else 1.0
            acc += d_eps * d_g * w
    return math.exp(-acc / (b * b))


# --------------------------------------------------------------------------------------------------
# client stage 1
# --------------------------------------------------------------------------------------------------


def test_local_ce_and_generated_ce_are_batch_mean_cross_entropy():
    logits = t([[0.0, LN3], [LN3, 0.0]])
    labels = torch.tensor([1, 1])
    expected = (-math.log(3 / 4) - math.log(1 / 4)) / 2
    assert local_ce(logits, labels).item() == pytest.approx(expected, abs=TOL)
    assert generated_ce(logits, labels).item() == pytest.approx(expected, abs=TOL)


def test_logit_kd_from_global_is_kl_generated_to_local_batchmean_at_temperature():
    # T = 2: local logits / 2 give q = (1/4, 3/4) and (3/4, 1/4); generated give p = (1/2, 1/2), (1/4, 3/4).
    local = t([[0.0, 2 * LN3], [2 * LN3, 0.0]]).requires_grad_()
    generated = t([[0.0, 0.0], [0.0, 2 * LN3]]).requires_grad_()
    loss = logit_kd_from_global(local, generated, temperature=2.0)
    expected = (kl([0.5, 0.5], [0.25, 0.75]) + kl([0.25, 0.75], [0.75, 0.25])) / 2  # no T² factor
    assert loss.item() == pytest.approx(expected, abs=TOL)
    loss.backward()
    assert local.grad is not None and generated.grad is None  # the generator's reading is the target


def test_logit_kd_from_global_default_temperature_is_ten():
    local, generated = t([[0.0, 10 * LN3]]), t([[0.0, 0.0]])
    assert logit_kd_from_global(local, generated).item() == pytest.approx(
        kl([0.5, 0.5], [0.25, 0.75]), abs=TOL
    )


def test_feature_kd_to_global_is_mse_over_batch_and_dims_towards_detached_generator():
    local = t([[1.0, 2.0], [3.0, 4.0]]).requires_grad_()
    generated = t([[1.0, 0.0], [0.0, 4.0]]).requires_grad_()
    loss = feature_kd_to_global(local, generated)
    assert loss.item() == pytest.approx((0 + 4 + 9 + 0) / 4, abs=TOL)
    loss.backward()
    assert local.grad is not None and generated.grad is None


def test_switch_and_cubic_ramp_at_a_few_rounds():
    assert not distillation_active(0) and distillation_active(1)
    assert ramp_factor(0, 100) == 0.0
    assert ramp_factor(1, 100) == pytest.approx((1 / 99) ** 3)
    assert ramp_factor(50, 100) == pytest.approx(0.128826, abs=1e-6)  # the notes' "≈0.13·λ⁰"
    assert ramp_factor(99, 100) == pytest.approx(1.0)
    assert ramp_factor(2, 5, power=2.0) == pytest.approx(0.25)
    assert ramp_factor(0, 1) == 0.0  # a single round never distils


def test_no_ramp_keeps_the_round_zero_switch():
    assert ramp_factor(0, 10, "none") == 0.0
    assert ramp_factor(1, 10, "none") == 1.0
    assert ramp_factor(9, 10, "none") == 1.0


def test_ramp_rejects_bad_values():
    with pytest.raises(ConfigError, match="ramp"):
        ramp_factor(1, 10, "linear")
    with pytest.raises(ValueError, match="round index"):
        ramp_factor(10, 10)
    with pytest.raises(ConfigError, match="rounds"):
        ramp_factor(0, 0)


def test_local_lambdas_defaults_ramp_and_validation():
    lam = LocalModelLambdas()
    assert (lam.kl, lam.ce_gen, lam.mse) == (1.0, 1.0, 0.1)
    f = (50 / 99) ** 3
    ramped = lam.at_round(50, 100)
    assert (ramped.kl, ramped.ce_gen, ramped.mse) == pytest.approx((f, f, 0.1 * f))
    assert lam.at_round(0, 100) == LocalModelLambdas(0.0, 0.0, 0.0)
    with pytest.raises(ConfigError, match="mse"):
        LocalModelLambdas(mse=-0.1)


def test_local_model_objective_weights_and_skips_missing_terms():
    one, two, three, four = (torch.tensor(v) for v in (1.0, 2.0, 3.0, 4.0))
    lam = LocalModelLambdas(kl=0.5, ce_gen=0.25, mse=0.1)
    assert local_model_objective(one, two, three, four, lam).item() == pytest.approx(1 + 1 + 0.75 + 0.4)
    assert local_model_objective(one, None, None, None, lam).item() == 1.0


# --------------------------------------------------------------------------------------------------
# client stage 2
# --------------------------------------------------------------------------------------------------


def test_generator_ce_and_logit_kd_from_local_direction():
    generated = t([[0.0, LN3]]).requires_grad_()  # q = (1/4, 3/4)
    local = t([[0.0, 0.0]]).requires_grad_()  # p = (1/2, 1/2)
    loss = logit_kd_from_local(generated, local)
    assert loss.item() == pytest.approx(kl([0.5, 0.5], [0.25, 0.75]), abs=TOL)  # KL(local ‖ generated), T = 1
    assert loss.item() != pytest.approx(kl([0.25, 0.75], [0.5, 0.5]), abs=1e-3)
    loss.backward()
    assert generated.grad is not None and local.grad is None
    assert generator_ce(generated, torch.tensor([0])).item() == pytest.approx(-math.log(1 / 4), abs=TOL)


def test_feature_kd_from_local_is_mse_towards_detached_extractor():
    generated = t([[0.0, 1.0, 2.0]]).requires_grad_()
    local = t([[1.0, 1.0, 0.0]]).requires_grad_()
    loss = feature_kd_from_local(generated, local)
    assert loss.item() == pytest.approx((1 + 0 + 4) / 3, abs=TOL)
    loss.backward()
    assert generated.grad is not None and local.grad is None


def test_pairwise_distance_means_over_dimensions():
    x = t([[0.0, 0.0], [1.0, 2.0]])
    assert np.allclose(pairwise_distance(x, "l2").numpy(), [[0.0, 2.5], [2.5, 0.0]])
    assert np.allclose(pairwise_distance(x, "l1").numpy(), [[0.0, 1.5], [1.5, 0.0]])


NOISE2 = [[0.0, 0.0], [2.0, 0.0]]  # d_ε = (4 + 0) / 2 = 2
FEATS2 = [[0.0, 0.0], [1.0, 2.0]]  # d_G = (1 + 4) / 2 = 2.5 (l2), 1.5 (l1)


def test_div0_hand_case():
    # Mean over the 4 pairs (two zero diagonal ones): 2 · (2 · 2.5) / 4 = 2.5.
    assert diversity_div0(t(NOISE2), t(FEATS2)).item() == pytest.approx(math.exp(-2.5), abs=TOL)
    # FedGen's L1 on outputs: 2 · (2 · 1.5) / 4 = 1.5.
    assert diversity_div0(t(NOISE2), t(FEATS2), "l1").item() == pytest.approx(math.exp(-1.5), abs=TOL)


def test_div1_uses_noise_and_label_code():
    different = t([[1.0, 0.0], [0.0, 1.0]])
    same = t([[1.0, 0.0], [1.0, 0.0]])
    # concat(ε, onehot) distance: different labels (4 + 0 + 1 + 1) / 4 = 1.5, same labels 4 / 4 = 1.
    assert diversity_div1(t(NOISE2), different, t(FEATS2)).item() == pytest.approx(
        math.exp(-2 * 1.5 * 2.5 / 4), abs=TOL
    )
    assert diversity_div1(t(NOISE2), same, t(FEATS2)).item() == pytest.approx(
        math.exp(-2 * 1.0 * 2.5 / 4), abs=TOL
    )


def test_div2_weighs_inter_class_pairs_by_exp_of_label_distance():
    two_classes = t([[1.0, 0.0], [0.0, 1.0]])  # d_y = 2/C = 1
    four_classes = t([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])  # d_y = 2/4
    same = t([[1.0, 0.0], [1.0, 0.0]])  # d_y = 0
    assert diversity_div2(t(NOISE2), two_classes, t(FEATS2)).item() == pytest.approx(
        math.exp(-2.5 * math.e), abs=TOL
    )
    assert diversity_div2(t(NOISE2), four_classes, t(FEATS2)).item() == pytest.approx(
        math.exp(-2.5 * math.exp(0.5)), abs=TOL
    )
    # One label only: div2 reduces to div0.
    assert diversity_div2(t(NOISE2), same, t(FEATS2)).item() == pytest.approx(math.exp(-2.5), abs=TOL)


@pytest.mark.parametrize("kind", ["div0", "div1", "div2"])
def test_each_diversity_variant_matches_a_numpy_double_loop(kind):
    rng = np.random.default_rng(0)
    noise = rng.random((3, 4))
    feats = rng.normal(size=(3, 5)) * 0.5
    codes = np.eye(3)[[0, 2, 2]]
    got = diversity_loss(kind, t(noise.tolist()), t(feats.tolist()), t(codes.tolist())).item()
    assert got == pytest.approx(np_diversity(noise, feats, codes, kind), abs=TOL)


@pytest.mark.parametrize("kind", ["div0", "div1", "div2"])
def test_diversity_is_maximal_at_collapse_and_vanishes_with_spread(kind):
    noise, codes = t([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5]]), t(np.eye(3).tolist())
    collapsed = t([[3.0, -1.0]] * 3)
    assert diversity_loss(kind, noise, collapsed, codes).item() == 1.0  # exp(-0): the maximum
    spread = t([[0.0, 0.0], [100.0, 0.0], [0.0, 100.0]])
    assert diversity_loss(kind, noise, spread, codes).item() < 1e-12


def test_diversity_none_and_errors():
    assert set(DIVERSITY_TYPES) == {"div0", "div1", "div2", "none"}
    assert diversity_loss("none", t(NOISE2), t(FEATS2)).item() == 0.0
    with pytest.raises(ValueError, match="label code"):
        diversity_loss("div2", t(NOISE2), t(FEATS2))
    with pytest.raises(ConfigError, match="div2"):
        diversity_loss("div3", t(NOISE2), t(FEATS2))


def test_generator_objective():
    ce, kl_, mse, div = (torch.tensor(v) for v in (1.0, 2.0, 3.0, 4.0))
    assert generator_objective(ce, kl_, mse, div).item() == 10.0  # all λ = 1 (code defaults)
    lam = GeneratorLambdas(ce=0.5, kl=0.0, mse=2.0, div=0.25)
    assert generator_objective(ce, kl_, mse, div, lam).item() == pytest.approx(0.5 + 6 + 1)
    assert generator_objective(ce, kl_, mse, None, lam).item() == pytest.approx(6.5)
    with pytest.raises(ConfigError, match="div"):
        GeneratorLambdas(div=float("nan"))


# --------------------------------------------------------------------------------------------------
# server side
# --------------------------------------------------------------------------------------------------


def test_label_distribution_and_weights():
    counts = torch.tensor([[1, 3, 0], [3, 1, 0]])
    assert label_distribution(counts).tolist() == pytest.approx([0.5, 0.5, 0.0])
    assert label_distribution(torch.tensor([2, 0, 1, 1])).tolist() == pytest.approx([0.5, 0, 0.25, 0.25])
    w = label_weights(counts)
    assert np.allclose(w.numpy(), [[0.25, 0.75, 0.0], [0.75, 0.25, 0.0]])  # class 2: nobody holds it
    per_sample = per_sample_label_weights(w, torch.tensor([0, 1, 1]))
    assert np.allclose(per_sample.numpy(), [[0.25, 0.75, 0.75], [0.75, 0.25, 0.25]])
    with pytest.raises(ValueError, match="all zero"):
        label_distribution(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="non-negative"):
        label_weights(torch.tensor([[1, -1]]))


def test_infinite_counts_or_averaging_weights_are_refused_not_turned_into_nan():
    inf = float("inf")
    with pytest.raises(ValueError, match="finite"):
        label_distribution(torch.tensor([inf, 1.0]))
    with pytest.raises(ValueError, match="finite"):
        label_weights(torch.tensor([[inf, 1.0], [1.0, 1.0]]))
    a, b = {"w": torch.tensor([1.0])}, {"w": torch.tensor([3.0])}
    with pytest.raises(ValueError, match="finite"):
        weighted_average([a, b], [inf, 1.0])  # it would give a NaN average


def test_sample_labels_follows_global_counts_and_is_seeded():
    counts = torch.tensor([[2, 0, 1], [1, 0, 0]])  # global (3, 0, 1) / 4
    labels = sample_labels(counts, 4000, torch.Generator().manual_seed(0))
    assert labels.dtype == torch.int64 and labels.shape == (4000,)
    assert int((labels == 1).sum()) == 0
    assert float((labels == 0).double().mean()) == pytest.approx(0.75, abs=0.03)
    again = sample_labels(counts, 4000, torch.Generator().manual_seed(0))
    assert torch.equal(labels, again)


def test_weighted_average_by_sample_counts():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(4)}
    avg = weighted_average([a, b], [1, 3])  # n_1 = 1, n_2 = 3 samples
    assert avg["w"].tolist() == pytest.approx([(1 + 9) / 4, (2 + 18) / 4])
    assert avg["n"].dtype == torch.int64 and int(avg["n"]) == 3  # (3 + 12) / 4 = 3.75, truncated
    with pytest.raises(ValueError, match="different entries"):
        weighted_average([a, {"w": b["w"]}], [1, 1])
    with pytest.raises(ValueError, match="positive sum"):
        weighted_average([a, b], [0, 0])


def test_weighted_average_takes_entries_in_any_order_and_refuses_mismatched_shapes():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}
    b = {"b": torch.tensor([4.0]), "w": torch.tensor([3.0, 6.0])}  # same entries, another order
    avg = weighted_average([a, b], [1, 1])
    assert list(avg) == ["w", "b"]
    assert avg["w"].tolist() == pytest.approx([2.0, 4.0]) and avg["b"].tolist() == pytest.approx([2.0])
    with pytest.raises(
        ValueError, match="'w' has shape \\(1,\\) in state 1"
    ):  # it would broadcast into a wrong average
        weighted_average([a, {"w": torch.tensor([3.0]), "b": b["b"]}], [1, 1])


TEACHER = [[0.0, 0.0], [LN3, 0.0]]  # p = (1/2, 1/2), (3/4, 1/4)
STUDENT = [[0.0, LN3], [0.0, 0.0]]  # q = (1/4, 3/4), (1/2, 1/2)
WEIGHTS = [0.2, 1.0]


def _kd_terms() -> tuple[float, float]:
    return (kl([0.5, 0.5], [0.25, 0.75]) / 2, kl([0.75, 0.25], [0.5, 0.5]) / 2)  # KL / C per sample


def test_server_kd_term_is_label_weighted_kl_over_classes():
    k1, k2 = _kd_terms()
    expected = (0.2 * k1 + 1.0 * k2) / 2
    student = t(STUDENT).requires_grad_()
    teacher = t(TEACHER).requires_grad_()
    loss = server_kd_term(student, teacher, t(WEIGHTS), temperature=1.0)
    assert loss.item() == pytest.approx(expected, abs=TOL)
    loss.backward()
    assert student.grad is not None and teacher.grad is None
    # Default T_s = 10: the same numbers with logits scaled by 10; and L1 = L2 = L3 = this term.
    s10, te10 = t(STUDENT) * 10, t(TEACHER) * 10
    for fn in (server_kd_term, server_l1, server_l2, server_l3):
        assert fn(s10, te10, t(WEIGHTS)).item() == pytest.approx(expected, abs=TOL)


def test_server_l3_softmax_bug_feeds_probabilities_where_log_probabilities_belong():
    # Code: mean_c p·(log p − q) instead of mean_c p·(log p − log q).
    p = [[0.5, 0.5], [0.75, 0.25]]
    q = [[0.25, 0.75], [0.5, 0.5]]
    per_sample = [
        sum(pc * (math.log(pc) - qc) for pc, qc in zip(pr, qr, strict=True)) / 2
        for pr, qr in zip(p, q, strict=True)
    ]
    expected_bug = (0.2 * per_sample[0] + 1.0 * per_sample[1]) / 2
    bug = server_l3(t(STUDENT), t(TEACHER), t(WEIGHTS), 1.0, official_softmax_bug=True).item()
    assert bug == pytest.approx(expected_bug, abs=TOL)
    # The difference from the default is exactly mean_b w_b · mean_c p·(log q − q).
    diff = [
        sum(pc * (math.log(qc) - qc) for pc, qc in zip(pr, qr, strict=True)) / 2
        for pr, qr in zip(p, q, strict=True)
    ]
    default = server_l3(t(STUDENT), t(TEACHER), t(WEIGHTS), 1.0).item()
    assert bug - default == pytest.approx((0.2 * diff[0] + 1.0 * diff[1]) / 2, abs=TOL)


def test_crossed_distillation_sums_three_terms_over_clients():
    rng = np.random.default_rng(1)
    k, b, c, temp = 2, 3, 3, 2.0
    g_pair = rng.normal(size=(b, c))
    g_head_local = rng.normal(size=(k, b, c))
    local_head_g = rng.normal(size=(k, b, c))
    local_pair = rng.normal(size=(k, b, c))
    w = rng.random((k, b))

    def term(student: np.ndarray, teacher: np.ndarray, weights: np.ndarray, bug: bool = False) -> float:
        p, q = np_softmax(teacher / temp), np_softmax(student / temp)
        inner = p * (np.log(p) - (q if bug else np.log(q)))
        return float(np.mean(weights * inner.mean(axis=1)))

    exp_l1 = sum(term(g_pair, local_pair[i], w[i]) for i in range(k))
    exp_l2 = sum(term(g_head_local[i], local_pair[i], w[i]) for i in range(k))
    exp_l3 = sum(term(local_head_g[i], local_pair[i], w[i]) for i in range(k))
    exp_l3_bug = sum(term(local_head_g[i], local_pair[i], w[i], True) for i in range(k))

    args = [torch.tensor(a) for a in (g_pair, g_head_local, local_head_g, local_pair, w)]
    out = crossed_distillation(*args, temperature=temp)
    assert (out.l1.item(), out.l2.item(), out.l3.item()) == pytest.approx((exp_l1, exp_l2, exp_l3), abs=TOL)
    assert out.total.item() == pytest.approx(exp_l1 + exp_l2 + exp_l3, abs=TOL)
    bug = crossed_distillation(*args, temperature=temp, official_softmax_bug=True)
    assert (bug.l1.item(), bug.l2.item()) == pytest.approx((exp_l1, exp_l2), abs=TOL)  # only L3 changes
    assert bug.l3.item() == pytest.approx(exp_l3_bug, abs=TOL)
    with pytest.raises(ValueError, match="sample weights"):
        crossed_distillation(*args[:4], args[4][:, :2])


# --------------------------------------------------------------------------------------------------
# the feature generator
# --------------------------------------------------------------------------------------------------


def small_generator(**options) -> FeatureGenerator:
    torch.manual_seed(0)
    defaults = {"noise_dim": 4, "hidden_dims": (8, 6)}
    return FeatureGenerator(3, 5, **(defaults | options))


def test_generator_output_shape_noise_and_code_names():
    gen = small_generator()
    labels = torch.tensor([0, 2, 1, 1])
    out, noise = gen(labels, return_noise=True)
    assert out.shape == (4, 5) and noise.shape == (4, 4)
    assert gen(labels).shape == (4, 5)
    # The released code's parameter names and layer widths: (noise + one-hot) → 8 → 6 → 5.
    shapes = {k: tuple(v.shape) for k, v in gen.state_dict().items() if k.endswith("weight")}
    assert shapes == {
        "fc_layers.0.weight": (8, 4 + 3),
        "fc_layers.1.weight": (8,),
        "fc_layers.3.weight": (6, 8),
        "fc_layers.4.weight": (6,),
        "representation_layer.weight": (5, 6),
    }
    assert gen.label_code(labels).tolist() == np.eye(3)[[0, 2, 1, 1]].tolist()


def test_generator_is_label_conditioned():
    gen = small_generator().eval()
    noise = torch.full((3, 4), 0.3)
    out = gen(torch.tensor([0, 0, 1]), noise)
    assert torch.equal(out[0], out[1])  # same (y, ε) → same feature
    assert not torch.allclose(out[0], out[2])  # same ε, another label → another feature


def test_generator_is_deterministic_under_a_seed():
    a, b = small_generator(), small_generator()
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key])
    labels = torch.tensor([0, 1, 2])
    out_a = a(labels, generator=torch.Generator().manual_seed(5))
    out_b = b(labels, generator=torch.Generator().manual_seed(5))
    out_c = b(labels, generator=torch.Generator().manual_seed(6))
    assert torch.equal(out_a, out_b) and not torch.equal(out_a, out_c)


def test_noise_distributions_normal_default_uniform_is_the_code():
    g = torch.Generator().manual_seed(0)
    normal = sample_noise(20000, 2, generator=g)
    uniform = sample_noise(20000, 2, "uniform", generator=g)
    assert (
        float(normal.min()) < 0
        and abs(float(normal.mean())) < 0.05
        and float(normal.std()) == pytest.approx(1, abs=0.05)
    )
    assert float(uniform.min()) >= 0 and float(uniform.max()) < 1
    assert float(uniform.mean()) == pytest.approx(0.5, abs=0.02)
    assert small_generator().noise == "normal"
    _, eps = small_generator(noise="uniform")(torch.tensor([0, 1]), return_noise=True)
    assert bool(((eps >= 0) & (eps < 1)).all())


def test_generator_embedding_and_sigmoid_options():
    gen = small_generator(label_input="embedding")
    assert gen.embedding_layer.weight.shape == (3, 4)  # code default: embedding size = noise size
    assert gen.fc_layers[0].weight.shape == (8, 4 + 4)
    assert gen(torch.tensor([0, 1])).shape == (2, 5)
    assert small_generator(label_input="embedding", embedding_dim=3).label_code(torch.tensor([1])).shape == (
        1,
        3,
    )
    squashed = small_generator(output_activation="sigmoid")(torch.tensor([0, 1, 2]))
    assert bool(((squashed > 0) & (squashed < 1)).all())


def test_generator_validation_errors():
    with pytest.raises(ConfigError, match="noise distribution 'gaussian'"):
        small_generator(noise="gaussian")
    with pytest.raises(ConfigError, match="label input"):
        small_generator(label_input="onehot")
    with pytest.raises(ConfigError, match="noise_dim"):
        small_generator(noise_dim=0)
    with pytest.raises(ConfigError, match="hidden width"):
        small_generator(hidden_dims=(8, -1))
    with pytest.raises(ConfigError, match="embedding_dim"):
        small_generator(embedding_dim=4)
    with pytest.raises(ConfigError, match="output activation"):
        small_generator(output_activation="tanh")
    gen = small_generator()
    with pytest.raises(ValueError, match=r"labels must be in 0\.\.2"):
        gen(torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="noise must have shape"):
        gen(torch.tensor([0, 1]), torch.zeros(2, 3))


def test_factory_sizes_and_fit_to_the_fedmdcg_lenet():
    assert fedmdcg_generator_sizes("mnist") == ((512, 128), 64)
    assert fedmdcg_generator_sizes("fashion-mnist") == ((512, 256), 128)
    assert fedmdcg_generator_sizes("cifar100") == ((1024, 512), 256)
    info = DatasetInfo("mnist", 1, 28, 10, (0.1307,), (0.3081,))
    model = lenet_fedmdcg(info)
    gen = feature_generator_for(model, info, noise="uniform")
    assert (gen.feature_dim, gen.noise_dim, gen.hidden_dims, gen.noise) == (64, 64, (512, 128), "uniform")
    logits = model.classifier(gen(torch.tensor([0, 9, 3])))
    assert logits.shape == (3, 10)
    assert build_feature_generator(10, 16, hidden_dims=(256,), noise_dim=32).hidden_dims == (256,)
    with pytest.raises(ConfigError, match="extractor and classifier"):
        feature_generator_for(torch.nn.Linear(2, 2), info)  # type: ignore[arg-type]


def test_diversity_rejects_mismatched_batches():
    with pytest.raises(ValueError, match="batch sizes"):
        diversity_div2(t(NOISE2), t([[1.0, 0.0]]), t(FEATS2))
