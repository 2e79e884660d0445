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
