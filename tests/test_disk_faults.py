"""Disk faults end in one line, never a traceback: a full disk during a checkpoint (exit 1, the file
named, no temporary left, `--resume` ends like an uninterrupted run), a run folder `--resume` cannot
write (exit 2), and a Ctrl-C announced once."""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

import pytest
import safetensors.torch
from safetensors import SafetensorError

from fedistill import disk, interrupt
from fedistill.cli import main
from fedistill.engine.rundir import read_jsonl

FAST = ["--algorithm", "fedavg", "--clients", "2", "--rounds", "3", "--model", "mlp", "--quiet"]
#: What safetensors raises when the disk fills up under it (its own error, not an OSError).
FULL = {
    "oserror": lambda: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
    "safetensors": lambda: SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"
    ),
}


def _run(out: Path, *extra: str) -> list[str]:
    return ["run", *FAST, "--out", str(out), *extra]


def _stderr_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _final_rows(run: Path) -> list[dict]:
    rows = read_jsonl(run / "fedavg" / "metrics.jsonl")
    return [{k: v for k, v in row.items() if k != "round_time_s"} for row in rows]


def _leftovers(folder: Path) -> list[Path]:
    """Temporaries a write left behind: `.round_*` folders and hidden `*.tmp` files."""
    return [p for p in folder.rglob(".*") if p.name.startswith(".round_") or p.name.endswith(".tmp")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[dict]:
    """One uninterrupted run: the metrics a run resumed after a full disk must end with."""
    out = tmp_path_factory.mktemp("reference")
    assert main(_run(out, "--name", "ref")) == 0
    return _final_rows(out / "ref")


# --- fedistill.disk ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fault", sorted(FULL))
def test_a_failed_write_leaves_the_old_file_no_temporary_and_one_oserror(tmp_path, fault):
    target = tmp_path / "summary.md"
    disk.write_text(target, "old")

    def fill_up(tmp: Path) -> None:
        tmp.write_text("half a fi", encoding="utf-8")
        raise FULL[fault]()

    with pytest.raises(OSError) as caught:
        disk.write_atomic(target, fill_up)
    assert caught.value.filename == target
    assert caught.value.strerror == "No space left on device"
    assert caught.value.errno == errno.ENOSPC
    assert target.read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.md"]


def test_save_tensors_writes_what_safetensors_reads(tmp_path):
    import torch

    path = tmp_path / "m.safetensors"
    disk.save_tensors({"w": torch.arange(6.0).reshape(2, 3)}, path, {"algorithm": "fedavg"})
    with safetensors.safe_open(str(path), framework="pt") as handle:
        assert handle.metadata() == {"algorithm": "fedavg"}
        assert handle.get_tensor("w").tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


# --- a full disk through the command line -------------------------------------------------------------
@pytest.mark.parametrize("fault", sorted(FULL))
def test_a_full_disk_at_a_checkpoint_is_one_line_and_resume_ends_the_same(
    tmp_path, capsys, monkeypatch, reference, fault
):
    real_save = safetensors.torch.save_file

    def full_at_round_2(tensors, filename, metadata=None):
        if ".round_00002" in str(filename):
            Path(filename).write_bytes(b"\0" * 16)  # a partly written file, as a full disk leaves one
            raise FULL[fault]()
        return real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", full_at_round_2)
    run = tmp_path / "r"
    assert main(_run(tmp_path, "--name", "r")) == 1
    line = _stderr_line(capsys)
    assert line.startswith("fedistill: run stopped: cannot write ")
    assert str(run / "fedavg" / "checkpoints" / "round_00002") in line and ".safetensors" in line
    assert "No space left on device" in line and line.endswith(f"continue with --resume {run}")
    assert _leftovers(run) == []
    assert (run / "fedavg" / "checkpoints" / "latest").read_text() == "round_00001"

    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    stale = run / "fedavg" / "checkpoints" / ".round_00002-killed"  # what a kill -9 mid-write leaves
    stale.mkdir()
    (stale / "runner.json").write_text("{")
    assert main(["run", "--resume", str(run), "--quiet"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert _leftovers(run) == []
    assert _final_rows(run) == reference


# --- a run folder --resume cannot write ---------------------------------------------------------------
@pytest.fixture
def finished_run(tmp_path) -> Path:
    assert main(_run(tmp_path, "--name", "r")) == 0
    return tmp_path / "r"


def test_resume_of_a_read_only_run_is_one_line_and_exit_2(finished_run, capsys):
    capsys.readouterr()
    folders = [finished_run, *(p for p in finished_run.rglob("*") if p.is_dir())]
    for folder in folders:
        folder.chmod(0o555)
    try:
        if os.access(finished_run, os.W_OK):
            pytest.skip("this user writes into read-only folders (root)")
        assert main(["run", "--resume", str(finished_run), "--quiet"]) == 2
        line = _stderr_line(capsys)
    finally:
        for folder in folders:
            folder.chmod(0o755)
    assert line.startswith(f"fedistill: error: cannot resume {finished_run}: ")
    assert "make it writable" in line


def test_resume_on_a_read_only_file_system_is_one_line_and_exit_2(finished_run, capsys, monkeypatch):
    """The same refusal where a mount is read-only, which chmod cannot show when running as root."""
    from conftest import read_only_below

    read_only_below(monkeypatch, finished_run)
    capsys.readouterr()
    assert main(["run", "--resume", str(finished_run), "--quiet"]) == 2
    line = _stderr_line(capsys)
    assert line.startswith(f"fedistill: error: cannot resume {finished_run}: ")
    assert "Read-only file system" in line and "make it writable" in line


# --- Ctrl-C ---------------------------------------------------------------------------------------------
def _sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # the handler runs on the main thread between bytecodes


def test_ctrl_c_is_announced_once(capsys):
    original = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever ours
    try:
        with interrupt.deferred_to_run_loop(), interrupt.deferred_to_run_loop():  # nested: one handler
            _sigint()
            assert interrupt.request_stop() is True  # another caller asking again says nothing
            with pytest.raises(KeyboardInterrupt):
                interrupt.check()
        interrupt.check()  # the request ends with the outermost body
    finally:
        signal.signal(signal.SIGINT, original)
    assert capsys.readouterr().err.count("stopping after this step") == 1


def test_sigterm_where_the_command_line_takes_it_asks_a_flower_run_loop_to_stop(capsys):
    """A scheduler's SIGTERM is the first Ctrl-C for the run loop, even in a background job whose Ctrl-C
    is ignored; the command line's handler goes when its command ends."""
    original = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupt.sigterm_as_interrupt(), interrupt.deferred_to_run_loop():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            with pytest.raises(KeyboardInterrupt):
                interrupt.check()
            assert interrupt.terminated()
    finally:
        signal.signal(signal.SIGINT, original)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert "fedistill: stopping after this step (SIGTERM" in capsys.readouterr().err


def test_a_library_call_leaves_sigterm_to_its_program():
    """`fedistill.run()` called from a program: a Flower simulation defers Ctrl-C, never SIGTERM."""
    with interrupt.deferred_to_run_loop():
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert not interrupt.takes_sigterm()


def test_a_full_disk_at_the_summary_leaves_a_run_resume_finishes(tmp_path, capsys, monkeypatch):
    """summary.json marks a finished run (a resume keeps it): a disk that filled up before summary.md was
    written left a summary.json alone, and `--resume`, which the message advised, never wrote summary.md."""
    real_write = disk.write_text

    def full_at_summary_md(path, text):
        if Path(path).name == "summary.md":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_write(path, text)

    monkeypatch.setattr(disk, "write_text", full_at_summary_md)
    run = tmp_path / "r"
    assert main(_run(tmp_path, "--name", "r")) == 1
    assert _stderr_line(capsys).endswith(f"continue with --resume {run}")
    monkeypatch.setattr(disk, "write_text", real_write)
    assert main(["run", "--resume", str(run), "--quiet"]) == 0
    assert (run / "fedavg" / "summary.md").is_file() and (run / "fedavg" / "summary.json").is_file()
    assert "# fedavg on digits" in (run / "fedavg" / "summary.md").read_text()


def test_a_sigint_handler_installed_outside_python_does_not_break_the_end_of_a_run(monkeypatch):
    """signal.signal returns None for a handler not installed from Python (an embedding host's); putting
    that None back raised TypeError when the run was over, in place of its result."""
    real = signal.signal
    original = real(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever ours
    put: list[object] = []

    def from_outside_python(signum, handler):
        put.append(handler)
        previous = real(signum, handler)
        return None if len(put) == 1 else previous

    monkeypatch.setattr(signal, "signal", from_outside_python)
    try:
        with interrupt.deferred_to_run_loop():
            pass
        assert put[-1] is signal.default_int_handler  # Ctrl-C raises KeyboardInterrupt again afterwards
    finally:
        real(signal.SIGINT, original)


def test_a_run_started_with_ctrl_c_ignored_keeps_ignoring_it(capsys):
    """A job a non-interactive shell starts in the background (`fedistill run ... &` in a script) inherits
    SIGINT ignored, so the Ctrl-C that stops the script leaves the job running; the run put its own
    handler in place of that and stopped."""
    original = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupt.deferred_to_run_loop():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            _sigint()
            interrupt.check()  # nothing was asked
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, original)
    assert "stopping" not in capsys.readouterr().err
