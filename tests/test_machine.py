"""Which machine a run's numbers came from: the summary names the CPU and the kernel path torch used, the
records built from runs name them, and a record built from two machines' runs says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from fedistill import machine


def test_the_machine_names_the_cpu_and_the_kernel_path_in_use():
    found = machine.machine()
    assert found["kernels"] == torch.backends.cpu.get_cpu_capability()
    assert found["cpus"] == os.cpu_count() and found["cpu"]
    assert "gpu" not in found  # the tests run on the CPU
    line = machine.describe(found)
    assert line.startswith(found["cpu"]) and f"{found['kernels']} kernels" in line


def test_a_lowered_kernel_path_is_what_the_summary_records():
    """The kernel path a user forces (as `make test-kernels` does) is the one named, with oneDNN's cap."""
    code = "import json; from fedistill.machine import machine; print(json.dumps(machine()))"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    found = json.loads(out.stdout)
    assert found["kernels"] == "DEFAULT" and found["onednn_max_isa"] == "SSE41"
    assert machine.describe(found).endswith("DEFAULT kernels, oneDNN capped at SSE41")


def test_runs_of_two_machines_are_both_named_once_and_old_runs_as_not_recorded():
    a = {"cpu": "AMD EPYC 9B14", "cpus": 2, "kernels": "AVX512"}
    b = {"cpu": "AMD EPYC 9B14", "cpus": 2, "kernels": "AVX2"}
    summaries = [{"machine": a}, {"machine": b}, {"machine": a}, {}]
    assert machine.of_summaries(summaries) == (
        "AMD EPYC 9B14, 2 CPUs, AVX512 kernels; AMD EPYC 9B14, 2 CPUs, AVX2 kernels; not recorded"
    )
    assert machine.of_summaries([]) == machine.NOT_RECORDED
    gpu = machine.describe({**a, "gpu": "NVIDIA H200"})
    assert gpu == "AMD EPYC 9B14, 2 CPUs, AVX512 kernels, NVIDIA H200"


def test_a_run_resumed_on_another_machine_by_other_code_names_both(tmp_path, monkeypatch):
    """The checkpoint carries the machines and the code a run has run on, so a run stopped on one machine
    and resumed on another, by newer code, says so in its log, summary, summary.md and the results table,
    and `fedistill reproduce` does not take it for a run of the newer code alone."""
    import errno
    from pathlib import Path

    import safetensors.torch

    from fedistill.cli import main
    from fedistill.engine import loop
    from fedistill.reproduce.reuse import made_by

    real_save = safetensors.torch.save_file

    def full_at_round_2(tensors, filename, metadata=None):
        if ".round_00002" in str(filename):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", full_at_round_2)
    argv = ["run", "--algorithm", "fedavg", "--model", "small-cnn", "--clients", "3", "--rounds", "2",
            "--device", "cpu", "--out", str(tmp_path), "--name", "r", "--quiet"]  # fmt: skip
    assert main(argv) == 1  # stopped by the full disk after round 1's checkpoint
    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    other = {"cpu": "Other CPU", "cpus": 4, "kernels": "AVX2"}
    monkeypatch.setattr(loop, "machine", lambda: other)
    before = loop.versions()
    monkeypatch.setattr(loop, "versions", lambda: {**before, "code": "0123456789ab"})
    assert main(["run", "--resume", str(tmp_path / "r"), "--quiet"]) == 0
    summary = json.loads(Path(tmp_path / "r" / "fedavg" / "summary.json").read_text())
    both = [machine.describe(machine.machine()), "Other CPU, 4 CPUs, AVX2 kernels"]
    said = (tmp_path / "r" / "fedavg" / "run.log").read_text()
    assert f"fedavg ran on {both[0]} until round 1 and continues with {both[1]}: " in said
    assert f"fedavg ran code {before['code']} until round 1 and continues with 0123456789ab: " in said
    assert summary["code_history"] == [before["code"], "0123456789ab"]
    assert made_by(tmp_path / "r" / "fedavg" / "summary.json") == f"{before['code']}+0123456789ab"
    assert summary["machine"] == other and summary["machine_history"] == both
    assert f"Machine: {both[0]} then {both[1]}" in (tmp_path / "r" / "fedavg" / "summary.md").read_text()
    assert machine.of_summaries([summary]) == f"{both[0]} then {both[1]}"
    assert machine.history_after(both, other) == both  # a second start on the same machine adds nothing
