"""FedMD-CG end to end on digits: only classifiers, generators and label counts leave a client, the
server's crossed distillation pulls the global pair towards the clients that hold each class, the
official-code preset switches the code's bugs on, a restart loses nothing, and the reduced run's local
accuracy beats Standalone's."""

import pytest
import torch
from torch import nn

from algorithm_helpers import SMALL_NON_IID, check_resume_after_crash, make_client, run_recording
from fedistill import devices
from fedistill.algorithms.fedmdcg import losses as L
from fedistill.algorithms.fedmdcg.fedmdcg import ORACLE_METRIC, oracle_global_accuracy
from fedistill.algorithms.fedmdcg.fedmdcg_options import FedMDCGOptions, resolve_options
from fedistill.algorithms.fedmdcg.fedmdcg_server import (
    FedMDCGServer,
    crossed_distillation_steps,
    pair_accuracy,
)
from fedistill.algorithms.fedmdcg.personalized import GENERATOR_PREFIX, part_of
from fedistill.config import RunConfig, build_config, options_for
from fedistill.engine.checkpoint import latest_checkpoint, read_checkpoint
from fedistill.engine.launch import run_suite
from fedistill.engine.rundir import read_jsonl
from fedistill.engine.setup import prepare_data
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.ledger import DOWN, UP, read_ledger
from fedistill.federation.messages import Message
from fedistill.models.base import CLASSIFIER_PREFIX, EXTRACTOR_PREFIX
from fedistill.models.feature_generator import FeatureGenerator

ROUNDS = 8
SMALL = {
    **SMALL_NON_IID,
    "rounds": ROUNDS,
    "model": "lenet-fedmdcg",
    "lr": 0.1,
    "local_steps": 20,
    # A smaller generator and fewer server steps than the paper's, to keep the test fast. Eight rounds
    # stand for the paper's hundred, so G_i learns 10x faster than its 3e-4: at 3e-4 the global pair
    # reads only 25% of its own samples after 8 rounds (98% at 3e-3).
    "fedmdcg": {"generator_hidden": "128,64", "server_steps": 20, "generator_lr": 3e-3},
}


def _config(**changes) -> RunConfig:
    return build_config(RunConfig(), SMALL, changes)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """One non-IID run of FedMD-CG and Standalone, with the array names of every FedMD-CG message."""
    out = tmp_path_factory.mktemp("fedmdcg") / "suite"
    runs, seen = run_recording(_config(algorithm="fedmdcg,standalone"), out)
    return out, runs, seen["fedmdcg"]


def _pair_names() -> tuple[set[str], int, int]:
    """The names that may travel, the bytes of one (C_i, G_i) upload, and the extractor's bytes."""
    client = make_client(_config(), "fedmdcg")
    model_state = client.model.state_dict()
    pair = part_of(model_state, CLASSIFIER_PREFIX) | {
        GENERATOR_PREFIX + k: v for k, v in client.generator.state_dict().items()
    }
    size = sum(t.numel() * t.element_size() for t in pair.values())
    extractor = sum(t.numel() * t.element_size() for t in part_of(model_state, EXTRACTOR_PREFIX).values())
    return set(pair), size, extractor


def test_only_classifier_generator_and_label_counts_leave_a_client(suite):
    """Every upload holds exactly the classifier.* and generator.* names and ten class counts, and its
    parameter bytes equal one (C_i, G_i) pair: no extractor.* entry ever leaves a client."""
    out, runs, seen = suite
    names, pair_bytes, extractor_bytes = _pair_names()
    assert extractor_bytes > 0 and any(n.startswith(GENERATOR_PREFIX) for n in names)

    ups = [sent.arrays for sent in seen if sent.direction == UP]
    assert len(ups) == 5 * ROUNDS
    for arrays in ups:
        assert set(arrays) == {"parameters", "label-statistics"}
        assert arrays["parameters"] == names, sorted(arrays["parameters"] ^ names)
        assert not any(n.startswith(EXTRACTOR_PREFIX) for n in arrays["parameters"])
        assert arrays["label-statistics"] == {"class_counts"}
    downs = [(sent.round, sent.arrays) for sent in seen if sent.direction == DOWN]
    assert all(arrays == {} for r, arrays in downs if r == 1)  # nothing global exists before round 1
    for _, arrays in (d for d in downs if d[0] > 1):
        assert arrays == {"parameters": names, "label-statistics": {"label_distribution"}}

    records = read_ledger(out / "fedmdcg" / "ledger.jsonl")
    assert len(records) == 2 * 5 * ROUNDS
    for record in records:
        if record["direction"] == UP:
            assert set(record["kinds"]) == {"parameters", "label-statistics", "metrics"}
            assert record["kinds"]["parameters"] == pair_bytes  # C_i and G_i: no room for F_i
            assert record["kinds"]["label-statistics"] == 8 * 10  # ten int64 class counts
    comm = runs["fedmdcg"]["communication"]
    assert comm[UP]["per_kind"]["parameters"] == 5 * ROUNDS * pair_bytes
    assert comm[DOWN]["per_kind"]["parameters"] == 5 * (ROUNDS - 1) * pair_bytes

    server = read_checkpoint(latest_checkpoint(out / "fedmdcg" / "checkpoints"))["server"]
    assert {CLASSIFIER_PREFIX + k for k in server["classifier"]} | {
        GENERATOR_PREFIX + k for k in server["generator"]
    } == names  # the server never held an extractor
    models = {p.name for p in (out / "fedmdcg" / "models").iterdir()}
    assert models == {"global_classifier.safetensors", "global_generator.safetensors"}


def test_local_accuracy_beats_standalone_on_non_iid_digits(suite):
    """Each client's full model on its own IID test shard (the paper's local accuracy), sample-weighted.
    Measured (clients 5, alpha 0.5, 8 rounds of 20 steps): FedMD-CG 0.656, Standalone 0.547.

    At this size most of the gain is the shared classifier: with every distillation term off (all
    λ = 0, no server distillation) the same run reaches 0.644. What the generators add is asserted
    through their own mechanism: the global pair (C_g, G_g), built by the server without data from
    the uploaded pairs only, classifies its own samples as their labels (measured 0.98, chance 0.1)."""
    out, runs, _ = suite
    local = {name: run["final"]["local_accuracy"] for name, run in runs.items()}
    assert local["fedmdcg"] > local["standalone"] + 0.05, local
    final = runs["fedmdcg"]["final"]
    assert "test_accuracy" not in final and runs["fedmdcg"]["test_accuracy"] is None  # no global model
    assert 0.1 < final["personal_test_accuracy"] <= 1.0
    rows = read_jsonl(out / "fedmdcg" / "metrics.jsonl")
    assert rows[0]["global_pair_accuracy"] < 0.3 < 0.9 < rows[-1]["global_pair_accuracy"]
    assert rows[-1]["generator_accuracy"] > 0.9  # each C_i reads its own G_i's features as their labels
    assert [r["ramp"] for r in rows][:2] == [0.0, pytest.approx((1 / 7) ** 3)]  # round 0: CE only
    for r in rows:  # the head the clients get, next to the plain average it was distilled from
        assert r["classifier_norm"] > 0 and r["classifier_norm_averaged"] > 0
    assert rows[0]["classifier_norm"] < rows[0]["classifier_norm_averaged"]  # the weight decay's shrink


def test_global_accuracy_oracle_reads_client_states_outside_the_protocol(suite):
    """The paper's global accuracy averages full local models; it is computed from each site's own
    checkpointed state, so no extractor ever appears in the ledger (checked above)."""
    out, _, _ = suite
    config = _config(algorithm="fedmdcg")
    state = read_checkpoint(latest_checkpoint(out / "fedmdcg" / "checkpoints"))
    clients = [state[f"client_{k:03d}"] for k in range(5)]
    extractors = [part_of(c["model"], EXTRACTOR_PREFIX) for c in clients]
    assert any(
        not torch.equal(extractors[0][n], extractors[1][n]) for n in extractors[0]
    )  # private, distinct
    data = prepare_data(config)
    oracle = oracle_global_accuracy(clients, config, data.dataset.info, data.dataset.test)
    assert set(oracle) == {ORACLE_METRIC} and 0.1 < oracle[ORACLE_METRIC] <= 1.0


def _pair(
    gen_weight: list[list[float]], head_weight: list[list[float]]
) -> tuple[FeatureGenerator, nn.Linear]:
    """A noise-free linear generator (2 classes -> 2 features) and a linear head, set by hand."""
    generator = FeatureGenerator(2, 2, noise_dim=1, hidden_dims=())
    head = nn.Linear(2, 2)
    with torch.no_grad():
        generator.representation_layer.weight.copy_(torch.tensor(gen_weight))
        generator.representation_layer.bias.zero_()
        head.weight.copy_(torch.tensor(head_weight))
        head.bias.zero_()
    return generator, head


def test_crossed_distillation_follows_the_client_that_holds_each_class():
    """Client 0 holds only class 0, client 1 only class 1. Their pairs give, by hand,
    C_0(G_0(0)) = (2, 0) and C_1(G_1(1)) = (0, 3); client 1 on class 0 would say (0, 1.5). With the
    per-sample label weights the global pair must learn class 0 from client 0 and class 1 from
    client 1 only: softmax (0.881, 0.119) and (0.047, 0.953)."""
    g0, c0 = _pair([[0.0, 1.0, 0.3], [0.0, 0.0, -0.5]], [[2.0, 0.0], [0.0, 0.0]])  # G_0(0) = (1, 0)
    g1, c1 = _pair([[0.0, -1.0, 0.0], [0.0, 0.5, 1.0]], [[0.0, 0.0], [0.0, 3.0]])  # G_1(1) = (0, 1)
    generator, head = _pair([[0.0, 0.0, 0.15], [0.0, 0.25, 0.25]], [[1.0, 0.0], [0.0, 1.5]])  # the average
    counts = torch.tensor([[5, 0], [0, 5]])
    y = torch.tensor([0, 1])

    def loss() -> float:
        with torch.no_grad():
            g = generator(y, torch.zeros(2, 1))
            teachers = torch.stack([c0(g0(y, torch.zeros(2, 1))), c1(g1(y, torch.zeros(2, 1)))])
            feats = [g0(y, torch.zeros(2, 1)), g1(y, torch.zeros(2, 1))]
            terms = L.crossed_distillation(
                head(g),
                torch.stack([head(f) for f in feats]),
                torch.stack([c0(g), c1(g)]),
                teachers,
                L.per_sample_label_weights(L.label_weights(counts), y),
                1.0,
            )
        return float(terms.total)

    before = loss()
    local_before = [{k: v.clone() for k, v in m.state_dict().items()} for m in (g0, c0, g1, c1)]
    optimizer = torch.optim.Adam([*generator.parameters(), *head.parameters()], lr=0.05)
    metrics = crossed_distillation_steps(
        generator, head, [g0, g1], [c0, c1], counts, optimizer, steps=400, batch_size=32, temperature=1.0,
        rng=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert metrics["server_loss"] < metrics["server_loss_first"]
    assert loss() < 0.05 * before, (before, loss())
    with torch.no_grad():
        probs = torch.softmax(head(generator(y, torch.zeros(2, 1))), dim=1)
    expected = torch.tensor([[0.8808, 0.1192], [0.0474, 0.9526]])
    assert torch.allclose(probs, expected, atol=0.03), probs
    for module, state in zip((g0, c0, g1, c1), local_before, strict=True):  # the teachers stay frozen
        assert all(torch.equal(module.state_dict()[k], v) for k, v in state.items())


def test_each_generator_output_feeds_every_term_it_appears_in():
    """One draw of G_i(y) is read by C_i (the teacher) and by C_g (L2), one draw of G_g(y) by C_g (L1)
    and by C_i (L3), as in the released code (manager.py: cache_gen_result, global_gen_result). With a
    generator whose output is its noise and C_g = C_i, L2 is then exactly 0 and L1 = L3; were each
    term to draw its own ε, neither would hold."""
    generator = FeatureGenerator(2, 2, noise_dim=2, hidden_dims=())
    with torch.no_grad():  # G(y, ε) = ε: the output is all noise
        generator.representation_layer.weight.copy_(torch.eye(2, 4))  # the input is (ε, one-hot y)
        generator.representation_layer.bias.zero_()
    head = nn.Linear(2, 2)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[3.0, -1.0], [0.5, 2.0]]))
        head.bias.zero_()
    local_g, local_c = FeatureGenerator(2, 2, noise_dim=2, hidden_dims=()), nn.Linear(2, 2)
    local_g.load_state_dict(generator.state_dict())
    local_c.load_state_dict(head.state_dict())
    optimizer = torch.optim.SGD([*generator.parameters(), *head.parameters()], lr=0.0)
    metrics = crossed_distillation_steps(
        generator, head, [local_g], [local_c], torch.tensor([[4, 4]]), optimizer, steps=1, batch_size=16,
        temperature=1.0, rng=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert metrics["server_l2"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["server_l1"] == pytest.approx(metrics["server_l3"], abs=1e-7) and metrics["server_l1"] > 0


def test_one_draw_of_the_received_generator_is_both_targets_of_the_local_model():
    """Stage 1 (Eq. 2): the KL target is the local head's reading of the same Ĝ(y, ε) the extractor's
    features are pulled towards (the code's one gen_result), not of another draw."""
    client = make_client(_config(), "fedmdcg")
    message = Message.build(
        "train",
        arrays={
            "parameters": {CLASSIFIER_PREFIX + k: v for k, v in client.model.classifier.state_dict().items()}
            | {GENERATOR_PREFIX + k: v for k, v in client.generator.state_dict().items()},
            "label-statistics": {"label_distribution": torch.full((10,), 0.1)},
        },
        scalars={"config": {"round": 2}},
    )
    seen: dict[str, list[torch.Tensor]] = {"kl": [], "mse": []}
    kl, mse = L.logit_kd_from_global, L.feature_kd_to_global

    def spy_kl(local_logits, generated_logits, temperature):
        seen["kl"].append(generated_logits.detach().clone())
        return kl(local_logits, generated_logits, temperature)

    def spy_mse(local_features, generated_features):
        seen["mse"].append(client.model.classifier(generated_features).detach().clone())
        return mse(local_features, generated_features)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(L, "logit_kd_from_global", spy_kl)
        patch.setattr(L, "feature_kd_to_global", spy_mse)
        client.handle(message)
    assert len(seen["kl"]) == len(seen["mse"]) == 20
    for target, read in zip(seen["kl"], seen["mse"], strict=True):
        assert torch.allclose(target, read, atol=1e-6)


def test_server_weight_decay_outweighs_a_near_converged_distillation_and_shrinks_the_head():
    """Why FedMD-CG's clients start each round from a shrunken classifier (benchmarks/fedmdcg_variants.py).

    The server's Adam (lr 3e-4, weight decay 1e-4: the code's) adds the decay to the gradient. When the
    local pairs agree with the global one, the distillation gradient is ~0 and the decay alone steers
    Adam's normalised steps: every head weight moves about lr per step towards 0, 50 steps a round. The
    same run without weight decay leaves the head (almost) where it is."""
    weights = [[0.05, -0.04], [0.03, 0.06]]  # the scale of a trained fc layer's weights

    def shrink(weight_decay: float) -> torch.Tensor:
        g0, c0 = _pair([[0.0, 1.0, 0.3], [0.0, 0.0, -0.5]], weights)
        generator, head = _pair([[0.0, 1.0, 0.3], [0.0, 0.0, -0.5]], weights)  # agrees with its client
        optimizer = torch.optim.Adam(
            [*generator.parameters(), *head.parameters()], lr=3e-4, weight_decay=weight_decay
        )
        crossed_distillation_steps(
            generator, head, [g0], [c0], torch.tensor([[5, 5]]), optimizer, steps=50, batch_size=32,
            rng=torch.Generator().manual_seed(0),
        )  # fmt: skip
        return torch.tensor(weights).abs() - head.weight.detach().abs()

    decayed, kept = shrink(1e-4), shrink(0.0)
    assert decayed.min() > 0.4 * 50 * 3e-4, decayed  # 0.0075-0.015 of weights of 0.03-0.06: 20-30 %
    assert kept.abs().max() < 0.1 * decayed.min(), kept  # without the decay the head barely moves


def test_official_code_preset_switches_the_codes_bugs_on():
    paper = resolve_options(_config(), FedMDCGOptions())
    assert (paper.noise, paper.clear_cache, paper.dedup_label_sum, paper.softmax_bug) == (
        "normal", True, False, False
    )  # fmt: skip
    assert paper.label_counts == "data"
    config = _config(**{"fedmdcg.preset": "official-code", "fedmdcg.softmax_bug": False})
    official = resolve_options(config, options_for(config, "fedmdcg", FedMDCGOptions))
    assert (official.noise, official.clear_cache, official.dedup_label_sum, official.label_counts) == (
        "uniform", False, True, "cache"
    )  # fmt: skip
    assert official.softmax_bug is False  # a key the user set wins over the preset
    assert resolve_options(
        _config(**{"fedmdcg.preset": "official-code"}), FedMDCGOptions(preset="official-code")
    ).softmax_bug


def test_the_batch_cache_and_label_counts_follow_the_preset():
    """Paper: the cache is cleared after each round and the counts are the split's class counts. Code:
    the cache keeps growing (only batches with a new label sum) and the counts are its label sums
    plus a floor of 0 in round 0 and 1 afterwards."""
    round1 = Message.build("train", scalars={"config": {"round": 1}})
    client = make_client(_config(), "fedmdcg")
    reply = client.handle(round1)
    assert client.cache == [] and client.state_dict()["cache_x"] == []
    expected = torch.bincount(client.ctx.train.y, minlength=10)
    assert torch.equal(reply.tensor("label-statistics", "class_counts"), expected)
    assert reply.scalar("metrics", "generator_steps") == 20

    client = make_client(_config(**{"fedmdcg.preset": "official-code"}), "fedmdcg")
    assert client.generator.noise == "uniform"
    reply = client.handle(round1)
    sums = [int(y.sum()) for _, y in client.cache]
    assert 0 < len(sums) <= 20 and len(set(sums)) == len(sums)
    cached = sum(torch.bincount(y, minlength=10) for _, y in client.cache)
    assert torch.equal(reply.tensor("label-statistics", "class_counts"), cached)
    assert reply.scalar("metrics", "generator_steps") == len(sums)


def test_a_client_refuses_to_receive_an_extractor_and_needs_the_global_pair():
    client = make_client(_config(), "fedmdcg")
    whole = dict(client.model.state_dict()) | {
        GENERATOR_PREFIX + k: v for k, v in client.generator.state_dict().items()
    }
    message = Message.build(
        "train",
        arrays={"parameters": whole, "label-statistics": {"label_distribution": torch.full((10,), 0.1)}},
        scalars={"config": {"round": 2}},
    )
    with pytest.raises(FederationError, match="unexpected parameters arrays"):
        client.handle(message)
    with pytest.raises(FederationError, match="need the global classifier and generator"):
        client.handle(Message.build("train", scalars={"config": {"round": 2}}))


@pytest.mark.parametrize(
    "key, value",
    [
        ("diversity", "div3"),
        ("preset", "code"),
        ("generator_hidden", "a,b"),
        ("lambda_mse", -1.0),
        ("server_steps", 0),
    ],
)
def test_bad_options_fail_with_the_option_name(key, value):
    config = _config(**{f"fedmdcg.{key}": value})
    with pytest.raises(ConfigError, match=key.split("_")[0]):
        options_for(config, "fedmdcg", FedMDCGOptions)


def test_a_server_batch_of_one_is_refused_before_the_run():
    """G_g trains in train mode, and its BatchNorm cannot normalise a batch of one sample: the option
    says so at once instead of stopping the run after the first round of local training."""
    config = _config(**{"fedmdcg.server_batch_size": 1})
    with pytest.raises(ConfigError, match=r"fedmdcg.server_batch_size must be >= 2 .*BatchNorm.*got 1"):
        options_for(config, "fedmdcg", FedMDCGOptions)
    options_for(
        _config(**{"fedmdcg.server_batch_size": 2, "fedmdcg.generated_batch_size": 1}),
        "fedmdcg",
        FedMDCGOptions,
    )


def test_a_restart_under_the_official_preset_loses_nothing(tmp_path):
    """Crash in round 3, resume from the checkpoint: the same metrics as an uninterrupted run. Under the
    official-code preset the never-cleared cache, G_i and both optimisers must all survive."""
    config = _config(algorithm="fedmdcg", rounds=3, **{"fedmdcg.preset": "official-code"})
    resumed = check_resume_after_crash(config, FedMDCGServer, tmp_path)
    state = read_checkpoint(latest_checkpoint(resumed / "checkpoints"))
    assert len(state["client_000"]["cache_x"]) > 20  # the code's cache outlived its first round


@pytest.mark.filterwarnings("ignore:.*meta parameter.*:UserWarning")
def test_a_restored_batch_cache_is_on_the_run_device(monkeypatch):
    """A checkpoint reads back on the CPU; under the official-code preset the restored cache of real
    batches must meet the local model on the run's device (a GPU), as the cache it replaces did.
    `meta` stands in for the card."""
    client = make_client(_config(**{"fedmdcg.preset": "official-code"}), "fedmdcg")
    client.handle(Message.build("train", scalars={"config": {"round": 1}}))
    state = client.state_dict()
    assert state["cache_x"]
    monkeypatch.setattr(devices, "_current", torch.device("meta"))
    client.model.to("meta")
    client.generator.to("meta")
    client.load_state_dict(state)
    assert {t.device.type for x, y in client.cache for t in (x, y)} == {"meta"}


def test_flower_nodes_keep_the_client_state_between_messages(tmp_path):
    """On Flower every message may meet a fresh client process: forgetting every client object between
    messages, the state kept on node storage (F_i, G_i, optimisers, the code's cache) must give the
    in-process results and ledger."""
    pytest.importorskip("flwr")
    from fedistill.engine.flower import node as flower_node
    from fedistill.engine.flower.apps import make_client_app
    from flower_local_grid import LocalGrid, run_on_grid

    options = {"generator_hidden": "32", "server_steps": 5, "preset": "official-code"}
    config = _config(algorithm="fedmdcg", clients=3, rounds=2, fedmdcg=options)
    here = run_suite(config, tmp_path / "inprocess", progress=False)[0]
    app = make_client_app(config, state_root=tmp_path / "nodes")

    def ephemeral(message, context):
        flower_node._NODES.clear()
        return app(message, context)

    grid = LocalGrid(ephemeral, config.clients)
    there = run_on_grid(config, tmp_path / "flower", grid)[0]
    assert there["final"] == pytest.approx(here["final"], abs=1e-6)

    def traffic(run: str) -> list[tuple]:
        records = read_ledger(tmp_path / run / "fedmdcg" / "ledger.jsonl")
        return sorted(
            (r["round"], r["direction"], r["client"], r["type"], tuple(sorted(r["kinds"].items())))
            for r in records
            if r["type"] != "query.hello"
        )

    assert traffic("flower") == traffic("inprocess")


def test_the_pair_accuracy_probe_reads_both_generator_and_classifier_in_eval_mode():
    """global_pair_accuracy is a probe: a head with dropout (VGG-9's) must not drop units while it is
    read, and both modules go back to the mode they were in."""

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)
            self.modes: list[bool] = []

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            self.modes.append(self.training)
            return self.fc(h)

    generator = FeatureGenerator(3, 4, noise_dim=2, hidden_dims=(8,))
    head = Head()
    accuracy = pair_accuracy(generator, head, torch.tensor([[2, 1, 1]]), 16, torch.Generator().manual_seed(0))
    assert 0.0 <= accuracy <= 1.0
    assert head.modes == [False]
    assert head.training and generator.training
