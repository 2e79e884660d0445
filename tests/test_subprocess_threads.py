"""The processes tests start (a `fedistill run`, Flower's apps) do the arithmetic of the runs in the test
process: one torch thread, whatever thread variables the user exported. torch reads MKL_NUM_THREADS after
OMP_NUM_THREADS, so an exported MKL_NUM_THREADS=4 gave a child 4 threads although OMP_NUM_THREADS was 1."""

import os
import subprocess
import sys

from flower_processes import flower_env


def test_every_thread_variable_torch_reads_is_one_for_child_processes(tmp_path):
    assert os.environ["OMP_NUM_THREADS"] == "1"
    assert os.environ["MKL_NUM_THREADS"] == "1"
    env = flower_env(tmp_path, "token")
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"


def test_a_child_process_runs_torch_on_one_thread():
    code = "import torch; print(torch.get_num_threads())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "1"
