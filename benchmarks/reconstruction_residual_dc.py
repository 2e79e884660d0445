"""What the reconstruction task's residual, data consistency, output scale and augmentation change, measured
on the reconstruction demo.

One `fedistill run --config configs/demo-reconstruction.toml --set threads=1` per variant (every method
of the demo: FedIOD, Standalone, FedAvg, Centralized), the variants being the task's defaults
(`residual`, `data_consistency` on, `output_scale = "slice"`, random flips and quarter turns) and each
switched off, then all four off (the task as it was). Every
model is scored per test site (SSIM, PSNR per volume, fastMRI's evaluation) beside the zero-filled input
scored through the same task (with its data consistency where the variant applies it): a method that
does not beat its own input on every site is flagged.

With several `--seeds` every variant runs at each seed, and the record opens with each method's mean over
the seeds and how often Centralized, the pooled-data ceiling, scored above FedIOD. The `no-truth` variant
takes away what FedIOD's student learns beyond its teachers: G's own images with their known
reconstructions (`fediod.truth_weight = 0`), data that no other method has.

    python benchmarks/reconstruction_residual_dc.py [--variants default,no-scale,no-augment,no-dc,no-residual,neither] \\
        [--seeds 0] [--tag TAG] [--out benchmarks/runs/reconstruction-residual-dc] [--jobs 1] [--reuse] [--update-docs]

Writes benchmarks/results/reconstruction_residual_dc{_TAG}.{md,json}; --update-docs rewrites the
reconstruction row of docs/getting-started/demos.md from the default variant's numbers at the first seed.
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

from _common import head_commit
from fediod_step_time import matmul_peak_gflops
from fedistill import disk, machine
from fedistill.reproduce.arguments import benchmark_parser, shown_arguments
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
    "no-truth": (
        "the defaults, FedIOD's student taught by its teachers only (no G image as its own truth)",
        ("fediod.truth_weight=0",),
    ),
}


def run_folder(variant: str, seed: int) -> str:
    """A (variant, seed)'s folder under `--out`: the variant's name at seed 0, as before seeds existed."""
    return variant if seed == 0 else f"{variant}-seed{seed}"


def start_variant(
    name: str, seed: int, sets: tuple[str, ...], out: Path, reuse: bool
) -> subprocess.Popen | None:
    """The demo with `sets` at `seed`, as its own process (None when `reuse` finds its runs finished)."""
    folder = run_folder(name, seed)
    if reuse and kept(out / folder / m / "summary.json" for m in METHODS):
        return None
    shutil.rmtree(out / folder, ignore_errors=True)  # a run folder of the same name is replaced
    items = ["threads=1", *sets]
    return subprocess.Popen(
        [sys.executable, "-m", "fedistill.cli", "run", "--quiet", "--config", str(CONFIG), "--out", str(out),
         "--name", folder, "--seed", str(seed), *[x for s in items for x in ("--set", s)]]
    )  # fmt: skip


def run_variants(
    runs: list[tuple[str, int]], out: Path, reuse: bool, jobs: int
) -> dict[tuple[str, int], float | None]:
    """Every (variant, seed)'s demo, `jobs` at once; each one's wall time in seconds, kept beside its runs
    (`wall_time_s.json`) so a reused one still reports it (None when it has none)."""
    walls: dict[tuple[str, int], float | None] = {}
    running: dict[tuple[str, int], tuple[subprocess.Popen, float]] = {}
    pending = list(runs)
    while pending or running:
        while pending and len(running) < jobs:
            name, seed = run = pending.pop(0)
            process = start_variant(name, seed, VARIANTS[name][1], out, reuse)
            if process is None:
                stored = out / run_folder(name, seed) / WALL_FILE
                walls[run] = json.loads(stored.read_text())["wall_time_s"] if stored.is_file() else None
            else:
                running[run] = (process, time.perf_counter())
        for run, (process, start) in list(running.items()):
            if process.poll() is not None:
                label = f"{run[0]}, seed {run[1]}"
                if process.returncode != 0:
                    raise SystemExit(f"variant {label}: fedistill run failed ({process.returncode})")
                walls[run] = time.perf_counter() - start
                stored = out / run_folder(*run) / WALL_FILE
                disk.write_text(stored, json.dumps({"wall_time_s": walls[run], "jobs": jobs}))
                print(f"{label}: done in {walls[run]:.0f} s", flush=True)
                del running[run]
        time.sleep(1)
    return walls


def per_site(metrics: dict[str, float], sites: list[str]) -> dict[str, dict[str, float]]:
    return {m: {s: float(metrics[f"{m}_{s}"]) for s in sites} for m in ("ssim", "psnr")}


def measure(name: str, seed: int, out: Path, data_dir: str, wall: float | None) -> dict[str, Any]:
    """Every method's overall and per-site scores in one variant at one seed, and the zero-filled input's."""
    folder = out / run_folder(name, seed)
    harness = Harness(folder / "fedavg", data_dir)
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
        run_dir = folder / method
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
    return {"variant": name, "seed": seed, "label": VARIANTS[name][0], "sets": list(VARIANTS[name][1]),
            "sites": sites, "wall_time_s": wall, "rows": rows, "machine": machine.of_summary(summary)}  # fmt: skip


def _saved(method: str) -> str:
    return "student" if method == "fediod" else "global"


def over_seeds(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant: each method's mean (and spread) SSIM and PSNR over the seeds it ran, and at how many
    seeds Centralized, the pooled-data ceiling, scored above FedIOD's student."""
    summary = []
    for variant in dict.fromkeys(r["variant"] for r in results):
        runs = [r for r in results if r["variant"] == variant]
        methods = {}
        for method in ("zero-filled", *METHODS):
            ssim = [r["rows"][method]["ssim"] for r in runs]
            psnr = [r["rows"][method]["psnr"] for r in runs]
            spread = statistics.stdev(ssim) if len(ssim) > 1 else 0.0
            methods[method] = {
                "ssim": statistics.fmean(ssim),
                "ssim_std": spread,
                "psnr": statistics.fmean(psnr),
            }
        above = sum(r["rows"]["centralized"]["ssim"] > r["rows"]["fediod"]["ssim"] for r in runs)
        summary.append({"variant": variant, "label": runs[0]["label"], "seeds": [r["seed"] for r in runs],
                        "methods": methods, "centralized_above_fediod": above})  # fmt: skip
    return summary


def markdown(results: list[dict[str, Any]], command: str, commit: str, gflops: float) -> list[str]:
    seeds = sorted({r["seed"] for r in results})
    lines = [
        "# Reconstruction: residual and data consistency on the demo",
        "",
        f"Command: `{command}` (commit `{commit}`). {CONFIG.relative_to(ROOT)} at one torch thread, "
        f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}, one run per variant and seed. "
        "SSIM / PSNR dB on the test volumes (fastMRI's evaluation); per site: "
        "the site's test volumes (Standalone: the mean of the site models). `worst margin`: the smallest "
        "(method - zero-filled input) over the sites (and, for Standalone, over the site models); above 0: "
        "the method beats its own input everywhere.",
        "",
        f"Machine: {machine.joined(r['machine'] for r in results)}; fp32 matmul {gflops:.1f} GFLOP/s at one "
        "thread.",
        "",
    ]
    if len(seeds) > 1:
        lines += [
            "## Over the seeds",
            "",
            "Each method's SSIM averaged over the seeds (± their standard deviation) and PSNR; the last "
            "column counts the seeds at which Centralized, trained on the pooled real slices, scored above "
            "FedIOD's student.",
            "",
            "| variant | seeds | zero-filled | " + " | ".join(METHODS) + " | Centralized above FedIOD |",
            "|---|---|---|" + "---|" * len(METHODS) + "---|",
        ]
        for row in over_seeds(results):
            cells = [
                f"{m['ssim']:.4f} ± {m['ssim_std']:.4f} / {m['psnr']:.2f}"
                for m in (row["methods"][k] for k in ("zero-filled", *METHODS))
            ]
            lines.append(
                f"| {row['variant']} | {len(row['seeds'])} | "
                + " | ".join(cells)
                + f" | {row['centralized_above_fediod']} of {len(row['seeds'])} |"
            )
        lines.append("")
    for result in results:
        sites = result["sites"]
        wall = result["wall_time_s"]
        methods_wall = sum(row.get("wall_time_s", 0.0) for row in result["rows"].values())
        process = "" if wall is None else f"; {wall:.0f} s for the whole `fedistill run`"
        seed = f", seed {result['seed']}" if len(seeds) > 1 else ""
        lines += [
            f"## {result['label']}{seed}",
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
    disk.write_text(DEMOS, new)


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--variants", default=",".join(v for v in VARIANTS if v != "no-truth"))
    parser.add_argument("--seeds", default="0", help="comma-separated seeds; each variant runs at each")
    parser.add_argument("--tag", default="", help="the record's name: reconstruction_residual_dc_TAG")
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
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or not names:
        raise SystemExit(
            f"--seeds {args.seeds!r} --variants {args.variants!r}: expected comma-separated integers "
            "(e.g. 0,1,2) and at least one variant"
        )
    out = Path(args.out)
    runs = [(name, seed) for seed in seeds for name in names]
    walls = run_variants(runs, out, args.reuse, args.jobs)
    results = [measure(name, seed, out, args.data_dir, walls[name, seed]) for name, seed in runs]
    command = " ".join(["python", "benchmarks/reconstruction_residual_dc.py", *shown_arguments(sys.argv[1:])])
    gflops, commit = matmul_peak_gflops(), head_commit()
    lines = markdown(results, command, commit, gflops)
    payload = {"config": str(CONFIG.relative_to(ROOT)), "command": command, "commit": commit,
               "matmul_peak_gflops": gflops, "over_seeds": over_seeds(results), "variants": results}  # fmt: skip
    path = write_table(args.results, STEM + (f"_{args.tag}" if args.tag else ""), lines, payload)
    print(path)
    default = next((r for r in results if r["variant"] == "default"), None)
    if default is not None:
        print(demo_row(default))
        if args.update_docs:
            update_docs(demo_row(default))


if __name__ == "__main__":
    main()
