"""The fault battery's case table is well formed, and its cheapest cases hold end to end: a mistake the
command line must answer with exit 2 and one line (a regression to a traceback fails here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fault_battery
from fault_cases import CASES
from fault_harness import Observed, message_lines

FAMILIES = {"config", "data", "run directory", "interruption", "stop", "cache", "disk", "predict/export"}


def test_the_case_table_is_well_formed():
    names = [case.name for case in CASES]
    assert len(names) == len(set(names)), "case names must be unique"
    assert 40 <= len(CASES) <= 60
    assert {case.family for case in CASES} == FAMILIES
    for case in CASES:
        assert case.does and callable(case.run), case.name
        assert case.promise.exit_code in (0, 1, 2, 130), case.name
        assert case.promise.text().startswith(f"exit {case.promise.exit_code}"), case.name
        if case.promise.exit_code in (1, 2, 130):  # a failure says what happened and what to do
            assert case.promise.words and case.promise.lines, case.name


def test_log_records_and_warnings_are_not_the_message():
    stderr = (
        "WARNING fedistill.engine.resume: r/fedavg: resuming from round_00002\n"
        "INFO fedistill: resumed fedavg from round 2\n"
        "/x/y.py:3: UserWarning: something\n  warnings.warn(x)\n"
        "50%|#####  \r100%|##########\n"
        "fedistill: error: lr must be a finite number, got inf\n"
    )
    assert message_lines(stderr) == ["fedistill: error: lr must be a finite number, got inf"]


def test_a_verdict_names_what_differs():
    case = next(c for c in CASES if c.name == "unknown-algorithm")
    assert fault_battery.differences(case, Observed(2, "fedistill: error: did you mean 'fedavg'?\n")) == []
    found = fault_battery.differences(
        case, Observed(1, "Traceback (most recent call last):\n  x\nKeyError\n")
    )
    assert "exit 1, promised 2" in found and "a traceback" in found and "3 stderr lines, promised 1" in found


@pytest.mark.parametrize("name", ["unknown-algorithm", "lr-infinite"])
def test_a_config_mistake_runs_as_promised(tmp_path, name):
    case = next(c for c in CASES if c.name == name)
    row = fault_battery.run_case(case, tmp_path)
    assert row["verdict"] == fault_battery.AS_PROMISED, row
    assert row["exit_code"] == 2 and row["stderr_lines"] == 1 and not row["traceback"]
    assert row["message"].startswith("fedistill: error: ")
