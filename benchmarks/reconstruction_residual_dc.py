"""What the reconstruction task's residual, data consistency, output scale and augmentation change, measured
on the reconstruction demo.

One `fedistill run --config configs/demo-reconstruction.toml --set threads=1` per variant (every method
of the demo: FedIOD, Standalone, FedAvg, Centralized), the variants being the task's defaults
(`residual`, `data_consistency` on, `output_scale = "slice"`, random flips and quarter turns) and each
switched off, then all four off (the task as it was). Every
model is scored per test site (SSIM, PSNR per volume, fastMRI's evaluation) beside the zero-filled input
scored through the same task (with its data consistency where the variant applies it): a method that
does not beat its own input on every site is flagged.

    python benchmarks/reconstruction_residual_dc.py [--variants default,no-scale,no-augment,no-dc,no-residual,neither] \\
        [--out benchmarks/runs/reconstruction-residual-dc] [--jobs 1] [--reuse] [--update-docs]

Writes benchmarks/results/reconstruction_residual_dc.{md,json}; --update-docs rewrites the reconstruction
row of docs/getting-started/demos.md from the default variant's numbers.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fedistill.reproduce.arguments import benchmark_parser
from fedistill.reproduce.paths import RESULTS, RUNS
from fedistill.reproduce.reconstruction_scores import Harness, client_states, saved_state
from fedistill.reproduce.reuse import kept
from fedistill.reproduce.tables import write_table

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "demo-reconstruction.toml"
DEMOS = ROOT / "docs" / "getting-started" / "demos.md"
STEM = "reconstruction_residual_dc"
WALL_FILE = "wall_time_s.json"
METHODS = ("fediod", "standalone", "fedavg", "centralized")
VARIANTS = {
    "default": ("residual + data consistency, output in the slice's units (the defaults)", ()),
    "no-scale": (
        "residual + data consistency, output as it is (the defaults before `output_scale`)",
        ("task.output_scale='none'",),
    ),
    "no-augment": (
        "the defaults without random flips and quarter turns (before they became the task's usual augmentation)",
        ("augment='off'",),
    ),
    "no-dc": ("residual, no data consistency", ("task.data_consistency=false",)),
    "no-residual": ("data consistency, no residual", ("task.residual=false",)),
    "neither": (
        "none of the four (the task as it was)",
        ("task.residual=false", "task.data_consistency=false", "task.output_scale='none'", "augment='off'"),
    ),
}


def start_variant(name: str, sets: tuple[str, ...], out: Path, reuse: bool) -> subprocess.Popen | None:
    """The demo with `sets`, as its own process (None when `reuse` finds its runs finished)."""
    if reuse and kept(out / name / m / "summary.json" for m in METHODS):
        return None
    shutil.rmtree(out / name, ignore_errors=True)  # a run folder of the same name is replaced
    items = ["threads=1", *sets]
    return subprocess.Popen(
        [sys.executable, "-m", "fedistill.cli", "run", "--quiet", "--config", str(CONFIG), "--out", str(out),
         "--name", name, *[x for s in items for x in ("--set", s)]]
    )  # fmt: skip


def run_variants(names: list[str], out: Path, reuse: bool, jobs: int) -> dict[str, float | None]:
    """Every variant's demo, `jobs` at once; each one's wall time in seconds, kept beside its runs
    (`wall_time_s.json`) so a reused variant still reports it (None when it has none)."""
    walls: dict[str, float | None] = {}
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    pending = list(names)
    while pending or running:
        while pending and len(running) < jobs:
            name = pending.pop(0)
            process = start_variant(name, VARIANTS[name][1], out, reuse)
            if process is None:
                stored = out / name / WALL_FILE
                walls[name] = json.loads(stored.read_text())["wall_time_s"] if stored.is_file() else None
            else:
                running[name] = (process, time.perf_counter())
        for name, (process, start) in list(running.items()):
            if process.poll() is not None:
                if process.returncode != 0:
                    raise SystemExit(f"variant {name}: fedistill run failed ({process.returncode})")
                walls[name] = time.perf_counter() - start
                (out / name / WALL_FILE).write_text(json.dumps({"wall_time_s": walls[name], "jobs": jobs}))
                print(f"{name}: done in {walls[name]:.0f} s", flush=True)
                del running[name]
        time.sleep(1)
    return walls


def per_site(metrics: dict[str, float], sites: list[str]) -> dict[str, dict[str, float]]:
    return {m: {s: float(metrics[f"{m}_{s}"]) for s in sites} for m in ("ssim", "psnr")}


def measure(name: str, out: Path, data_dir: str, wall: float | None) -> dict[str, Any]:
    """Every method's overall and per-site scores in one variant, and the zero-filled input's."""
    harness = Harness(out / name / "fedavg", data_dir)
    sites = harness.site_names
    zero = harness.zero_filled()
    rows: dict[str, Any] = {
        "zero-filled": {
            "label": harness.zero_filled_label(),
            "ssim": zero["ssim"],
            "psnr": zero["psnr"],
            "sites": per_site(zero, sites),
        }
    }
    for method in METHODS:
        run_dir = out / name / method
        summary = json.loads((run_dir / "summary.json").read_text())
        final = summary["final"]
        if method in ("standalone", "centralized"):
            scored = [per_site(harness.score(harness.model(s)), sites) for s in client_states(run_dir)]
        else:
            scored = [per_site(harness.score(harness.model(saved_state(run_dir, _saved(method)))), sites)]
        mean = {m: {s: statistics.fmean(x[m][s] for x in scored) for s in sites} for m in ("ssim", "psnr")}
        floor = rows["zero-filled"]["sites"]
        worst = {m: min(x[m][s] - floor[m][s] for x in scored for s in sites) for m in ("ssim", "psnr")}
        rows[method] = {
            "ssim": float(final["test_ssim"]),
            "psnr": float(final["test_psnr"]),
            "ssim_std": float(final.get("test_ssim_std", 0.0)),
            "sites": mean,
            "worst_margin": worst,
            "wall_time_s": float(summary.get("wall_time_s", 0.0)),
        }
    return {"variant": name, "label": VARIANTS[name][0], "sets": list(VARIANTS[name][1]), "sites": sites,
            "wall_time_s": wall, "rows": rows}  # fmt: skip


def _saved(method: str) -> str:
    return "student" if method == "fediod" else "global"


def markdown(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "# Reconstruction: residual and data consistency on the demo",
        "",
        f"`python benchmarks/reconstruction_residual_dc.py`: {CONFIG.relative_to(ROOT)} at one torch thread, "
        "seed 0, one run per variant. SSIM / PSNR dB on the test volumes (fastMRI's evaluation); per site: "
        "the site's test volumes (Standalone: the mean of the site models). `worst margin`: the smallest "
        "(method - zero-filled input) over the sites (and, for Standalone, over the site models); above 0: "
        "the method beats its own input everywhere.",
        "",
    ]
    for result in results:
        sites = result["sites"]
        wall = result["wall_time_s"]
        methods_wall = sum(row.get("wall_time_s", 0.0) for row in result["rows"].values())
        process = "" if wall is None else f"; {wall:.0f} s for the whole `fedistill run`"
        lines += [
            f"## {result['label']}",
            "",
            f"`--set {' '.join(result['sets']) or '(none)'}`: {methods_wall:.0f} s for the four methods"
            f"{process}.",
            "",
            "| row | SSIM | PSNR dB | "
            + " | ".join(f"{s} SSIM / PSNR" for s in sites)
            + " | worst margin SSIM / PSNR | wall s |",
            "|---|---|---|" + "---|" * len(sites) + "---|---|",
        ]
        for key, row in result["rows"].items():
            margin = row.get("worst_margin")
            cells = [f"{row['sites']['ssim'][s]:.4f} / {row['sites']['psnr'][s]:.2f}" for s in sites]
            worst = "-" if margin is None else f"{margin['ssim']:+.4f} / {margin['psnr']:+.2f}"
            seconds = f"{row['wall_time_s']:.0f}" if "wall_time_s" in row else "-"
            lines.append(
                f"| {row.get('label', key)} | {row['ssim']:.4f} | {row['psnr']:.2f} | "
                + " | ".join(cells)
                + f" | {worst} | {seconds} |"
            )
        lines.append("")
    return lines


def demo_row(result: dict[str, Any]) -> str:
    """The reconstruction row of the demos table (docs/getting-started/demos.md)."""
    rows = result["rows"]
    zero = rows["zero-filled"]

    def cell(method: str) -> str:
        row = rows[method]
        spread = f" ± {row['ssim_std']:.4f}" if method == "standalone" else ""
        return f"{row['ssim']:.4f}{spread} / {row['psnr']:.2f}"

    return (
        "| `configs/demo-reconstruction.toml` (MNI152 through 3 simulated scanners, 4x, SSIM / PSNR dB; "
        f"{zero['label'].lower().replace(' (floor)', '')}: {zero['ssim']:.4f} / {zero['psnr']:.2f}) | "
        + " | ".join(cell(m) for m in METHODS)
        + f" | {sum(rows[m]['wall_time_s'] for m in METHODS):.0f} s |"
    )


def update_docs(row: str) -> None:
    text = DEMOS.read_text()
    new, count = re.subn(r"^\| `configs/demo-reconstruction\.toml`.*$", lambda _: row, text, flags=re.M)
    if count != 1:
        raise SystemExit(f"{DEMOS}: expected one reconstruction row, found {count}")
    DEMOS.write_text(new)


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=str(RUNS / "reconstruction-residual-dc"))
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--reuse", action="store_true", help="keep variants whose runs finished")
    parser.add_argument("--jobs", type=int, default=1, help="variants at once (wall times then overlap)")
    parser.add_argument("--update-docs", action="store_true", help="rewrite the demos table's row")
    args = parser.parse_args()
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {', '.join(unknown)} (valid: {', '.join(VARIANTS)})")
    out = Path(args.out)
    walls = run_variants(names, out, args.reuse, args.jobs)
    results = [measure(name, out, args.data_dir, walls[name]) for name in names]
    path = write_table(args.results, STEM, markdown(results), {"config": str(CONFIG.relative_to(ROOT)),
                                                             "variants": results})  # fmt: skip
    print(path)
    default = next((r for r in results if r["variant"] == "default"), None)
    if default is not None:
        print(demo_row(default))
        if args.update_docs:
            update_docs(demo_row(default))


if __name__ == "__main__":
    main()
