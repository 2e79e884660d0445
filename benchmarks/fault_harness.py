"""What a fault case is and how it meets `fedistill`: a promise, an observed outcome, and a scratch folder
that calls the command line as a subprocess (as a user on a fresh clone would) and holds the tiny
reference runs that the resume cases compare against.

The stderr rule: a user meets one message, so the battery counts the lines of stderr that are left after
dropping blank lines, the package's log records (`DEBUG `, `INFO `, `WARNING ` followed by the logger's
name: the fallback and resume notes are such records), Python's warnings (`file:line: XWarning: ...` and
the source line under it) and progress bars (lines that redraw themselves with a carriage return)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TRACEBACK = "Traceback (most recent call last)"
LOG_RECORD = ("DEBUG ", "INFO ", "WARNING ")
PY_WARNING = re.compile(r":\d+: \w*Warning: ")
#: Seconds one command may take before the battery stops it and records a timeout.
TIMEOUT = 240

TINY = ["--clients", "2", "--model", "mlp", "--local-steps", "2", "--batch-size", "32", "--quiet"]
FEDIOD_TINY = [
    f"fediod.{key}={value}"
    for key, value in {
        "preset": "'paper'",
        "teacher_epochs": 2,
        "iters_per_epoch": 2,
        "synthetic_batch_size": 16,
        "student_steps": 2,
        "generator_width": 8,
        "discriminator_width": 8,
        "latent_dim": 16,
    }.items()
]
#: The smallest runs of each algorithm that still leave two checkpoints (the newest and its fallback).
SETTINGS = {
    "fedavg": ["--algorithm", "fedavg", *TINY, "--rounds", "4"],
    "feddf": ["--algorithm", "feddf", *TINY, "--rounds", "4", "--set", "feddf.steps=10"],
    "standalone": ["--algorithm", "standalone", *TINY, "--rounds", "4"],
    "fediod": [
        "--algorithm",
        "fediod",
        "--clients",
        "3",
        "--model",
        "lenet-fedmdcg",
        "--batch-size",
        "32",
        "--rounds",
        "4",
        "--quiet",
        *(arg for setting in FEDIOD_TINY for arg in ("--set", setting)),
    ],
}


@dataclass(frozen=True)
class Promise:
    """What the documentation promises: the exit code, the stderr lines left by the rule above (None: no
    promise), words stderr must hold, and for resume cases that the run ends as an uninterrupted one."""

    exit_code: int
    lines: int | None = 1
    words: str = ""
    resume_equal: bool | None = None

    def text(self) -> str:
        parts = [f"exit {self.exit_code}"]
        if self.lines is not None:
            parts.append(f"{self.lines} line{'s' * (self.lines != 1)}")
        parts.append("no traceback")
        if self.words:
            parts.append(f"says '{self.words}'")
        if self.resume_equal:
            parts.append("metrics = uninterrupted run")
        return ", ".join(parts)


@dataclass
class Observed:
    """What a case saw: its last command's exit code and stderr, and what it checked besides."""

    exit_code: int | None = None
    stderr: str = ""
    resume_equal: bool | None = None
    checks: dict[str, bool] = field(default_factory=dict)
    not_run: str = ""  # why the case could not be run on this machine

    @property
    def kept(self) -> list[str]:
        return message_lines(self.stderr)

    @property
    def traceback(self) -> bool:
        return TRACEBACK in self.stderr


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    does: str
    promise: Promise
    run: Callable[[Scratch], Observed]


def message_lines(stderr: str) -> list[str]:
    """The lines of `stderr` a user reads as the message (see the module's docstring)."""
    kept, after_warning = [], False
    for line in stderr.split("\n"):
        if "\r" in line:  # a progress bar redrawing itself
            continue
        if after_warning and line.startswith(" "):
            after_warning = False
            continue
        after_warning = bool(PY_WARNING.search(line))
        if line.strip() and not after_warning and not line.startswith(LOG_RECORD):
            kept.append(line)
    return kept


def command() -> list[str]:
    """`fedistill` beside this Python (a checkout's .venv/bin/fedistill), else `python -m fedistill.cli`;
    under `nice -n 5` unless this process is already that nice."""
    script = Path(sys.executable).parent / "fedistill"
    base = [str(script)] if script.is_file() else [sys.executable, "-m", "fedistill.cli"]
    return (["nice", "-n", "5"] if os.nice(0) < 5 and shutil.which("nice") else []) + base


def environment() -> dict[str, str]:
    return {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def without_times(rows: list[dict]) -> list[dict]:
    """Rows without what may differ between equal runs: timings and whether teachers came from a cache."""
    return [
        {k: v for k, v in row.items() if not k.endswith("_s") and k != "teachers_from_cache"} for row in rows
    ]


def final_metrics(algorithm_dir: Path) -> tuple[list[dict], dict] | None:
    """Every metrics row and the summary's final metrics, timings and cache provenance left out."""
    try:
        lines = (algorithm_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        summary = json.loads((algorithm_dir / "summary.json").read_text(encoding="utf-8"))
        return without_times([json.loads(line) for line in lines if line.strip()]), without_times(
            [summary["final"]]
        )[0]
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Scratch:
    """One case's own folder, the command line run inside it, and the shared reference runs."""

    def __init__(self, root: Path, name: str, fresh: bool = True) -> None:
        self.root = root
        self.folder = root / name
        if fresh and self.folder.exists():  # a kept scratch folder run again
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def cli(self, *args: str, timeout: float = TIMEOUT) -> Observed:
        """Run `fedistill ARGS` in the case's folder; its exit code (None on timeout) and stderr."""
        try:
            done = subprocess.run(
                [*command(), *args],
                cwd=self.folder,
                env=environment(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as expired:
            err = expired.stderr.decode() if isinstance(expired.stderr, bytes) else expired.stderr or ""
            return Observed(None, err + f"\n(no answer after {timeout} s)")
        return Observed(done.returncode, done.stderr)

    def start(self, *args: str) -> subprocess.Popen:
        """`fedistill ARGS` started in the background, with Ctrl-C's default action (a parent that ignores
        SIGINT would hand that on across exec)."""
        return subprocess.Popen(
            [*command(), *args],
            cwd=self.folder,
            env=environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )

    def reference(self, algorithm: str) -> Path:
        """The uninterrupted run of SETTINGS[algorithm] (made once, shared by every case)."""
        out = self.root / "_references"
        run = out / algorithm
        if not (run / algorithm / "summary.json").is_file():
            out.mkdir(exist_ok=True)
            done = Scratch(self.root, "_references", fresh=False).cli(
                "run", *SETTINGS[algorithm], "--out", ".", "--name", algorithm
            )
            if done.exit_code != 0:
                raise RuntimeError(f"the reference {algorithm} run failed: {' | '.join(done.kept)[:200]}")
        return run

    def copy_of_reference(self, algorithm: str, name: str = "r") -> Path:
        """A copy of the reference run under `runs/NAME` of the case's folder."""
        target = self.folder / "runs" / name
        shutil.copytree(self.reference(algorithm), target, symlinks=True)
        return target

    def equals_reference(self, run: Path, algorithm: str) -> bool:
        got = final_metrics(run / algorithm)
        return got is not None and got == final_metrics(self.reference(algorithm) / algorithm)


def wait_for(condition: Callable[[], bool], process: subprocess.Popen, seconds: float = TIMEOUT) -> bool:
    """Poll `condition` until it holds (True) or `process` ends or time runs out (False)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        if process.poll() is not None:
            return condition()
        time.sleep(0.01)
    return False


def checkpoint_reached(run: Path, algorithm: str, round_: int) -> Callable[[], bool]:
    """Whether the run's newest checkpoint is `round_` or later."""

    def reached() -> bool:
        try:
            latest = (run / algorithm / "checkpoints" / "latest").read_text().strip()
        except OSError:
            return False
        return latest.startswith("round_") and int(latest[6:]) >= round_

    return reached


def flip_last_byte(path: Path) -> None:
    """Damage that still loads: the last byte lies inside a tensor's values, only a checksum notices."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def shell(s: Scratch, script: str, private: bool) -> Observed:
    """`sh -c SCRIPT` in the case's folder; `private`: in its own user and mount namespace, where mounts
    need no root and end with it (exit 97 when there is none)."""
    if private and not shutil.which("unshare"):
        return Observed(97)
    namespace = ["unshare", "--user", "--map-root-user", "--mount"] if private else []
    done = subprocess.run(
        [*namespace, "sh", "-c", script],
        cwd=s.folder,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    return Observed(done.returncode, done.stderr)


# --- inputs for `fedistill predict` ---------------------------------------------------------------------
def png(folder: Path, name: str = "a.png") -> None:
    from PIL import Image

    Image.new("L", (8, 8), 128).save(folder / name)


def tif5(folder: Path) -> None:
    import numpy as np
    import tifffile

    tifffile.imwrite(folder / "five.tif", np.zeros((8, 8, 5), np.uint8), planarconfig="contig")


def nifti(folder: Path) -> None:
    import nibabel
    import numpy as np

    nibabel.save(nibabel.Nifti1Image(np.ones((8, 8, 3), np.float32), np.eye(4)), folder / "v.nii.gz")


# --- folders the cases damage ----------------------------------------------------------------------------
def idx_images(count: int = 4) -> bytes:
    """An MNIST image file's bytes (magic 2051, count x 28 x 28 zeros)."""
    return (
        (2051).to_bytes(4, "big")
        + b"".join(n.to_bytes(4, "big") for n in (count, 28, 28))
        + bytes(count * 784)
    )


def mnist_folder(s: Scratch, damage: Callable[[bytes], bytes]) -> None:
    """`data/mnist` with the four idx files in their layout, the training images then damaged."""
    from fedistill.data.mnist_like import IDX_NAMES

    folder = s.folder / "data" / "mnist"
    folder.mkdir(parents=True)
    for name in IDX_NAMES:
        labels = (2049).to_bytes(4, "big") + (4).to_bytes(4, "big") + bytes(4)
        (folder / name).write_bytes(gzip.compress(idx_images() if "images" in name else labels))
    first = folder / IDX_NAMES[0]
    first.write_bytes(damage(first.read_bytes()))


def killed_copy(s: Scratch) -> Path:
    """A copy of the reference fedavg run made to look killed after its last round (summary.json gone)."""
    run = s.copy_of_reference("fedavg")
    (run / "fedavg" / "summary.json").unlink()
    return run


def checkpoint(run: Path, round_: int) -> Path:
    return run / "fedavg" / "checkpoints" / f"round_{round_:05d}"


def resumed(s: Scratch, run: Path, algorithm: str = "fedavg") -> Observed:
    """`--resume RUN`: what it said, whether it ended as the reference run, and no temporary left."""
    seen = s.cli("run", "--resume", str(run.relative_to(s.folder)), "--quiet")
    seen.resume_equal = s.equals_reference(run, algorithm)
    seen.checks["no .round_* temporary left"] = not list(run.rglob(".round_*"))
    return seen


def started(s: Scratch, algorithm: str, rounds: str | None = None) -> tuple[Path, subprocess.Popen]:
    """A run of SETTINGS[algorithm] started in the background as `runs/k`."""
    settings = SETTINGS[algorithm] + (["--rounds", rounds] if rounds else [])
    return s.folder / "runs" / "k", s.start("run", *settings, "--out", "runs", "--name", "k")
