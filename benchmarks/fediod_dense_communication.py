"""What FedIOD's sites send per G-step on the dense tasks, and the options that send less.

Runs the FedIOD row of the reproduce targets segmentation-table2 and reconstruction-table9 at `--scale ci`
(configs/demo-segmentation.toml with 10 G-steps per epoch, configs/demo-reconstruction.toml with its own
30; one torch thread, CPU, seed 0), once per variant, one run at a time. For each it reads the summary
and the ledger: the bytes each direction moved per content kind, per G-step (the ledger's G-steps), and
the selected student's test quality.

    python benchmarks/fediod_dense_communication.py [--tasks segmentation,reconstruction]
        [--variants pixel,patch,...] [--seeds 0] [--out benchmarks/runs/fediod_dense] [--reuse] [--tag TAG]

Writes benchmarks/results/fediod_dense_communication{_TAG}.{md,json}; with several seeds, also each
variant's mean over them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import head_commit
from fedistill import disk
from fedistill.reproduce.paths import RUNS
from fedistill.reproduce.reuse import reusable

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
UP, DOWN = "client->server", "server->client"

#: The ci settings of each task's reproduce target (src/fedistill/reproduce/targets_medical.py).
TASKS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "segmentation": ("configs/demo-segmentation.toml", ("fediod.iters_per_epoch=10",), ("dice", "hd95")),
    "reconstruction": ("configs/demo-reconstruction.toml", (), ("ssim", "psnr")),
}

#: The sites label only G's batches: the student learns from them in a replay pool, as many updates per
#: G-step as the 2 S-steps it replaces (`student_steps = 0`).
LEAN = (
    "fediod.student_steps=0",
    "fediod.pool_generator_batch=true",
    "fediod.pool_size=1000",
    "fediod.pool_steps=2",
)

#: The paper's exchanges, as the demos ran them before the lean preset became the per-pixel default:
#: 2 S-steps per G-step on fresh samples every site labels.
PAPER = ("fediod.preset='paper'", "fediod.student_steps=2")

#: Variants of the paper's exchanges: their `--set`s on top of PAPER.
ON_PAPER: dict[str, tuple[str, ...]] = {
    "pixel": ("fediod.ratio_resolution='pixel'",),  # the default before `patch`: one D_k ratio per pixel
    "patch": ("fediod.ratio_resolution='patch'",),
    "compact+patch": ("fediod.wire='compact'", "fediod.ratio_resolution='patch'"),
    "compact+patch+batch4": (
        "fediod.wire='compact'",
        "fediod.ratio_resolution='patch'",
        "fediod.synthetic_batch_size=4",
    ),
    "compact+patch+1-student-step": (
        "fediod.wire='compact'",
        "fediod.ratio_resolution='patch'",
        "fediod.student_steps=1",
    ),
    # a two-class task's sites send one logit margin per pixel (segmentation only)
    "compact+patch+margin": (
        "fediod.wire='compact'",
        "fediod.ratio_resolution='patch'",
        "fediod.pixel_logits='margin'",
    ),
    # the sites label only G's batches (LEAN)
    "compact+patch+lean": (
        "fediod.wire='compact'",
        "fediod.ratio_resolution='patch'",
        *LEAN,
    ),
    "compact+patch+margin+lean": (
        "fediod.wire='compact'",
        "fediod.ratio_resolution='patch'",
        "fediod.pixel_logits='margin'",
        *LEAN,
    ),
    "batch4": ("fediod.synthetic_batch_size=4",),
    "compact": ("fediod.wire='compact'",),
}

#: Each variant's `--set`s on top of the target's.
VARIANTS: dict[str, tuple[str, ...]] = {
    "default": (),  # FedIOD's defaults: the lean preset (its uniform ensemble on reconstruction)
    # the lean preset with the paper's Eq. 8 ensemble
    "lean+eq8": ("fediod.preset='lean'", "fediod.ensemble_weighting='eq8'"),
    # the lean preset before its small-mask settings (one-byte margins, a pool of 2,500 replayed 5 times)
    "lean-before-small-masks": ("fediod.wire='compact'", "fediod.pool_size=1000", "fediod.pool_steps=2"),
    **{name: (*PAPER, *sets) for name, sets in ON_PAPER.items()},
}

NOTES = """## Reading it

- What each site sends per G-step (both demos: 32 px images, a synthetic batch of 8 and 2 S-steps of 8
  carried along; 4 sites on segmentation, 3 on reconstruction): its teacher's outputs on the G-step's
  batch and on the 16 S-step inputs (`logits`: 2 channels per pixel on segmentation, 1 on
  reconstruction), its Eq. 8 D_k ratios on the same 24 images (`discriminator-outputs`) and its
  input-gradient on the batch (`input-gradients`). The per-G-step bytes do not depend on the number of
  G-steps, so the demos' own settings (30 G-steps per epoch) send the same per step.
- `fediod.ratio_resolution = "patch"` sends D_k's ratios once per patch of its map (6 x 6 for a 32 px
  image and a 2-layer D_k) instead of once per pixel (32 x 32); the server upsamples them (nearest) as the
  sites did, so the ensemble weights are the same bits and so is every number the run records: the
  `pixel` and `patch` rows (and `compact` and `compact+patch`) must agree exactly, and do;
  tests/test_fediod_dense_communication.py checks it.
- Why not one value per sample: the ratios are not a loss on D_k's output (L_gan is computed at the site
  and never sent) but Eq. 8's weights, which are normalised over the sites at every pixel; a mean over
  the image gives other weights. Fewer logits: `pixel_logits = "margin"` sends a two-class task's
  z_1 - z_0 per pixel and the server takes (0, z_1 - z_0), the same softmax (the `+margin` rows; the
  output-gradients the server returns halve too). It is not the same computation: L_mimic (l2 on the
  logits) then fits the student to that centring, and the class-dependent Eq. 8 weights give another
  ensemble, so its quality is measured, not assumed. Reconstruction's output is one channel already. The
  input-gradient goes as scaled float16 with `wire = "compact"`.
- `synthetic_batch_size` and `student_steps` are existing knobs: they cut every per-sample content at
  once and change what G and S learn, so their quality must be read against the `pixel` row's.
{recommended}
- One seed per variant, on a shared two-core CPU: a quality difference between variants that change the
  numbers is within one seed's noise unless it is large (the reproduce targets' ci tolerances are 4 Dice
  points and 0.02 SSIM); wall times are not a timing comparison.
"""


#: The variants that cut the exchanges further than `compact+patch`, at a cost in quality.
SMALLER = ("compact+patch+batch4", "compact+patch+1-student-step")


def recommended(rows: list[dict[str, Any]]) -> str:
    """The notes' recommendation with the byte ratios and quality differences these rows measured (means
    over their seeds), so that a rerun never repeats another run's numbers; empty without both rows."""

    def mean(task: str, variant: str, value: Any) -> float | None:
        mine = [value(r) for r in rows if r["task"] == task and r["variant"] == variant]
        return sum(mine) / len(mine) if mine else None

    both = lambda r: r["up"]["total"] + r["down"]["total"]  # noqa: E731
    ratios, costs = [], []
    for task, (_, _, metrics) in TASKS.items():
        pixel, chosen = mean(task, "pixel", both), mean(task, "compact+patch", both)
        if pixel is None or chosen is None:
            continue
        ratios.append(
            f"{chosen / pixel:.2f}" + (" of the `pixel` row's bytes" if not ratios else "") + f" on {task}"
        )
        metric = metrics[0]  # Dice or SSIM: the quality the table leads with
        quality = lambda r, m=metric: r["quality"][m]  # noqa: E731
        base = mean(task, "compact+patch", quality)
        diffs = sorted(d - base for v in SMALLER if (d := mean(task, v, quality)) is not None)
        if diffs and base is not None:
            scale, unit, digits = (100, " points", 2) if metric == "dice" else (1, "", 3)
            span = " to ".join(dict.fromkeys(f"{scale * d:+.{digits}f}" for d in (diffs[0], diffs[-1])))
            name = "Dice" if metric == "dice" else metric.upper()
            costs.append(f"{name} {span}{unit} against `compact+patch` on {task}")
    if not ratios:
        return ""
    text = (
        '- Recommended: `wire = "compact"` with `ratio_resolution = "patch"` (the `compact+patch` '
        "rows): the quality of `compact` (ratio_resolution changes no number) for "
        + " and ".join(ratios)
        + "."
    )
    if costs:
        text += (
            " A synthetic batch of 4 or one S-step per G-step cut more bytes; their quality: "
            + "; ".join(costs)
            + "."
        )
    return text + "\n"


def run_name(task: str, variant: str, seed: int) -> str:
    return f"{task}-{variant}" if seed == 0 else f"{task}-{variant}-seed{seed}"


def command(task: str, variant: str, out: Path, seed: int = 0) -> list[str]:
    """The `fedistill run` command line of one (task, variant, seed)."""
    config, target_sets, _ = TASKS[task]
    sets = ("threads=1", "device='cpu'", *target_sets, *VARIANTS[variant])
    argv = ["fedistill", "run", "--quiet", "--config", config, "--algorithm", "fediod", "--seed", str(seed)]
    for item in sets:
        argv += ["--set", item]
    return [*argv, "--out", str(out), "--name", run_name(task, variant, seed)]


def g_steps(ledger: Path) -> int:
    """The number of G-steps the ledger records (one `query.backprop` exchange each)."""
    steps = set()
    for line in ledger.read_text().splitlines():
        record = json.loads(line)
        if record["type"] == "query.backprop":
            steps.add(record["step"])
    return len(steps)


def run(task: str, variant: str, out: Path, reuse: bool, seed: int = 0) -> dict[str, Any]:
    """Run one (task, variant, seed) unless `reuse` finds it finished; its row of the table."""
    name = run_name(task, variant, seed)
    run_dir = out / name / "fediod"
    argv = command(task, variant, out, seed)
    if not reusable(run_dir / "summary.json", reuse):
        started = time.time()
        subprocess.run(["nice", "-n", "5", sys.executable, "-m", "fedistill.cli", *argv[1:]], check=True)
        print(f"{name}: {time.time() - started:.0f} s", flush=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    communication, final = summary["communication"], summary["final"]
    steps = g_steps(run_dir / "ledger.jsonl")
    shown = " ".join([*argv[:-4], "--out", "OUT", "--name", name])
    return {
        "task": task,
        "variant": variant,
        "seed": seed,
        "command": shown,
        "quality": {m: final[f"test_{m}"] for m in TASKS[task][2]},
        "selected_epoch": final.get("selected_epoch"),
        "g_steps": steps,
        "wall_time_s": summary["wall_time_s"],
        "up": {"total": communication[UP]["total_bytes"], **communication[UP]["per_kind"]},
        "down": {"total": communication[DOWN]["total_bytes"], **communication[DOWN]["per_kind"]},
    }


def mb(n: float) -> str:
    return f"{n / 1e6:.2f}"


def kb(n: float) -> str:
    return f"{n / 1e3:.1f}"


def quality_cell(task: str, quality: dict[str, float]) -> str:
    if task == "segmentation":
        return f"Dice {100 * quality['dice']:.2f}, HD95 {quality['hd95']:.2f}"
    return f"SSIM {quality['ssim']:.4f}, PSNR {quality['psnr']:.2f}"


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown report of the rows, one section per task."""
    lines: list[str] = []
    for task in TASKS:
        mine = [r for r in rows if r["task"] == task]
        if not mine:
            continue
        base = next((r for r in mine if r["variant"] == "pixel"), mine[0])
        up_kinds = sorted({k for r in mine for k in r["up"] if k != "total"})
        seeds = sorted({r.get("seed", 0) for r in mine})
        label = (
            (lambda r: r["variant"])
            if seeds == [0]
            else (lambda r: f"{r['variant']}, seed {r.get('seed', 0)}")
        )
        lines += [f"## {task} (reproduce target at --scale ci, seed {', '.join(map(str, seeds))})", ""]
        lines += ["Sites' bytes per G-step by content kind (KB; the run's total over its G-steps):", ""]
        header = ["variant", "G-steps", *up_kinds, "sites total"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in mine:
            per_step = [kb(r["up"].get(k, 0) / r["g_steps"]) for k in up_kinds]
            cells = [label(r), str(r["g_steps"]), *per_step, kb(r["up"]["total"] / r["g_steps"])]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "Quality and the run's bytes (MB):", ""]
        header = ["variant", "quality", "sites sent", "server sent", "all", "all / pixel", "wall s"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        base_all = base["up"]["total"] + base["down"]["total"]
        for r in mine:
            both = r["up"]["total"] + r["down"]["total"]
            cells = [label(r), quality_cell(task, r["quality"]), mb(r["up"]["total"]),
                     mb(r["down"]["total"]), mb(both), f"{both / base_all:.3f}", f"{r['wall_time_s']:.0f}"]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        if len(seeds) > 1:
            lines += seed_means(task, mine)
    return lines


def seed_means(task: str, rows: list[dict[str, Any]]) -> list[str]:
    """Each variant's mean quality and bytes over its seeds (the same seeds for every variant)."""
    lines = [
        "Mean over the seeds:",
        "",
        "| variant | seeds | quality | sites sent MB | all MB |",
        "|---|---|---|---|---|",
    ]
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == variant]
        quality = {m: sum(r["quality"][m] for r in mine) / len(mine) for m in TASKS[task][2]}
        up = sum(r["up"]["total"] for r in mine) / len(mine)
        both = sum(r["up"]["total"] + r["down"]["total"] for r in mine) / len(mine)
        lines.append(f"| {variant} | {len(mine)} | {quality_cell(task, quality)} | {mb(up)} | {mb(both)} |")
    return [*lines, ""]


def write(rows: list[dict[str, Any]], argv: str, tag: str = "") -> list[str]:
    """Write the json and markdown results; the markdown's lines."""
    payload = {"command": argv, "commit": head_commit(), "runs": rows}
    RESULTS.mkdir(exist_ok=True)
    stem = "fediod_dense_communication" + (f"_{tag}" if tag else "")
    disk.write_text(RESULTS / f"{stem}.json", json.dumps(payload, indent=2) + "\n")
    lines = ["# FedIOD on the dense tasks: what sites send per G-step, and cheaper settings", "",
             f"Command: `{argv}` at commit {payload['commit']}; each row is one of these runs:", ""]  # fmt: skip
    notes = NOTES.replace("{recommended}\n", recommended(rows)).strip()
    lines += [f"    {r['command']}" for r in rows] + [""] + table(rows) + [notes]
    disk.write_text(RESULTS / f"{stem}.md", "\n".join(lines) + "\n")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--out", default=str(RUNS / "fediod_dense"), help="parent folder of the run directories"
    )
    parser.add_argument("--reuse", action="store_true", help="keep runs that already finished")
    parser.add_argument("--seeds", default="0", help="comma list of seeds, each variant on every one")
    parser.add_argument("--tag", default="", help="suffix of the result files")
    args = parser.parse_args()
    tasks, variants = args.tasks.split(","), args.variants.split(",")
    unknown = sorted(set(tasks) - set(TASKS)) + sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown task or variant: {', '.join(unknown)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    shown = f"python benchmarks/fediod_dense_communication.py --tasks {args.tasks} --variants {args.variants}"
    shown += (f" --seeds {args.seeds}" if seeds != [0] else "") + (f" --tag {args.tag}" if args.tag else "")
    rows: list[dict[str, Any]] = []
    for seed in seeds:  # every variant of a seed first: paired results as they come
        for variant in variants:  # the variants in order, both tasks each: partial results stay comparable
            for task in tasks:
                rows.append(run(task, variant, Path(args.out), args.reuse, seed))
                lines = write(rows, shown, args.tag)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
