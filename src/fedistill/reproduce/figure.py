"""table.png: a dot plot per column, one line per row: ours (mean, with the std over seeds as a bar), the
number it is checked against with its tolerance as a band, and the paper's number; a row with no number
of ours says "no result".

Built on matplotlib's `Figure` and Agg canvas, never `pyplot` (as `fedistill.plots`): no display and no
global state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedistill import disk
from fedistill.reproduce.target_spec import Column
from fedistill.reproduce.verdict import FAILING, NO_RESULT, Check

DPI = 110


def plot_checks(cells: Sequence[Check], columns: Sequence[Column], path: Path, *, title: str) -> Path:
    """One panel per column that has a cell; returns the PNG's path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.transforms import blended_transform_factory

    shown = [c for c in columns if any(cell.column == c.key for cell in cells)] or list(columns[:1])
    rows = list(dict.fromkeys(cell.row for cell in cells)) or ["(no rows)"]
    fig = Figure(figsize=(3.6 * len(shown) + 3.0, 0.32 * len(rows) + 1.4), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(shown), sharey=True, squeeze=False)[0]
    for ax, column in zip(axes, shown, strict=True):
        for cell in (c for c in cells if c.column == column.key):
            y = rows.index(cell.row)
            if cell.reference is not None and cell.tolerance is not None:
                ax.plot([cell.reference - cell.tolerance, cell.reference + cell.tolerance], [y, y],
                        color="0.8", linewidth=7, solid_capstyle="butt", zorder=1)  # fmt: skip
            if cell.paper is not None:
                ax.plot(cell.paper, y, marker="x", color="black", zorder=3, linestyle="none")
            if cell.mean is not None:
                colour = "tab:red" if cell.verdict in FAILING else "tab:blue"
                ax.errorbar(cell.mean, y, xerr=cell.std or 0.0, fmt="o", color=colour, zorder=4)
            else:  # no dot to draw: say so on the row, or a failed run reads as a drawing quirk
                ax.text(0.01, y, NO_RESULT, transform=blended_transform_factory(ax.transAxes, ax.transData),
                        color="tab:red", fontsize=8, va="center", zorder=5)  # fmt: skip
        ax.set_title(column.label, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(labelsize=8)
    axes[0].set_yticks(range(len(rows)), rows, fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle(
        f"{title}: ours (dot; red: outside), paper (x), checked number ± tolerance (band)", fontsize=9
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    disk.write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=DPI))
    return path
