"""FedIOD's Figure 7 at CPU scale: reconstructions and their error maps, one test slice per source.

For each site's test volume (a slice from the middle of its held-out slabs, or `--slice`), the fully
sampled ground truth, the zero-filled input and every method's reconstruction, each over its absolute
error map (`fedistill.metrics.reconstruction.error_map`) on one colour scale per source; each panel
names the slice's SSIM and PSNR with its volume's maximum as the data range (as the table scores volumes).

The models are those the reconstruction table (benchmarks/reconstruction_table.py) trained, found through
its JSON: FedAvg's and FL-MRCM's `models/global.safetensors` (for each source the FL-MRCM run whose
target it is, as Guo et al. report it), FedIOD's `models/student.safetensors`, and, since Standalone and
Centralized export no model (their servers never hold one), their sites' final models from the runs' last
checkpoint (for each source, the model of the site that holds it). Figure 7 of the paper shows FedAvg,
FL-MRCM and FedIOD.

    python benchmarks/reconstruction_figures.py                 # after reconstruction_table.py

Draws the table in <results> (`--table` names another) and writes <results>/reconstruction_figure7.png
(default benchmarks/results/).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedistill.reproduce.arguments import benchmark_parser
from fedistill.reproduce.paths import RESULTS, RUNS, recorded_path
from fedistill.reproduce.reconstruction_plan import STEM
from fedistill.reproduce.reconstruction_scores import Harness, client_states, saved_state

FIGURE = "reconstruction_figure7.png"


# column -> the table row whose models it shows, and how a source picks its model among them
COLUMNS = (
    ("standalone", "Standalone (own site)", "site"),
    ("centralized", "Centralized", "any"),
    ("fedavg", "FedAvg", "any"),
    ("flmrcm", "FL-MRCM (target = site)", "site"),
    ("fediod", "FedIOD", "any"),
)


def parse_args(argv: Sequence[str] | None = None) -> Any:
    """The figure's settings from the command line; the table's JSON must exist."""
    parser = benchmark_parser(__doc__)
    parser.add_argument("--table", default="", help="the table script's JSON (default: the one in --results)")
    parser.add_argument("--slice", type=int, default=None, help="test slice of each source (default: middle)")
    parser.add_argument("--error-max", type=float, default=0.2, help="error colour scale, share of the max")
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--runs", default=str(RUNS / "reconstruction-table"),
                        help="the table's --out: where runs the table names as OUT/... lie")  # fmt: skip
    args = parser.parse_args(argv)
    args.table = args.table or str(Path(args.results) / f"{STEM}.json")  # the table that --results holds
    if not 0 < args.error_max <= 1:
        parser.error(f"--error-max must be in (0, 1], got {args.error_max}")
    if not Path(args.table).is_file():
        parser.error(f"no table JSON at {args.table}: run benchmarks/reconstruction_table.py first")
    return args


def pick(row: dict[str, Any], source: str, how: str) -> dict[str, Any] | None:
    """The model a column shows for `source`: the one of its site, or the row's only one."""
    models = row.get("models") or []
    if how == "site":
        return next((m for m in models if m.get("site") == source), None)
    return models[0] if models else None


def load_model(entry: dict[str, Any], harness: Harness, runs: Path) -> Any:
    """A model from a run's export (`file`) or from its last checkpoint (`checkpoint_client`)."""
    from fedistill.algorithms.shared.training import new_model
    from fedistill.config import read_config

    run_dir = recorded_path(entry["run_dir"], runs).resolve()
    config = read_config(run_dir / "config.toml")
    if "file" in entry:
        state = saved_state(run_dir, Path(entry["file"]).stem)
    else:
        state = client_states(run_dir)[int(entry["checkpoint_client"])]
    model = new_model(config, harness.dataset.info)
    model.load_state_dict(state)
    return model.eval()


def reconstructions(
    table: dict[str, Any], harness: Harness, runs: Path
) -> list[tuple[str, dict[str, np.ndarray]]]:
    """(column title, {source: every test slice's reconstruction (N, H, W)}) for the columns there are; a
    method of the table without a model for some source is left out, with a line on stderr."""
    from torch import nn

    data, task = harness.dataset, harness.task

    def outputs(model: Any, through: Any = task) -> np.ndarray:
        return through.outputs(model, data.test, data.info).clamp(min=0)[:, 0].detach().cpu().numpy()

    rows = {r["method"]: r for r in table["rows"]}
    zero_filled = outputs(nn.Identity(), task.identity_baseline())
    columns = [("Zero-filled", dict.fromkeys(harness.site_names, zero_filled))]
    for method, title, how in COLUMNS:
        if method not in rows:
            continue
        cache: dict[str, np.ndarray] = {}
        per_source = {}
        for source in harness.site_names:
            entry = pick(rows[method], source, how)
            if entry is None:  # a column is every source or none: say which one it lacks
                print(f"{title} left out: no model for {source} in the table", file=sys.stderr)
                break
            key = json.dumps(entry, sort_keys=True)
            if key not in cache:
                cache[key] = outputs(load_model(entry, harness, runs))
            per_source[source] = cache[key]
        if len(per_source) == len(harness.site_names):
            columns.append((title, per_source))
    return columns


def draw(harness: Harness, columns: list[tuple[str, dict[str, np.ndarray]]], args: Any) -> Path:
    """Two rows per source (images, then error maps), one column per method; the figure's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedistill.metrics.reconstruction import error_map, psnr, ssim

    target = harness.dataset.test.x[:, 0].numpy()
    sources = np.asarray(harness.sources)
    names = harness.site_names
    ncols = 1 + len(columns)
    fig, axes = plt.subplots(2 * len(names), ncols, figsize=(1.6 * ncols, 3.4 * len(names)), squeeze=False)
    for i, source in enumerate(names):
        index = np.flatnonzero(sources == source)
        chosen = index[len(index) // 2] if args.slice is None else index[min(args.slice, len(index) - 1)]
        peak = float(target[index].max())  # the volume's maximum: the table's data range
        truth = target[chosen]
        top, bottom = axes[2 * i], axes[2 * i + 1]
        top[0].imshow(truth, cmap="gray", vmin=0, vmax=peak, interpolation="nearest")
        top[0].set_title("Ground truth" if i == 0 else "", fontsize=8)
        top[0].set_ylabel(source, fontsize=9)
        bottom[0].text(
            0.5, 0.5, f"|error|\n0 to {args.error_max:g} x max", ha="center", va="center", fontsize=8
        )
        for j, (title, per_source) in enumerate(columns, start=1):
            image = per_source[source][chosen]
            top[j].imshow(image, cmap="gray", vmin=0, vmax=peak, interpolation="nearest")
            top[j].set_title(title if i == 0 else "", fontsize=8)
            score = f"{ssim(truth, image, peak):.3f} / {psnr(truth, image, peak):.1f} dB"
            top[j].set_xlabel(score, fontsize=7)
            error = error_map(truth, image)
            bottom[j].imshow(
                error, cmap="inferno", vmin=0, vmax=args.error_max * peak, interpolation="nearest"
            )
        for ax in (*top, *bottom):
            ax.set_xticks([])
            ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_visible(False)
    fig.suptitle(
        f"MRI reconstruction at {args.acceleration:g}x, one test slice per site: image (SSIM / PSNR of the "
        "slice) over its |error|",
        fontsize=9,
    )
    fig.tight_layout()
    out = Path(args.results) / FIGURE
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    from PIL import Image

    with Image.open(out) as image:  # gray and one colour map fit a 256-colour palette: a quarter of the bytes
        image.convert("RGB").quantize(256).save(out, optimize=True)
    return out


def main(argv: Sequence[str] | None = None) -> Path:
    """Draw Figure 7 from the table's JSON; the figure's path."""
    args = parse_args(argv)
    table = json.loads(Path(args.table).read_text(encoding="utf-8"))
    args.acceleration = table["settings"]["acceleration"]
    if table["settings"].get("threads"):
        import torch

        torch.set_num_threads(table["settings"]["threads"])
    named = {m["run_dir"] for r in table["rows"] for m in r.get("models") or []}
    missing = sorted(d for d in named if not recorded_path(d, Path(args.runs)).is_dir())
    if missing:  # the table ran with another --out: say so, not a missing config.toml
        raise SystemExit(
            f"reconstruction_figures: {len(missing)} of the table's runs ({missing[0]}, ...) are not under "
            f"--runs {args.runs}; pass the table's --out as --runs"
        )
    first = next((m for r in table["rows"] for m in r.get("models") or []), None)
    if first is None:  # every run failed or exported nothing: no model to draw
        raise SystemExit(
            f"reconstruction_figures: the table {args.table} names no model; run "
            "benchmarks/reconstruction_table.py until its runs finish"
        )
    harness = Harness(recorded_path(first["run_dir"], Path(args.runs)).resolve(), args.data_dir)
    out = draw(harness, reconstructions(table, harness, Path(args.runs)), args)
    print(out)
    return out
