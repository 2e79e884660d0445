"""metrics.jsonl stays strict JSON: other tools (jq, a browser, pandas with a strict parser) read it."""

import json
import math

from fedistill.engine.rundir import MetricsWriter


def _strict(line: str) -> dict:
    def refuse(token: str) -> float:
        raise ValueError(f"not JSON: {token}")

    return json.loads(line, parse_constant=refuse)


def test_non_finite_values_become_null_at_any_depth(tmp_path):
    writer = MetricsWriter(tmp_path / "metrics.jsonl")
    writer.write(
        {"round": 1, "loss": math.nan, "per_client": {"0": math.inf, "1": 0.5}, "curve": [1.0, -math.inf]}
    )
    writer.close()
    row = _strict((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row == {"round": 1, "loss": None, "per_client": {"0": None, "1": 0.5}, "curve": [1.0, None]}
