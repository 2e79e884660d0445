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


def _colours(ax) -> dict[str, str]:
    return {line.get_label(): line.get_color() for line in ax.get_lines() if len(line.get_xdata())}


def test_a_method_keeps_its_colour_across_figures(tmp_path, figures):
    """FedAvg in its own run's figure and FedAvg in a suite's figure beside other methods are one colour,
    so a reader matching curves between figures is not misled by the order the methods ran in."""
    rows = [{"round": r, "test_accuracy": 0.1 * r} for r in (1, 2)]
    plots.plot_learning_curves({"fedavg": rows}, tmp_path / "a.png", metrics=("test_accuracy",))
    suite = {"fediod": rows, "standalone": rows, "fedavg": rows, "centralized": rows}
    plots.plot_learning_curves(suite, tmp_path / "b.png", metrics=("test_accuracy",))
    alone, together = _colours(figures[0].axes[0]), _colours(figures[1].axes[0])
    assert alone["fedavg"] == together["fedavg"]
    assert len(set(together.values())) == len(suite)  # still one colour per method
    # names outside the known methods (a plugin, a seed) get colours no known method in the figure uses
    plots.plot_learning_curves(
        {"fedavg": rows, "my-plugin": rows, "seed 1": rows}, tmp_path / "c.png", metrics=("test_accuracy",)
    )
    mixed = _colours(figures[2].axes[0])
    assert mixed["fedavg"] == alone["fedavg"] and len(set(mixed.values())) == 3


def test_rounds_are_ticked_at_whole_numbers(tmp_path, figures):
    """Round 1.25 does not exist: an axis of whole rounds or epochs gets whole-number ticks only."""
    rows = [{"round": r, "test_accuracy": 0.1 * r} for r in (1, 2, 3)]
    plots.plot_learning_curves({"fedavg": rows}, tmp_path / "a.png", metrics=("test_accuracy",))
    ticks = figures[0].axes[0].get_xticks()
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)


@pytest.mark.parametrize(
    ("shape", "labels", "message"),
    [
        ((4, 8, 8), None, r"shape \(N, C, H, W\).*\(4, 8, 8\)"),
        ((4, 2, 8, 8), None, "1 or 3 channels, got 2"),
        ((0, 1, 8, 8), None, "no image"),
        ((2, 1, 8, 8), ["a"], "1 labels for 2 images"),
    ],
)
def test_an_image_grid_of_the_wrong_shape_is_refused_by_name(tmp_path, shape, labels, message):
    """A grid of no image is a blank PNG, a wrong shape ends deep in matplotlib: both say what they got."""
    import numpy as np

    with pytest.raises(ValueError, match=message):
        plots.plot_image_grid(np.zeros(shape), tmp_path / "g.png", labels=labels)
    assert not (tmp_path / "g.png").exists()
