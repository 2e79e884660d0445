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
