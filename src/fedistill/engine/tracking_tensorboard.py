"""TensorBoard: event files under `<run>/<algorithm>/tensorboard/`, step = round.

Each start opens a new event file with `purge_step` at the first round it runs, so TensorBoard hides what an
interrupted run logged after its last checkpoint and shows every round once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedistill.config import RunConfig
from fedistill.engine.summary import results_markdown
from fedistill.engine.tracking_values import (
    Communication,
    artifacts,
    communication_scalars,
    config_markdown,
    final_scalars,
    history,
    resumed_round,
    row_scalars,
)
from fedistill.errors import ConfigError


class TensorBoardTracker:
    """Writes scalars per round, then the final metrics, results table, plots and model card."""

    def __init__(self) -> None:
        """ConfigError when TensorBoard is missing: made before the run writes anything (validate_setup)."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "track = tensorboard needs TensorBoard: pip install -e '.[track]' (or fedistill[track])"
            ) from None
        self.summary_writer = SummaryWriter
        self.writer: Any = None
        self.step = 0

    def start(self, config: RunConfig, run_dir: Path, *, resume: bool = False) -> None:
        """Open the run's tensorboard/ log, purging the steps a resumed run will write again; the config is
        logged on a fresh start."""
        self.step = resumed_round(run_dir)
        # from the first round this process runs: a fresh start (0) also hides a run that died before
        # its first checkpoint
        purge = self.step + 1 if self.step else 0
        fresh = not any((run_dir / "tensorboard").glob("events.out.tfevents.*"))  # `track` added on resume
        self.writer = self.summary_writer(log_dir=str(run_dir / "tensorboard"), purge_step=purge)
        if fresh or not self.step:
            self.writer.add_text("config", config_markdown(config), 0)
        if fresh and self.step:  # the rounds before the checkpoint, which no earlier start logged here
            for row, communication in history(run_dir):
                self.log_round(row, communication)
        self.writer.flush()

    def log_round(self, row: dict[str, Any], communication: Communication) -> None:
        """Log the round's metrics and traffic as scalars, flushed at once."""
        self.step = int(row["round"])
        scalars = row_scalars(row) | communication_scalars(communication)
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, self.step)
        self.writer.flush()  # a live TensorBoard sees the round now, and a crash loses nothing

    def finish(self, summary: dict[str, Any], run_dir: Path) -> None:
        """Log the final metrics, the results table, the plots and the text files of the run, then close the
        log."""
        for tag, value in final_scalars(summary).items():
            self.writer.add_scalar(tag, value, self.step)
        self.writer.add_text("results", results_markdown([summary]), self.step)
        for folder, paths in artifacts(run_dir).items():
            for path in paths:
                tag = path.stem if folder == "plots" else f"{folder}/{path.name}"
                if path.suffix == ".png":
                    self.writer.add_image(tag, _pixels(path), self.step, dataformats="HWC")
                else:
                    self.writer.add_text(tag, _as_markdown(path), self.step)
        self.writer.close()

    def abort(self) -> None:
        """Close the log, keeping what was written."""
        if self.writer is not None:
            self.writer.close()


def _pixels(path: Path) -> np.ndarray:
    from PIL import Image  # matplotlib's own dependency

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def _as_markdown(path: Path) -> str:
    """Markdown as it is; anything else (a model card's JSON) as a code block."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".md":
        return text
    return "\n".join("    " + line for line in text.splitlines())
