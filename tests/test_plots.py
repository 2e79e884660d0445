"""What the learning-curve figure shows a reader: every run named, even one with no values to draw."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedistill import plots


@pytest.fixture
def figures(monkeypatch):
    """The figures `plots` would save, kept in memory instead."""
    kept = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: kept.append(fig) or Path(path))
    return kept


def _legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_a_run_without_the_metric_is_named_in_the_legend_not_dropped(tmp_path, figures):
    """A suite where one method never logged the metric (it failed, or its task reports another) must say
    so: a curve that is silently missing reads as if the method was never run."""
    curves = {
        "fedavg": [{"round": r, "test_accuracy": 0.5 + 0.1 * r} for r in (1, 2)],
        "fediod": [{"round": 1, "loss": 1.0}],
    }
    plots.plot_learning_curves(curves, tmp_path / "c.png", metrics=("test_accuracy",))
    (ax,) = figures[0].axes
    assert _legend(ax) == ["fedavg", "fediod (no test_accuracy values)"]
    assert len([line for line in ax.get_lines() if len(line.get_xdata())]) == 1
