"""benchmarks/kernel_paths.py: one segmentation command through three kernel paths, each under its own
environment and folders, and a record of each method's numbers per path with their spread."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import kernel_paths

DICE = {"": 0.76, "avx2": 0.7957, "default": 0.70}  # by ATEN_CPU_CAPABILITY, as a run would score


def _fake_tables(command, env, check):
    """segmentation_tables.py as far as this script sees it: a Table 2 record in --results."""
    results = Path(command[command.index("--results") + 1])
    results.mkdir(parents=True, exist_ok=True)
    kernels = env.get("ATEN_CPU_CAPABILITY", "")
    assert env.get("ONEDNN_MAX_CPU_ISA", "") == {"": "", "avx2": "AVX2", "default": "SSE41"}[kernels]
    site = {"dice": DICE[kernels], "hd95": 9.0, "real_dice_patient1": 0.4}
    rows = {"centralized": {"sites": [site], "machine": f"Some CPU, 2 CPUs, {kernels or 'AVX512'} kernels"}}
    (results / "segmentation_table2.json").write_text(json.dumps({"rows": rows}))
    assert not check  # the script reads the exit code itself, to stop with one line
    return subprocess.CompletedProcess(command, 0)


def test_each_path_runs_under_its_kernels_and_the_record_shows_the_spread(tmp_path, monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # run under a lowered path (make test-kernels): native
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # is still what torch picks, the cap not inherited
    seen = []
    monkeypatch.setattr(
        kernel_paths.subprocess, "run", lambda c, env, check: seen.append(c) or _fake_tables(c, env, check)
    )
    argv = ["--name", "t", "--out", str(tmp_path / "runs"), "--results", str(tmp_path), "--reuse", "--",
            "--tables", "2", "--methods", "centralized", "--seed", "0"]  # fmt: skip
    kernel_paths.main(argv)
    assert [Path(c[c.index("--out") + 1]).name for c in seen] == ["native", "avx2", "sse41"]
    assert all(c[-1] == "--reuse" for c in seen)
    text = (tmp_path / "kernel_paths_t.md").read_text()
    assert "| Centralized | Dice % | 76.00 | 79.57 | 70.00 | 9.57 |" in text
    assert "| Centralized | HD95 px | 9.00 | 9.00 | 9.00 | 0.00 |" in text
    assert "- avx2: Some CPU, 2 CPUs, avx2 kernels" in text
    assert str(tmp_path) not in text  # the command without this machine's folders
    record = json.loads((tmp_path / "kernel_paths_t.json").read_text())
    assert record["paths"]["sse41"] == {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--name", "t"], "arguments after --"),
        (["--name", "t", "--", "--tables", "2", "--out", "x"], "--out and --results are this script's"),
        (["--name", "t", "--paths", "avx9", "--", "--tables", "2"], "--paths takes native, avx2, sse41"),
    ],
)
def test_mistakes_are_one_line(argv, says, capsys):
    with pytest.raises(SystemExit) as stop:
        kernel_paths.parse(argv)
    assert stop.value.code == 2 and says in capsys.readouterr().err


def _fake_demos(command, env, check):
    """benchmarks/demos.py as far as this script sees it: a demos record in --results."""
    results = Path(command[command.index("--results") + 1])
    results.mkdir(parents=True, exist_ok=True)
    slower = {"": 1.0, "avx2": 1.2, "default": 3.0}[env.get("ATEN_CPU_CAPABILITY", "")]
    methods = {
        "fediod": {
            "headline": "test_accuracy",
            "final": {"test_accuracy": 0.95 * slower},
            "wall_time_s": 30 * slower,
        },
        "fedavg": {"headline": "test_accuracy", "final": {"test_accuracy": 0.9667}, "wall_time_s": 4.0},
    }
    demos = {
        "digits": {"machine": f"Some CPU, {env.get('ATEN_CPU_CAPABILITY') or 'AVX512'}", "methods": methods}
    }
    (results / "demos.json").write_text(json.dumps({"demos": demos}))
    return subprocess.CompletedProcess(command, 0)


def test_the_demos_through_the_paths_give_each_headline_time_and_time_ratio(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_paths.subprocess, "run", _fake_demos)
    argv = ["--name", "d", "--script", "demos", "--out", str(tmp_path / "runs"), "--results", str(tmp_path),
            "--", "--demos", "digits"]  # fmt: skip
    kernel_paths.main(argv)
    text = (tmp_path / "kernel_paths_d.md").read_text()
    assert text.startswith("# The digits demo through 3 kernel path(s)")
    assert "| fediod | accuracy | 95.00 | 114.00 | 285.00 | 190.00 |" in text
    assert "| fedavg | run s | 4.00 | 4.00 | 4.00 | 0.00 |" in text
    assert "| fediod / fedavg | run time ratio | 7.50 | 9.00 | 22.50 | 15.00 |" in text
    assert "- sse41: Some CPU, default" in text


def test_a_path_whose_run_fails_stops_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(
        kernel_paths.subprocess, "run", lambda c, env, check: subprocess.CompletedProcess(c, 1)
    )
    with pytest.raises(SystemExit, match=r"segmentation_tables\.py failed under the native path"):
        kernel_paths.main(
            ["--name", "t", "--out", str(tmp_path), "--results", str(tmp_path), "--", "--tables", "2"]
        )
