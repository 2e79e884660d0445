"""PNG figures for partitions and learning curves.

Figures are built with ``matplotlib.figure.Figure`` and rendered by the Agg canvas, never through
``pyplot``: nothing needs a display, no global backend is switched for the caller, and no figure is left
registered in pyplot's global state. matplotlib is imported inside the functions so that importing this
module stays cheap.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedistill import disk

DPI = 120
_GROUP_KEYS = ("run", "algorithm")


def _new_figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str | Path) -> Path:
    """Render `fig` as PNG in memory, then write it atomically (a full disk leaves no half figure)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=DPI)
    fig.clear()
    disk.write_bytes(path, png.getvalue())
    return path


def _tick_step(n: int, max_labels: int) -> int:
    return max(1, math.ceil(n / max_labels))


def plot_partition(
    counts: np.ndarray,
    path: str | Path,
    *,
    class_names: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Samples per client and class, in the style of FedDF's Figure 2; returns the PNG path.

    Top: stacked bars of client sizes coloured by class. Bottom: one dot per (client, class) with its area
    proportional to the sample count. Tick labels are thinned so that K and C up to ~100 stay readable.
    """
    from matplotlib import colormaps

    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 2:
        raise ValueError(f"counts must have shape (clients, classes), got {counts.shape}")
    k, c = counts.shape
    names = list(class_names) if class_names is not None else [str(i) for i in range(c)]
    if len(names) != c:
        raise ValueError(f"class_names has {len(names)} entries for {c} classes")
    width = min(18.0, max(6.0, 2.5 + 0.14 * k))
    grid_height = min(14.0, max(3.0, 0.16 * c))
    fig = _new_figure(width, grid_height + 2.6)
    bars, dots = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2.0, grid_height]})
    colours = colormaps["tab10" if c <= 10 else "tab20" if c <= 20 else "turbo"].resampled(max(c, 1))
    x = np.arange(k)
    bottom = np.zeros(k)
    for j in range(c):
        bars.bar(x, counts[:, j], bottom=bottom, width=0.85, color=colours(j), linewidth=0)
        bottom += counts[:, j]
    bars.set_ylabel("samples")
    bars.set_title(title or f"{k} clients, {c} classes, {int(counts.sum())} samples")

    clients, classes = np.nonzero(counts)
    # Largest dot spans about one grid cell: the cell size in points is figure inches / cells * 72.
    cell = min(width * 0.8 / max(k, 1), grid_height * 0.8 / max(c, 1)) * 72
    area = counts[clients, classes] / max(int(counts.max()), 1) * cell**2
    dots.scatter(clients, classes, s=area, c=[colours(j) for j in classes], alpha=0.8, linewidths=0)
    dots.set_xlim(-0.6, k - 0.4)
    dots.set_ylim(-0.6, c - 0.4)
    dots.invert_yaxis()
    dots.set_xlabel("client")
    dots.set_ylabel("class")
    x_ticks = np.arange(0, k, _tick_step(k, 40))
    dots.set_xticks(x_ticks, [str(i) for i in x_ticks], fontsize=7 if k > 20 else 9)
    y_ticks = np.arange(0, c, _tick_step(c, 50))
    dots.set_yticks(y_ticks, [names[i] for i in y_ticks], fontsize=7 if c > 20 else 9)
    dots.grid(True, linewidth=0.3, alpha=0.5)
    dots.set_axisbelow(True)
    fig.tight_layout()
    return _save(fig, path)


def _group_rows(
    series: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping[str, Any]]],
) -> dict[str, list[Mapping[str, Any]]]:
    """Label → rows: a mapping is taken as is; a flat list is grouped by its "run"/"algorithm" key."""
    if isinstance(series, Mapping):
        return {str(label): list(rows) for label, rows in series.items()}
    rows = list(series)
    key = next((k for k in _GROUP_KEYS if any(k in row for row in rows)), None)
    if key is None:
        return {"": rows}
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(str(row.get(key, "")), []).append(row)
    return groups


def _points(rows: Sequence[Mapping[str, Any]], x: str, metric: str) -> tuple[list[float], list[float]]:
    """(x, y) pairs of the rows that have both keys with finite numbers, sorted by x."""
    pairs = []
    for row in rows:
        try:
            xv, yv = float(row[x]), float(row[metric])
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(xv) and math.isfinite(yv):
            pairs.append((xv, yv))
    pairs.sort()
    return [p[0] for p in pairs], [p[1] for p in pairs]


#: The unit of a metric's values, by the end of its name; the rest are fractions (accuracy, Dice, SSIM)
#: or plain numbers (losses).
_UNITS = {"psnr": "dB", "hd95": "px", "loss": "", "nmse": ""}
_FRACTIONS = ("accuracy", "dice", "ssim", "sensitivity", "specificity", "aji", "object_dice")


def axis_label(metric: str) -> str:
    """`val_dice` → "val dice (fraction, 1 = perfect)"; `test_psnr` → "test psnr (dB)"."""
    words = metric.replace("_", " ")
    unit = next((u for end, u in _UNITS.items() if metric.endswith(end)), None)
    if unit is None and metric.endswith(_FRACTIONS):
        unit = "fraction, 1 = perfect"
    return f"{words} ({unit})" if unit else words


#: One colour per method in every figure (its own run's, a suite's), whatever order the methods ran in:
#: the most compared methods take the strong tab10 colours (FedAvg, FedIOD and FedDF as the
#: bytes-to-quality and FedDF benchmark figures draw them), the rest the light tab20 ones.
METHOD_COLOURS = {
    "fedavg": "#1f77b4",
    "fediod": "#ff7f0e",
    "centralized": "#2ca02c",
    "feddf": "#d62728",
    "standalone": "#9467bd",
    "fedmdcg": "#8c564b",
    "fedprox": "#e377c2",
    "dense": "#7f7f7f",
    "fedgen": "#bcbd22",
    "fedper": "#17becf",
    "lgfedavg": "#aec7e8",
    "fedavgm": "#ffbb78",
    "feddf-oneshot": "#98df8a",
    "fedavg-oneshot": "#ff9896",
    "coboosting": "#c5b0d5",
    "fedcg": "#c49c94",
    "fedmd": "#f7b6d2",
    "fedkd": "#c7c7c7",
    "asyndgan": "#dbdb8d",
    "flmrcm": "#9edae5",
}


def method_colours(labels: Sequence[str]) -> dict[str, str]:
    """Label → colour: a known method's own colour; any other label (a plugin, a seed) the next colour
    that no label of this figure holds, in tab10 then tab20 order (past 20 labels, colours repeat)."""
    palette = list(dict.fromkeys(METHOD_COLOURS.values()))
    out = {label: METHOD_COLOURS[label] for label in labels if label in METHOD_COLOURS}
    spare = [c for c in palette if c not in out.values()]
    for i, label in enumerate(labels):
        if label not in out:
            out[label] = spare.pop(0) if spare else palette[i % len(palette)]
    return out


def plot_learning_curves(
    series: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping[str, Any]]],
    path: str | Path,
    *,
    metrics: Sequence[str],
    x: str = "round",
    title: str | None = None,
    selected: Mapping[str, Any] | None = None,
) -> Path:
    """One panel per metric (a run's headline, `test_<Task.headline>`, say), one line per run; returns
    the PNG path.

    ``series`` is either a mapping ``label → metric rows`` (to overlay several runs) or a flat list of
    rows, grouped by their ``"run"`` (else ``"algorithm"``) key when present. Rows without ``x`` or the
    metric, or with a non-numeric value, are skipped; a run left with no point is still named in the
    legend ("<run> (no <metric> values)"), so a missing curve never reads as a method not run; a metric
    with no data at all gets an empty, labelled panel.
    ``selected`` maps a label to the ``x`` of the model its run kept (model selection): that point is
    starred, since the run reports it, not the last one.
    """
    from matplotlib.ticker import MaxNLocator

    groups = _group_rows(series)
    metrics = list(metrics)
    if not metrics:
        raise ValueError("metrics must name at least one metric")
    colours = method_colours(list(groups))
    fig = _new_figure(5.0 * len(metrics) + 1.0, 4.0)
    axes = np.atleast_1d(fig.subplots(1, len(metrics), squeeze=False)[0])
    for ax, metric in zip(axes, metrics, strict=True):
        drawn = 0
        missing = []
        whole = True  # every x drawn is a whole number (rounds, epochs): no tick at round 1.25
        for label, rows in groups.items():
            xs, ys = _points(rows, x, metric)
            if not xs:
                missing.append(label)
            else:
                whole = whole and all(v.is_integer() for v in xs)
                marker = "o" if len(xs) <= 30 else None
                line = ax.plot(xs, ys, marker=marker, markersize=3, color=colours[label], label=label or None)
                drawn += 1
                kept = (selected or {}).get(label)
                if kept is not None and float(kept) in xs:
                    at = xs.index(float(kept))
                    star = f"{label} kept ({x} {xs[at]:g})".strip()
                    colour = line[0].get_color()
                    ax.plot([xs[at]], [ys[at]], "*", markersize=12, color=colour, label=star)
        if not drawn:
            ax.text(0.5, 0.5, f"no {metric} values", ha="center", va="center", transform=ax.transAxes)
        else:  # an empty handle: the run is named without a line, after the runs that have one
            for label in (m for m in missing if m):
                ax.plot([], [], linestyle="none", label=f"{label} (no {metric} values)")
        if drawn and whole:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(x)
        ax.set_ylabel(axis_label(metric))
        ax.grid(True, linewidth=0.3, alpha=0.6)
        if drawn and any(groups):
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def plot_image_grid(
    images: np.ndarray,
    path: str | Path,
    *,
    labels: Sequence[str] | None = None,
    columns: int = 8,
    title: str = "",
) -> Path:
    """A grid of images in [0, 1] with shape (N, C, H, W) (C = 1 or 3), e.g. a generator's samples.

    The images are tiled into one mosaic drawn once: one matplotlib axes per image cost about 1 s per
    grid of 32, a third of a digits demo epoch.
    """
    images = np.clip(np.asarray(images, dtype=np.float32), 0.0, 1.0)
    if images.ndim != 4:
        raise ValueError(f"images must have shape (N, C, H, W), got {images.shape}")
    n, channels, height, width = images.shape
    if channels not in (1, 3):
        raise ValueError(f"images must have 1 or 3 channels, got {channels}")
    if n == 0:
        raise ValueError("no image to draw: the grid would be a blank PNG")
    if labels is not None and len(labels) != n:
        raise ValueError(f"got {len(labels)} labels for {n} images")
    columns = max(1, min(columns, n))
    rows = max(1, math.ceil(n / columns))
    gap = max(1, height // 8)
    mosaic = np.ones((rows * (height + gap) - gap, columns * (width + gap) - gap, channels), np.float32)
    origins = [((i // columns) * (height + gap), (i % columns) * (width + gap)) for i in range(n)]
    for image, (top, left) in zip(images, origins, strict=True):
        mosaic[top : top + height, left : left + width] = image.transpose(1, 2, 0)
    fig_width = columns * 1.0
    image_height = fig_width * mosaic.shape[0] / mosaic.shape[1]
    title_room = 0.4 if title else 0.0
    fig = _new_figure(fig_width, image_height + title_room)
    ax = fig.add_axes((0.0, 0.0, 1.0, image_height / (image_height + title_room)))
    ax.imshow(mosaic[..., 0] if channels == 1 else mosaic, cmap="gray", vmin=0.0, vmax=1.0)
    ax.set_axis_off()
    if labels is not None:
        for label, (top, left) in zip(labels, origins, strict=True):
            ax.text(
                left + width / 2,
                top + 1,
                str(label),
                fontsize=7,
                ha="center",
                va="top",
                color="yellow",
                bbox={"facecolor": "black", "alpha": 0.5, "pad": 0.5, "linewidth": 0},
            )
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path)
