"""Every invalid reply is treated alike: the client is dropped with a reason naming what was wrong, the
ledger records the reply as `invalid`, and the run goes on with the others; fewer valid replies than
`min_clients` stop the run with one line naming the clients and their faults."""

from collections.abc import Callable

import numpy as np
import pytest

from algorithm_helpers import TINY_FEDIOD
from fedistill.cli import main
from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import run_suite
from fedistill.federation.ledger import read_ledger
from fedistill.federation.messages import Message
from fedistill.transports.inprocess import InProcessFleet

BAD_CLIENT = 1


def _rebuilt(message: Message, arrays=None, metrics=None) -> Message:
    """A copy of `message` with its arrays or metrics replaced (bypassing nothing: Message.build)."""
    scalars = {k: dict(v) for k, v in message.scalars.items()}
    if metrics is not None:
        scalars["metrics"] = metrics
    return Message.build(message.type, arrays if arrays is not None else message.arrays, scalars)


def _first_kind(message: Message) -> tuple[str, str]:
    kind = sorted(message.arrays)[0]
    return kind, sorted(message.arrays[kind])[0]


def _with_array(message: Message, change: Callable[[np.ndarray], np.ndarray | None]) -> Message:
    kind, name = _first_kind(message)
    # every array as the site computed it (decoded from its wire encoding): the site then sends it raw
    arrays = {k: {n: message.array(k, n) for n in v} for k, v in message.arrays.items()}
    changed = change(arrays[kind][name])
    if changed is None:
        del arrays[kind][name]
    else:
        arrays[kind][name] = changed
    return _rebuilt(message, arrays=arrays)


def _without_one(metrics: dict) -> dict:
    """The metrics less num_samples (or, where a reply carries none, less its first metric)."""
    gone = "num_samples" if "num_samples" in metrics else sorted(metrics)[0]
    return {k: v for k, v in metrics.items() if k != gone}


CORRUPTIONS: dict[str, Callable[[Message], Message]] = {
    "wrong shape": lambda m: _with_array(m, lambda a: np.zeros((*a.shape, 2), a.dtype)),
    "wrong dtype": lambda m: _with_array(m, lambda a: a.astype(np.float64)),
    "missing array": lambda m: _with_array(m, lambda a: None),
    "NaN": lambda m: _with_array(m, lambda a: np.full(a.shape, np.nan, a.dtype)),
    "missing metric": lambda m: _rebuilt(m, metrics=_without_one(m.scalars["metrics"])),
    "negative num_samples": lambda m: _rebuilt(m, metrics={**m.scalars["metrics"], "num_samples": -50}),
    # the weight of the site's local accuracy in the federation's: a count like num_samples
    "negative local_count": lambda m: _rebuilt(m, metrics={**m.scalars["metrics"], "local_count": -50.0}),
    "oversize": lambda m: _with_array(m, lambda a: a),  # with a message cap set below its size
    "text metric": lambda m: _rebuilt(m, metrics={**m.scalars["metrics"], "train_loss": "low"}),
    # the refusal flag on a reply that also carries its arrays: refusals carry their epsilons alone
    "refusal with arrays": lambda m: _rebuilt(
        m, metrics={**m.scalars["metrics"], "privacy_budget_refused": True}
    ),
}
WHAT_IS_NAMED = {
    "wrong shape": "expected",
    "wrong dtype": "float64",
    "missing array": "missing",
    "NaN": "NaN",
    "missing metric": "missing metric 'num_samples'",
    "negative num_samples": "negative",
    "negative local_count": "metric 'local_count' is -50.0, a negative sample count",
    "oversize": "exceeds the cap",
    "text metric": "metric 'train_loss' is 'low', not a number",
    "refusal with arrays": "refusal that carries arrays",
}


@pytest.fixture
def misbehaving(monkeypatch):
    """Make client BAD_CLIENT corrupt its replies to `message_type` with `corruption`."""

    def install(corruption: str, message_type: str) -> None:
        original = InProcessFleet.__init__

        def init(self, clients, ledger, **kwargs):
            original(self, clients, ledger, **kwargs)
            client = self._clients.get(BAD_CLIENT)
            if client is None:
                return
            honest = client.handle

            def handle(message: Message) -> Message:
                reply = honest(message)
                if reply.type != message_type:
                    return reply
                if corruption == "oversize":  # pad the reply past the cap
                    arrays = {k: dict(v) for k, v in reply.arrays.items()}
                    arrays.setdefault("logits", {})["padding"] = np.zeros(2**20, np.float32)  # 4 MiB
                    return _rebuilt(reply, arrays=arrays)
                return CORRUPTIONS[corruption](reply)

            client.handle = handle

        monkeypatch.setattr(InProcessFleet, "__init__", init)

    return install


def _config(algorithm: str, **changes) -> RunConfig:
    base = {"algorithm": algorithm, "clients": 3, "rounds": 2, "model": "mlp", "alpha": 1.0}
    if algorithm == "fediod":
        base = {**TINY_FEDIOD, "algorithm": "fediod", "rounds": 1, "model": "lenet-fedmdcg"}
    return build_config(RunConfig(), base, changes)


@pytest.mark.parametrize("corruption", [c for c in CORRUPTIONS if c != "oversize"])
def test_fedavg_drops_a_client_whose_update_is_invalid(tmp_path, misbehaving, corruption):
    misbehaving(corruption, "train")
    summary = run_suite(_config("fedavg"), tmp_path, progress=False)[0]
    reason = summary["dropped_clients"][str(BAD_CLIENT)]
    assert reason.startswith("round 1: invalid reply")
    assert WHAT_IS_NAMED[corruption] in reason
    assert summary["test_accuracy"] is not None
    invalid = [r for r in read_ledger(tmp_path / "fedavg" / "ledger.jsonl") if r["status"] == "invalid"]
    assert {r["client"] for r in invalid} == {BAD_CLIENT}
    assert all(r["bytes"] > 0 for r in invalid)  # an invalid reply's bytes crossed the boundary too


def test_an_oversize_reply_is_invalid_like_any_other(tmp_path, misbehaving):
    misbehaving("oversize", "evaluate.teachers")
    config = _config("fediod", max_message_mb=2.0)  # above every honest message of the tiny run
    summary = run_suite(config, tmp_path, progress=False)[0]
    assert "exceeds the cap" in summary["dropped_clients"][str(BAD_CLIENT)]
    invalid = [r for r in read_ledger(tmp_path / "fediod" / "ledger.jsonl") if r["status"] == "invalid"]
    assert invalid and all(r["bytes"] > 4 * 2**20 for r in invalid)  # the padding crossed too


@pytest.mark.parametrize(
    ("algorithm", "message_type", "corruption"),
    [
        ("fediod", "train", "missing metric"),
        ("fediod", "query.generate", "wrong shape"),
        ("fediod", "query.backprop", "wrong dtype"),
        ("fediod", "evaluate.student", "missing metric"),
        ("fedmdcg", "train", "missing array"),
        ("feddf", "train", "wrong shape"),
        ("standalone", "evaluate", "missing metric"),
    ],
)
def test_every_algorithm_drops_invalid_replies_the_same_way(
    tmp_path, misbehaving, algorithm, message_type, corruption
):
    misbehaving(corruption, message_type)
    changes = {"model": "lenet-fedmdcg", "local_steps": 2} if algorithm == "fedmdcg" else {}
    summary = run_suite(_config(algorithm, **changes), tmp_path, progress=False)[0]
    assert "invalid reply" in summary["dropped_clients"][str(BAD_CLIENT)]


def test_too_few_valid_replies_stop_the_run_with_one_line(tmp_path, misbehaving, capsys):
    misbehaving("wrong shape", "train")
    argv = ["run", "--algorithm", "fedavg", "--clients", "3", "--rounds", "2", "--model", "mlp", "--quiet"]
    code = main([*argv, "--set", "min_clients=3", "--out", str(tmp_path), "--name", "r"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith("fedistill: run stopped: ")
    assert f"client {BAD_CLIENT}: invalid reply" in err and "expected" in err


def _bad_client_replaces(monkeypatch, kind: str, replace) -> None:
    """Client BAD_CLIENT's replies carry `replace(reply)` as their arrays of `kind` (unchanged where it
    gives None)."""
    original = InProcessFleet.__init__

    def init(self, clients, ledger, **kwargs):
        original(self, clients, ledger, **kwargs)
        honest = self._clients[BAD_CLIENT].handle

        def handle(message: Message) -> Message:
            reply = honest(message)
            replaced = replace(reply)
            if replaced is None:
                return reply
            arrays = {k: {n: reply.array(k, n) for n in v} for k, v in reply.arrays.items()}
            return _rebuilt(reply, arrays=arrays | {kind: replaced})

        self._clients[BAD_CLIENT].handle = handle

    monkeypatch.setattr(InProcessFleet, "__init__", init)


@pytest.mark.parametrize(
    ("message_type", "kind", "changes"),
    [
        ("query.generate", "discriminator-outputs", {}),  # Eq. 8's density ratios
        ("query.student", "discriminator-outputs", {}),
        ("train", "label-statistics", {"plausibility_checks": False}),  # class counts, no screen
    ],
)
def test_a_negative_ratio_or_count_is_invalid_not_the_end_of_the_run(
    tmp_path, monkeypatch, message_type, kind, changes
):
    """A density ratio or class count below 0 is no site's honest output, and the ensemble's weighting
    refuses it: the reply is invalid, the run goes on with the other sites."""

    def negated(reply: Message) -> dict | None:
        if reply.type != message_type or kind not in reply.arrays:
            return None
        return {n: np.full(a.shape, -1, a.dtype) for n, a in reply.arrays[kind].items()}

    _bad_client_replaces(monkeypatch, kind, negated)
    fediod = {**TINY_FEDIOD["fediod"], "ensemble_weighting": "eq8", **changes}
    summary = run_suite(_config("fediod", fediod=fediod), tmp_path, progress=False)[0]
    reason = summary["dropped_clients"][str(BAD_CLIENT)]
    assert "invalid reply" in reason and f"{kind}/" in reason and "negative value (-1)" in reason
    assert summary["test_accuracy"] is not None
    invalid = [r for r in read_ledger(tmp_path / "fediod" / "ledger.jsonl") if r["status"] == "invalid"]
    assert invalid and {r["client"] for r in invalid} == {BAD_CLIENT}
    assert all(r["bytes"] > 0 for r in invalid)  # the refused reply's bytes crossed the boundary


@pytest.mark.parametrize(
    ("algorithm", "changes"),
    [
        ("fedmdcg", {"model": "lenet-fedmdcg", "fedmdcg": {"server_steps": 2}}),
        ("fedgen", {"fedgen": {"generator_steps": 2}}),
        ("fedcg", {"model": "lenet-fedmdcg", "fedcg": {"aggregation": "distill", "distill_steps": 2}}),
    ],
)
def test_negative_class_counts_of_the_generator_methods_are_invalid_replies(
    tmp_path, monkeypatch, algorithm, changes
):
    """FedMD-CG, FedGen and FedCG weigh and sample by the uploaded class counts: a negative count is an
    invalid reply that drops its client, not an error that stops the server."""

    def negative_first_count(reply: Message) -> dict | None:
        if "label-statistics" not in reply.arrays:
            return None
        counts = reply.array("label-statistics", "class_counts").copy()
        counts[0] = -5
        return {"class_counts": counts}

    _bad_client_replaces(monkeypatch, "label-statistics", negative_first_count)
    config = _config(algorithm, rounds=1, local_steps=2, **changes)  # round 1 already uses the counts
    summary = run_suite(config, tmp_path, progress=False)[0]
    reason = summary["dropped_clients"][str(BAD_CLIENT)]
    assert "invalid reply" in reason and "label-statistics/class_counts" in reason
    assert "negative value (-5)" in reason
