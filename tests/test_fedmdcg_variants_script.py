"""benchmarks/fedmdcg_variants.py --finished-only with no finished run under --out (nor the table's
reference runs) says so in one line and writes nothing, instead of failing inside the plot."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fedmdcg_variants


def test_nothing_finished_is_one_line_and_no_file(tmp_path: Path, monkeypatch, capsys):
    results = tmp_path / "results"
    argv = ["fedmdcg_variants.py", "--omegas", "1", "--variants", "paper", "--finished-only",
            "--out", str(tmp_path / "runs"), "--results", str(results)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit):
        fedmdcg_variants.main()
    assert "no finished run" in capsys.readouterr().err
    assert not results.exists()
