"""Which of a run's models an algorithm exported, in words: the epoch its model selection kept (FedIOD,
DENSE and AsynDGAN keep the best on the sites' validation splits by default) or the model the last round
left, so a user knows what `load_model` and an export's card hand them before trusting its metrics."""

from __future__ import annotations

from typing import Any


def which_model(summary: dict[str, Any]) -> str:
    """The exported model, from the run's summary.json: "epoch E of R, <how it was selected>" where the
    algorithm selected one, else the last round's (with the reason where the run stopped early)."""
    final = summary.get("final", {})
    planned = summary.get("rounds")
    done = summary.get("rounds_done", planned)
    if final.get("selected_epoch") is not None:
        how = final.get("selection", "selected by the algorithm")
        return f"epoch {final['selected_epoch']} of {done}, {how}"
    stopped = f", stopped early: {summary['stopped']}" if summary.get("stopped") else ""
    return f"the last round's model (round {done} of {planned}{stopped}; no selection across rounds)"
