"""A site cannot poison the federation with finite values: logits scaled by 1e30, a bias of 1e30 or
class counts larger than the site are dropped as invalid replies (ledger status `invalid`, the client
named among the dropped ones in the summary) and the run goes on. The final accuracy is compared with
the run where that site is absent (every request to it fails): dropping a site of a tiny federation
moves the accuracy more than its poison then does."""

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from algorithm_helpers import TINY_FEDIOD
from fedistill.algorithms.shared.weight_average import robust_average_states, robust_combine
from fedistill.analysis.poisons import huge_bias, inflated_counts, scaled_logits
from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import run_suite
from fedistill.federation.ledger import read_ledger
from fedistill.federation.messages import Message
from fedistill.federation.plausibility import (
    GRADIENTS,
    LOGITS,
    PARAMETERS,
    count_faults,
    magnitude_faults,
    norm_faults,
    probability_faults,
)
from fedistill.transports.inprocess import InProcessFleet

BAD = 1


def absent(message: Message) -> Message:
    raise RuntimeError("site absent")


@pytest.fixture
def poisoning(monkeypatch):
    """Make client BAD pass every reply through `poison` (or fail every request: `absent`)."""

    def install(poison: Callable[[Message], Message]) -> None:
        original = InProcessFleet.__init__

        def init(self, clients, ledger, **kwargs):
            original(self, clients, ledger, **kwargs)
            client = self._clients.get(BAD)
            if client is not None:
                honest = client.handle
                client.handle = lambda message: poison(honest(message))

        monkeypatch.setattr(InProcessFleet, "__init__", init)

    return install


def _run(tmp_path: Path, config: RunConfig, name: str) -> dict:
    return run_suite(config, tmp_path / name, progress=False)[0]


def _fediod(**fediod) -> RunConfig:
    base = {**TINY_FEDIOD, "algorithm": "fediod", "rounds": 1}
    return build_config(RunConfig(), base, {"fediod": {**TINY_FEDIOD["fediod"], **fediod}})


def _feddf(**feddf) -> RunConfig:
    base = {"algorithm": "feddf", "clients": 4, "rounds": 2, "model": "mlp", "alpha": 100.0}
    return build_config(RunConfig(), base, {"feddf": {"steps": 20, "eval_every_steps": 10, **feddf}})


def _fedavg(**fedavg) -> RunConfig:
    base = {"algorithm": "fedavg", "clients": 4, "rounds": 3, "model": "mlp", "alpha": 100.0}
    return build_config(RunConfig(), base, {"fedavg": fedavg})


def _fedavg_oneshot(**options) -> RunConfig:
    base = {"algorithm": "fedavg-oneshot", "clients": 4, "rounds": 1, "model": "mlp", "alpha": 100.0}
    return build_config(RunConfig(), base, {"fedavg-oneshot": {"teacher_epochs": 2, **options}})


def _fedmd(**fedmd) -> RunConfig:
    base = {
        "algorithm": "fedmd",
        "clients": 4,
        "rounds": 2,
        "model": "mlp",
        "alpha": 100.0,
        "val_fraction": 0.2,
    }
    small = {"transfer_epochs": 1, "private_epochs": 1, "alignment_size": 100}
    return build_config(RunConfig(), base, {"fedmd": {**small, **fedmd}})


CASES = {
    "fediod scaled logits": (_fediod, {}, scaled_logits, "logits: max |value|"),
    "fediod inflated class counts": (
        _fediod,
        {"ensemble_weighting": "class-share"},
        inflated_counts,
        "label-statistics",
    ),
    "feddf huge bias": (_feddf, {}, huge_bias, "parameters: norm"),
    "fedavg huge bias": (_fedavg, {}, huge_bias, "parameters: norm"),
    "one-shot fedavg huge bias": (_fedavg_oneshot, {}, huge_bias, "parameters: norm"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_poisoning_site_is_dropped_and_named(tmp_path, poisoning, case):
    make, options, poison, named = CASES[case]
    poisoning(poison)
    summary = _run(tmp_path, make(**options), "poisoned")
    reason = summary["dropped_clients"][str(BAD)]
    assert "invalid reply" in reason and "implausible" in reason and named in reason
    algorithm = summary["algorithm"] if "algorithm" in summary else make().algorithm
    invalid = [
        r for r in read_ledger(tmp_path / "poisoned" / algorithm / "ledger.jsonl") if r["status"] == "invalid"
    ]
    assert invalid and {r["client"] for r in invalid} == {BAD}
    assert all("implausible" in r["error"] for r in invalid)
    poisoning(absent)
    without = _run(tmp_path, make(**options), "absent")
    assert abs(summary["test_accuracy"] - without["test_accuracy"]) < 0.02


def test_without_the_checks_the_poison_gets_in(tmp_path, poisoning):
    poisoning(huge_bias)
    summary = _run(tmp_path, _feddf(plausibility_checks=False), "unchecked")
    assert str(BAD) not in summary["dropped_clients"]


def test_fedavg_with_a_robust_aggregate_survives_the_poison_without_the_checks(tmp_path, poisoning):
    poisoning(huge_bias)
    summary = _run(tmp_path, _fedavg(plausibility_checks=False, aggregate="median"), "median")
    assert str(BAD) not in summary["dropped_clients"]  # nothing dropped: the median alone keeps it out
    poisoning(absent)
    without = _run(tmp_path, _fedavg(), "absent")
    assert abs(summary["test_accuracy"] - without["test_accuracy"]) < 0.05


def test_a_median_keeps_the_poisoned_bias_out_of_the_average():
    honest = [{"w": torch.full((3,), float(v)), "n": torch.tensor(5)} for v in (1.0, 2.0, 3.0)]
    poisoned = [*honest, {"w": torch.full((3,), 1e30), "n": torch.tensor(7)}]
    for mode in ("median", "trimmed-mean"):
        out = robust_average_states(poisoned, [1.0, 1.0, 1.0, 1.0], mode)
        assert float(out["w"].abs().max()) <= 3.0 and int(out["n"]) == 5


# --- the rules, one by one, on hand-made replies -------------------------------------------------------
def _reply(kind: str, **arrays: np.ndarray) -> Message:
    return Message.build("train", arrays={kind: arrays})


def _honest_logits(rng: np.random.Generator) -> dict[int, Message]:
    """Heterogeneous but honest: a one-class site's confident teacher, a small site's flat one."""
    scales = {0: 3.0, 1: 12.0, 2: 40.0, 3: 0.5}
    return {
        c: _reply("logits", z=(s * rng.standard_normal((16, 10))).astype(np.float32))
        for c, s in scales.items()
    }


def test_logit_magnitudes():
    rng = np.random.default_rng(0)
    honest = _honest_logits(rng)
    assert magnitude_faults(honest) == {}
    poisoned = {**honest, 1: _reply("logits", z=honest[1].array("logits", "z") * np.float32(1e30))}
    assert set(magnitude_faults(poisoned)) == {1}
    two = {0: honest[0], 1: poisoned[1]}  # two sites: the poisoned one is judged against the honest one
    assert set(magnitude_faults(two)) == {1}
    assert magnitude_faults({0: honest[0]}) == {}  # alone, only beyond the cap
    assert set(magnitude_faults({0: poisoned[1]})) == {0}
    assert LOGITS.limit([5.0, 6.0]) >= 1000.0


def test_parameter_and_gradient_norms():
    rng = np.random.default_rng(1)
    params = {
        c: _reply("parameters", w=(rng.standard_normal(50) * s).astype(np.float32), b=np.zeros(3, np.float32))
        for c, s in enumerate((1.0, 1.5, 0.7, 2.0))
    }
    assert norm_faults(params, "parameters", PARAMETERS) == {}
    bias = {
        **params,
        2: _reply("parameters", w=params[2].array("parameters", "w"), b=np.full(3, 1e30, np.float32)),
    }
    assert set(norm_faults(bias, "parameters", PARAMETERS)) == {2}
    other_architecture = {**params, 9: _reply("parameters", v=np.full(4000, 5.0, np.float32))}
    assert norm_faults(other_architecture, "parameters", PARAMETERS) == {}  # compared only with itself
    grads = {
        c: _reply("input-gradients", x=np.full(64, g, np.float32)) for c, g in enumerate((1e-4, 1e-2, 1e-3))
    }
    assert norm_faults(grads, "input-gradients", GRADIENTS) == {}
    grads[3] = _reply("input-gradients", x=np.full(64, 1e20, np.float32))
    assert set(norm_faults(grads, "input-gradients", GRADIENTS)) == {3}


def test_from_three_sites_a_site_sending_zeros_cannot_get_an_honest_one_dropped():
    """The others' median of an honest site is then at least half the other honest site's value (the
    how-to's few-sites paragraph); with two sites the honest one has only the floor to stay under."""
    big = np.random.default_rng(3).standard_normal(100_000).astype(np.float32) * 0.5  # norm about 158
    honest = {0: _reply("parameters", w=big), 1: _reply("parameters", w=big * np.float32(1.05))}
    zeros = _reply("parameters", w=np.zeros_like(big))
    assert norm_faults({**honest, 2: zeros}, "parameters", PARAMETERS) == {}
    assert set(norm_faults({0: honest[0], 2: zeros}, "parameters", PARAMETERS)) == {0}


def test_class_counts():
    counts = {0: np.array([5, 0, 3]), 1: np.array([0, 0, 40]), 2: np.array([1, 1, 1])}
    samples = {0: 8.0, 1: 40.0, 2: 3.0}
    assert count_faults(counts, samples) == {}
    assert set(count_faults({**counts, 1: np.array([0, 0, 40_000])}, samples)) == {1}
    assert "sum to" in count_faults({**counts, 2: np.array([1, 1, 0])}, samples)[2]
    assert "negative" in count_faults({**counts, 0: np.array([9, -1, 0])}, samples)[0]


def test_probabilities():
    rng = np.random.default_rng(2)
    honest = {c: rng.dirichlet(np.full(10, a), size=8) for c, a in enumerate((0.05, 1.0, 50.0))}
    assert probability_faults(honest) == {}
    assert set(probability_faults({**honest, 1: honest[1] * 3})) == {1}
    assert set(probability_faults({**honest, 2: honest[2] - 0.5})) == {2}


def test_robust_combines():
    values = torch.tensor([[1.0, 5.0], [2.0, 6.0], [1e30, 7.0]])
    equal = torch.full((3, 1), 1 / 3)
    assert torch.equal(robust_combine(values, equal, "median"), torch.tensor([2.0, 6.0]))
    assert torch.equal(robust_combine(values, equal, "trimmed-mean"), torch.tensor([2.0, 6.0]))
    weighted = torch.tensor([[0.6], [0.3], [0.1]])
    assert torch.equal(robust_combine(values, weighted, "median"), torch.tensor([1.0, 5.0]))


def test_the_trim_count_is_the_share_of_the_sites_as_written():
    """0.29 of 100 sites is 29 cut at each end, though 0.29 * 100 is 28.999... in floating point; at least
    one is cut from three sites up, none below."""
    values = torch.arange(100, dtype=torch.float64).view(100, 1) ** 2
    ones = torch.ones(100, 1, dtype=torch.float64)
    assert robust_combine(values, ones, "trimmed-mean", 0.29).item() == values[29:71].mean().item()
    assert robust_combine(values[:3], ones[:3], "trimmed-mean", 0.0).item() == 1.0
    assert robust_combine(values[:2] ** 2, ones[:2], "trimmed-mean", 0.4).item() == 0.5


def test_a_bad_trim_share_is_one_line_that_names_its_section():
    from fedistill.engine.setup import resolve
    from fedistill.errors import ConfigError

    config = build_config(RunConfig(), {"algorithm": "fedavg"}, {"fedavg": {"aggregate_trim": 0.5}})
    with pytest.raises(ConfigError, match=r"^fedavg\.aggregate_trim must be in \[0, 0\.5\), got 0\.5$"):
        resolve(config, "fedavg")


def test_a_median_over_sites_of_no_weight_is_their_plain_median():
    """Sites that all report 0 samples: the median is theirs unweighted (as the trimmed mean falls back to
    its plain mean), not a model of zeros."""
    values = torch.tensor([[1.0, 5.0], [2.0, 6.0], [4.0, 9.0]])
    none = torch.zeros(3, 1)
    assert torch.equal(robust_combine(values, none, "median"), torch.tensor([2.0, 6.0]))
    assert torch.equal(robust_combine(values, none, "trimmed-mean"), torch.tensor([2.0, 6.0]))
    alone = robust_average_states([{"w": torch.tensor([3.0, -1.0])}], [0.0], "median")
    assert torch.equal(alone["w"], torch.tensor([3.0, -1.0]))
    # weights that are not all 0 keep their meaning: 0.1 + 0.3 < 0.5, so the third value
    some = torch.tensor([[0.1], [0.3], [0.6]])
    assert torch.equal(robust_combine(values, some, "median"), torch.tensor([4.0, 9.0]))


@pytest.mark.parametrize("checks", [True, False])
def test_fedmds_consensus_never_takes_a_sites_scaled_scores(tmp_path, poisoning, monkeypatch, checks):
    """FedMD's consensus is a plain mean: one site's scores times 1e30 would be every site's digest target.
    With the checks that site is dropped from each round's scores and named; without, the poison gets in.
    (The accuracy is each site's own model's, so it is not compared with a run without that site.)"""
    from fedistill.algorithms.fedmd import fedmd

    peaks: list[float] = []
    mean = fedmd.consensus
    monkeypatch.setattr(
        fedmd,
        "consensus",
        lambda scores: peaks.append(max(float(s.abs().max()) for s in scores)) or mean(scores),
    )
    poisoning(scaled_logits)
    summary = _run(tmp_path, _fedmd(plausibility_checks=checks), "run")
    assert len(peaks) == 2  # one consensus a round
    if checks:
        assert max(peaks) < 1e3 and "logits: max |value|" in summary["dropped_clients"][str(BAD)]
    else:
        assert min(peaks) > 1e20 and str(BAD) not in summary["dropped_clients"]
