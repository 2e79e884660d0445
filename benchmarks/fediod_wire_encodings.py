"""FedIOD's wire encodings on the digits demo: `fediod.wire = "float32"` against `"compact"` (or any wires,
the first the baseline of the others), seed by seed.

Each (seed, wire) is one `fedistill run` of src/fedistill/engine/demo.toml's FedIOD at one torch thread, as
its own process. The table gives the bytes each direction moved per content kind (the ledger's totals,
which count encoded arrays at their wire size), the encodings the ledger recorded, and the selected
student's test accuracy; the paired difference compact - float32 is taken on the same seed. It also
splits the `parameters` the server sends by message type (what they are for).

    python benchmarks/fediod_wire_encodings.py [--seeds 0,1] [--wires float32,compact] [--jobs 2]
        [--out benchmarks/runs/fediod_wire] [--reuse]

Writes benchmarks/results/fediod_wire_encodings.{md,json}; with other wires than float32,compact,
benchmarks/results/fediod_wire_encodings_<wires>.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fedistill import disk
from fedistill.algorithms.fediod import wire as fediod_wires
from fedistill.reproduce.paths import RUNS
from fedistill.reproduce.reuse import reusable

#: What the numbers mean; the report ends with it.
NOTES = """## Reading it

- `compact` (src/fedistill/algorithms/fediod/wire.py): synthetic images as `uint8-affine` (one byte per
  value, plus a float scale and offset per tensor), logits, discriminator outputs and both gradients as
  `float16-scaled` (two bytes per value, plus a power-of-two scale per tensor). Scaled float16 rather than
  bfloat16 for the gradients: the same two bytes with 2^-11 instead of 2^-8 relative error, and the scale
  keeps the input-gradients of batch-mean losses (far below float16's smallest normal number) and any
  large density ratio inside float16's range (the bounds: src/fedistill/federation/encodings.py).
- Every kind FedIOD encodes shrinks by its wire ratio (images 1/4, the rest 1/2, plus 8 to 16 bytes per
  tensor); stage 1, the teachers' evaluation logits and the `parameters` go as they are.
- The `parameters` the server sends are all `evaluate.student`: each epoch the student's state dict
  (small-cnn, about 129 KB in float32, batch-norm buffers included) goes to each of the 10 sites, which
  score it on their validation splits; that is the default `fediod.selection = "validation"`, which hands
  over the best validated epoch. They must be sent for that selection (the server holds no data);
  `fediod.selection = "last"` sends none but may hand over another student, so nothing was removed.
  Sending them in a compact encoding would move the validation scores slightly (not bit-identical).
- Wall times come from a shared two-core machine running two of these at a time: not a timing comparison.
- The student's accuracy moves with any perturbation of the adversarial loop, in either direction: read
  the paired difference against its spread over the seeds, not seed by seed.
"""

HERE = Path(__file__).resolve().parent
DEMO = HERE.parent / "src" / "fedistill" / "engine" / "demo.toml"
RESULTS = HERE / "results"
DEFAULT_WIRES = "float32,compact"
UP, DOWN = "client->server", "server->client"


def command(seed: int, wire: str, out: Path) -> list[str]:
    """The `fedistill run` command line of one (seed, wire)."""
    return [
        "fedistill", "run", "--quiet", "--config", "src/fedistill/engine/demo.toml", "--algorithm", "fediod",
        "--seed", str(seed), "--set", "threads=1", "--set", f"fediod.wire={wire}",
        "--out", str(out), "--name", f"wire-{wire}-seed-{seed}",
    ]  # fmt: skip


def run(seed: int, wire: str, out: Path, reuse: bool) -> dict[str, Any]:
    """Run one (seed, wire) unless `reuse` finds it finished; its row of the table."""
    run_dir = out / f"wire-{wire}-seed-{seed}" / "fediod"
    if not reusable(run_dir / "summary.json", reuse):
        argv = command(seed, wire, out)
        started = time.time()
        subprocess.run([sys.executable, "-m", "fedistill.cli", *argv[1:]], check=True)
        print(f"seed {seed} {wire}: {time.time() - started:.0f} s", flush=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    communication = summary["communication"]
    parameters_by_type: dict[str, int] = defaultdict(int)
    messages_by_type: dict[str, int] = defaultdict(int)
    for line in (run_dir / "ledger.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["direction"] == DOWN and "parameters" in record["kinds"]:
            parameters_by_type[record["type"]] += record["kinds"]["parameters"]
            messages_by_type[record["type"]] += 1
    return {
        "seed": seed,
        "wire": wire,
        "command": " ".join(command(seed, wire, Path("OUT"))),  # OUT: the --out given, no machine folder
        "test_accuracy": summary["test_accuracy"],
        "selected_epoch": summary["final"].get("selected_epoch"),
        "ensemble_accuracy": summary["final"].get("ensemble_accuracy"),
        "wall_time_s": summary["wall_time_s"],
        "up": {"total": communication[UP]["total_bytes"], **communication[UP]["per_kind"]},
        "down": {"total": communication[DOWN]["total_bytes"], **communication[DOWN]["per_kind"]},
        "encodings": {d: communication[key].get("encodings", {}) for d, key in (("up", UP), ("down", DOWN))},
        "parameters_down_by_type": dict(parameters_by_type),
        "parameter_messages_by_type": dict(messages_by_type),
    }


def mb(n: float) -> str:
    return f"{n / 1e6:.2f}"


def table(rows: list[dict[str, Any]], wires: list[str]) -> list[str]:
    """The markdown report of the rows; every wire after the first is compared with the first."""
    by = {(r["seed"], r["wire"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    lines = ["## Bytes per content kind (MB) and the student's accuracy", ""]
    kinds = {d: sorted({k for r in rows for k in r[d] if k != "total"}) for d in ("up", "down")}
    header = ["seed", "wire", *[f"up {k}" for k in kinds["up"]], "up total",
              *[f"down {k}" for k in kinds["down"]], "down total", "all", "student %", "wall s"]  # fmt: skip
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for seed in seeds:
        for wire in wires:
            r = by.get((seed, wire))
            if r is None:
                continue
            cells = [str(seed), wire, *[mb(r["up"].get(k, 0)) for k in kinds["up"]], mb(r["up"]["total"]),
                     *[mb(r["down"].get(k, 0)) for k in kinds["down"]], mb(r["down"]["total"]),
                     mb(r["up"]["total"] + r["down"]["total"]), f"{100 * r['test_accuracy']:.2f}",
                     f"{r['wall_time_s']:.0f}"]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    for other in wires[1:]:
        lines += paired(by, seeds, wires[0], other)
    for wire in wires:
        first = next((r for r in rows if r["wire"] == wire and r["encodings"]), None)
        if first is not None:
            lines += ["", f"Encodings the ledger recorded with `{wire}` (per direction and kind): "
                      f"`{json.dumps(first['encodings'])}`"]  # fmt: skip
    lines += ["", "## The `parameters` the server sends", ""]
    for r in rows:
        if r["wire"] == wires[0]:
            parts = ", ".join(
                f"{t}: {mb(v)} MB in {r['parameter_messages_by_type'][t]} messages"
                for t, v in sorted(r["parameters_down_by_type"].items())
            )
            lines.append(f"- seed {r['seed']}: {parts}")
    return lines


def paired(by: dict[tuple[int, str], dict[str, Any]], seeds: list[int], base: str, other: str) -> list[str]:
    """`other` against `base` on the same seeds: the byte ratios and the student's difference."""
    lines = ["", f"## {other.capitalize()} against {base}, same seed", "",
             "| seed | bytes up (ratio) | bytes down (ratio) | all (ratio) | student % difference |",
             "|---|---|---|---|---|"]  # fmt: skip
    diffs: list[float] = []
    for seed in seeds:
        a, b = by.get((seed, base)), by.get((seed, other))
        if a is None or b is None:
            continue
        up, down = b["up"]["total"] / a["up"]["total"], b["down"]["total"] / a["down"]["total"]
        both = (b["up"]["total"] + b["down"]["total"]) / (a["up"]["total"] + a["down"]["total"])
        diff = 100 * (b["test_accuracy"] - a["test_accuracy"])
        diffs.append(diff)
        lines.append(f"| {seed} | {up:.3f} | {down:.3f} | {both:.3f} | {diff:+.2f} |")
    if len(diffs) > 1:
        mean, spread = statistics.mean(diffs), statistics.stdev(diffs)
        half_width = 2 * spread / len(diffs) ** 0.5
        lines += ["", f"Paired difference over {len(diffs)} seeds: {mean:+.2f} ± {spread:.2f} points (mean ± std; "
                  f"about ±{half_width:.2f} for the mean at two standard errors)."]  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument(
        "--wires", default=DEFAULT_WIRES, help="fediod.wire values; the first is the baseline"
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--out", default=str(RUNS / "fediod_wire"), help="parent folder of the run directories"
    )
    parser.add_argument("--reuse", action="store_true", help="keep runs that already finished")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    wires = args.wires.split(",")
    unknown = set(wires) - set(fediod_wires.WIRES)
    if unknown or len(wires) < 2:
        parser.error(f"--wires takes two or more of {', '.join(fediod_wires.WIRES)}, got {args.wires!r}")
    jobs = [(seed, wire) for seed in seeds for wire in wires]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(lambda job: run(*job, out, args.reuse), jobs))
    command = "python benchmarks/fediod_wire_encodings.py --seeds " + args.seeds
    if args.wires != DEFAULT_WIRES:
        command += " --wires " + args.wires
    payload = {"command": command, "wires": wires, "runs": rows}
    stem = "fediod_wire_encodings" + ("" if args.wires == DEFAULT_WIRES else "_" + "-".join(wires))
    RESULTS.mkdir(exist_ok=True)
    disk.write_text(RESULTS / f"{stem}.json", json.dumps(payload, indent=2) + "\n")
    lines = ["# FedIOD's wire encodings on the digits demo", "",
             f"Command: `{payload['command']}`; each row is one of these runs:", ""]  # fmt: skip
    lines += [f"    {r['command']}" for r in rows] + [""] + table(rows, wires)
    lines += ["", NOTES.strip()]
    disk.write_text(RESULTS / f"{stem}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
