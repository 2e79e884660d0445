"""SIGTERM during a Flower simulation ends the command at once (`interrupt.sigterm_ends_at_once`): a
scheduler's SIGTERM reaches Ray's processes too, and Ray's driver then exited the process with code 1 on
its own, from C++, before the stop after the step had finished (seen under load)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from fedistill import interrupt

# a run loop whose step never finishes (a client that no longer answers: Ray's workers are gone)
HANGING_STEP = textwrap.dedent(
    """
    import sys, time
    from fedistill import interrupt

    with interrupt.sigterm_as_interrupt(lambda: "fedistill: stopped by SIGTERM; continue with --resume R"):
        with interrupt.deferred_to_run_loop(), interrupt.sigterm_ends_at_once():
            print("ready", flush=True)
            time.sleep(60)
    sys.exit(3)
    """
)


def test_sigterm_ends_a_simulation_at_once_with_its_last_line_and_143() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", HANGING_STEP],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert time.monotonic() - signalled < 10, "the process waited for a step that never ends"
    assert process.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == ["fedistill: stopped by SIGTERM; continue with --resume R"], err


def test_a_library_caller_keeps_its_sigterm_handler_in_a_simulation() -> None:
    """Outside the command line (no `sigterm_as_interrupt`), the context changes nothing."""
    before = signal.getsignal(signal.SIGTERM)
    with interrupt.sigterm_ends_at_once():
        assert signal.getsignal(signal.SIGTERM) is before
        assert not interrupt._at_once.is_set()
