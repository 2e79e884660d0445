"""FedIOD's sites send Eq. 8's density ratios only when the server's ensemble weighting uses them: a
uniform ensemble costs no `discriminator-outputs` bytes on the way up."""

import copy

import pytest

from algorithm_helpers import TINY_FEDIOD
from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import run_suite
from fedistill.federation.ledger import UP, read_ledger


def _up_ratio_bytes(tmp_path, weighting: str) -> tuple[dict, dict[str, int]]:
    """The run's summary, and the `discriminator-outputs` bytes its sites sent, per message type."""
    layer = copy.deepcopy(TINY_FEDIOD)
    layer["rounds"] = 1
    layer["fediod"]["ensemble_weighting"] = weighting
    config = build_config(RunConfig(), layer, {"algorithm": "fediod"})
    summary = run_suite(config, tmp_path / weighting, progress=False)[0]
    sent: dict[str, int] = {}
    for record in read_ledger(tmp_path / weighting / "fediod" / "ledger.jsonl"):
        if record["direction"] == UP and record["status"] == "ok":
            size = record["kinds"].get("discriminator-outputs", 0)
            sent[record["type"]] = sent.get(record["type"], 0) + size
    return summary, sent


@pytest.mark.parametrize("weighting", ["eq8", "uniform"])
def test_density_ratios_travel_only_when_the_ensemble_uses_them(tmp_path, weighting):
    summary, sent = _up_ratio_bytes(tmp_path, weighting)
    per_kind = summary["communication"][UP]["per_kind"]
    if weighting == "eq8":
        # G's batch and the S-step batch (carried in query.generate, the epoch's last in query.student)
        assert sent["query.generate"] > 0 and sent["query.student"] > 0
        assert per_kind["discriminator-outputs"] == sum(sent.values())
    else:
        assert sum(sent.values()) == 0
        assert "discriminator-outputs" not in per_kind
    assert {"query.generate", "query.student"} <= set(sent)  # both exchanges took place either way
    assert 0.0 <= summary["test_accuracy"] <= 1.0
