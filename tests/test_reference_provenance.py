"""What a results page says produced a result file: its commands, commit and machines, read from the JSON."""

from __future__ import annotations

import json

from fedistill.reference.provenance import provenance


def test_two_machines_stay_two_on_the_page(tmp_path):
    """A machine line holds commas itself (`CPU, 2 CPUs, AVX512 kernels`): two of them joined by a comma read
    as one long machine; they are joined as `machine.joined` joins them, by a semicolon."""
    a = "Intel(R) Xeon(R) Processor, 2 CPUs, AVX512 kernels"
    b = "AMD EPYC 9B14, 4 CPUs, AVX2 kernels"
    path = tmp_path / "result.json"
    rows = [{"machine": a, "commit": "abc1234"}, {"machine": b, "commit": "abc1234"}, {"machine": a}]
    path.write_text(json.dumps({"command": "python x.py", "rows": rows}), encoding="utf-8")
    found = provenance(path)
    assert found.machine == f"{a}; {b}"
    assert found.commands == ("python x.py",) and found.commit == "`abc1234`"


def test_the_headline_bolds_every_method_that_shows_the_best_number(tmp_path):
    """The best cell was picked before rounding: 85.431% and 85.429% both read 85.43, and only one was bold,
    as if it had won."""
    from fedistill.reference.headline import SOURCES, headline_markdown

    rows = {
        "fedavg-oneshot": {"test_accuracy": 0.60, "parameters_up": 10},
        "coboosting (kd_steps 200)": {"test_accuracy": 0.85431, "parameters_up": 10},
        "fediod-stable": {"test_accuracy": 0.85429, "parameters_up": 0},
    }
    for _, relative in SOURCES:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"command": "python x.py", "cells": [{"alpha": 0.1, "rows": rows}]}))
    lines = headline_markdown(tmp_path).splitlines()
    coboosting = next(line for line in lines if line.startswith("| Co-Boosting"))
    fediod = next(line for line in lines if line.startswith("| **FedIOD**"))
    assert coboosting.count("**85.43**") == 2 and fediod.count("**85.43**") == 2
    assert "| 60.00 |" in next(line for line in lines if line.startswith("| one-shot FedAvg"))


def test_a_method_missing_from_every_result_file_is_not_said_to_never_upload(tmp_path):
    """The 'uploads models' column read 'never' for a method no result file holds: no row, and yet a claim."""
    from fedistill.reference.headline import SOURCES, headline_markdown

    rows = {
        "fedavg-oneshot": {"test_accuracy": 0.6, "parameters_up": 10},
        "fediod-stable": {"test_accuracy": 0.7},
    }
    for _, relative in SOURCES:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"command": "python x.py", "cells": [{"alpha": 1, "rows": rows}]}))
    lines = headline_markdown(tmp_path).splitlines()
    assert next(line for line in lines if line.startswith("| DENSE")) == "| DENSE | - | - | - |"
    assert next(line for line in lines if line.startswith("| **FedIOD**")).endswith("| **never** |")
    assert next(line for line in lines if line.startswith("| one-shot FedAvg")).endswith("| yes, once |")


def test_a_results_section_names_every_command_its_files_record(tmp_path):
    """The page dropped the Markdown's `Command:` line for the provenance list, which read only the JSON's
    `command`: a file recording its command in the Markdown alone read 'not recorded', and a JSON listing
    thirteen `commands` showed one."""
    from fedistill.reference.results import RESULTS, twin_section

    folder = tmp_path / RESULTS
    folder.mkdir(parents=True)
    (folder / "only_md.json").write_text(json.dumps({"rows": []}))
    (folder / "only_md.md").write_text(
        "# A table\n\nCommand: `python a.py --seed 0`\n\n| x |\n|---|\n| 1 |\n"
    )
    section = twin_section("only_md", tmp_path)
    assert "- Command: `python a.py --seed 0`" in section and "not recorded" not in section
    (folder / "many.json").write_text(
        json.dumps({"command": "python b.py", "commands": ["python b.py", "c"]})
    )
    (folder / "many.md").write_text("# Many\n\n| x |\n|---|\n")
    assert "- Commands: `python b.py`; `c`" in twin_section("many", tmp_path)
