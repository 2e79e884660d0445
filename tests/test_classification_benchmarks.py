"""benchmarks/fediod_classification.py and feddf_classification.py: a run that fails (one already in the
folder without --reuse, a dataset missing) stops the script with one line naming the run and the way on,
after `fedistill run`'s own message, not with a subprocess traceback."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import feddf_classification
import fediod_classification


def refused(command: list[str], check: bool = False) -> None:
    raise subprocess.CalledProcessError(2, command)


def test_fediod_classification_stops_with_one_line(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(fediod_classification.subprocess, "run", refused)
    with pytest.raises(SystemExit, match=r"'cell' failed with exit code 2.*--reuse"):
        fediod_classification.fedistill(["--name", "cell"], tmp_path / "cell", reuse=False)


def test_feddf_classification_stops_with_one_line(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(feddf_classification.subprocess, "run", refused)
    args = argparse.Namespace(out=str(tmp_path), reuse=False)
    with pytest.raises(SystemExit, match=r"'cell' failed with exit code 2.*--reuse"):
        feddf_classification.run(args, "cell", "fedavg", [], [])
