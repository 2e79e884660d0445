"""Bytes to quality: how many bytes FedIOD, FedAvg and FedDF move (both directions, from each run's ledger)
before their test accuracy first reaches 0.90, 0.95 and 1.00 of FedAvg's final accuracy.

Each method is its own `fedistill run` process on the same partition and seed; FedIOD runs twice, once per
wire encoding (`fediod.wire = "float32"` and `"compact"`). A method's curve has one point per evaluation:
the bytes its ledger.jsonl records up to and including that round (FedIOD's stage 1 is round 0, counted in
its first point) against the test accuracy of the model the run would hand over if it stopped there: the
global model for FedAvg and FedDF, the student its clients' validation splits rate best so far for FedIOD
(the default `selection = "validation"`; a tie goes to the later epoch, as its keep_if_best decides).

    python benchmarks/bytes_to_quality.py --demo                 # the digits demo (demo.toml), K = 10
    python benchmarks/bytes_to_quality.py --dataset fashion-mnist --alpha 0.1 \\
        [--model lenet-fedmdcg] [--clients 10] [--epochs 8] [--iters 30] [--teacher-epochs 10] \\
        [--fedavg-rounds 50] [--feddf-rounds 50] [--feddf-source dataset:mnist] [--threads 1] \\
        [--set fediod.KEY=VALUE ...] [--feddf-set feddf.KEY=VALUE ...] [--methods fedavg,feddf] [--reuse] \\
        [--note "why a method is missing"] [--reference RECORD.json]
        [--device cuda] [--model resnet8 --image-size 32 --channels 3]   # on a GPU; CIFAR's shape

On the demo every method keeps demo.toml's settings (FedDF, which it does not list, gets its 3 local epochs
per round). Elsewhere FedIOD gets `fediod.preset = "stable"` and the budget asked for (`--set` applies to
FedIOD alone), FedAvg and FedDF one local epoch per round, FedDF distilling on the other MNIST-like set
(on noise when the images are resampled).
`--methods` runs a subset (without fedavg, the runs only: a later `--reuse` keeps them). Writes
benchmarks/results/bytes_to_quality_<set>.{md,json,png}; with `--tag NAME` (a variant: its `--set` items)
benchmarks/results/sweeps/bytes_to_quality_<set>_NAME.*, its FedIOD and FedDF runs named with the tag and
FedAvg's untagged run shared by every tag. `--reference RECORD.json` takes FedAvg's curve from an earlier
record of the same set instead of running it (bytes do not depend on the machine; the report names it).
"""

from __future__ import annotations

import argparse
import json
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from _common import (
    DEMO,
    RESULTS,
    add_budget_arguments,
    add_device_and_shape,
    add_seed_and_out,
    benchmark_parser,
    check_shape,
    head_commit,
    run_fedistill,
    variant_flags,
    variant_suffix,
)
from fediod_step_time import matmul_peak_gflops
from fediod_time_to_quality import STABILISERS, shape_sets
from fedistill import disk
from fedistill.engine.rundir import read_jsonl
from fedistill.machine import of_summaries

#: The fractions of FedAvg's final accuracy whose first crossing is counted.
LEVELS = (0.90, 0.95, 1.00)
#: The method every level and ratio is measured against.
REFERENCE = "FedAvg"
#: `--methods` names -> the table's labels, in the order they run (the reference first).
METHODS = {"fedavg": REFERENCE, "fediod-float32": "FedIOD (float32)", "fediod-compact": "FedIOD (compact)",
           "feddf": "FedDF"}  # fmt: skip
#: FedDF's unlabelled distillation data: the other MNIST-like set (benchmarks/feddf_classification.py).
OTHER = {"fashion-mnist": "dataset:mnist", "mnist": "dataset:fashion-mnist"}
#: The demo's settings (demo.toml), passed explicitly since run_fedistill names them on the command line.
DEMO_SETTING = {"dataset": "digits", "clients": 10, "alpha": "0.5", "model": "small-cnn", "rounds": 10}
DEMO_LOCAL_EPOCHS = 3

NOTES = """## Reading it

- Bytes are the ledger's: every message in both directions, encoded arrays at their wire size, FedIOD's
  stage 1 (teachers' label statistics and evaluation logits) included in its first point.
- FedIOD's accuracy at an epoch is the validated student's (the best epoch so far on the clients'
  validation splits; with `selection = "last"`, which sends no parameters, that epoch's student);
  FedAvg's and FedDF's is the global model's after that round.
- A run "stopped after round k" was killed before its last round (`--unfinished` keeps it): its total
  counts every message it sent, its final accuracy is round k's.
- Bytes do not depend on the machine (accuracies may move slightly on another CPU); the matmul rate
  (`matmul_peak_gflops`, benchmarks/fediod_step_time.py) was measured on a shared machine and only says
  which one it was.
- "-": the method never reached that level within its budget; the ratio is its bytes over FedAvg's at the
  same level.
- The CIFAR-shaped variant (Fashion-MNIST resampled to 3 x 32 x 32: `--model resnet8 --image-size 32
  --channels 3 --device cuda`, or `--model resnet8-wide`, FedIOD's own ResNet-8 of 128/256/512 channels)
  is too slow for a CPU; its records (`..._cuda_32px_3ch`) ran on a GPU, several runs at once on one card.
- FedIOD's "server->client parameters" are the student, sent to every site once per epoch so that the
  sites' validation splits can rate it (`selection = "validation"`); no site's model ever leaves it.
"""


def ledger_bytes(path: Path) -> tuple[dict[int, int], dict[str, int]]:
    """Bytes that crossed the wire per round (both directions, every content kind of every record), and
    per direction and content kind over the whole run ("client->server logits": ..., largest first)."""
    by_round: dict[int, int] = {}
    by_kind: dict[str, int] = {}
    for record in read_jsonl(path):
        by_round[record["round"]] = by_round.get(record["round"], 0) + sum(record["kinds"].values())
        for kind, size in record["kinds"].items():
            key = f"{record['direction']} {kind}"
            by_kind[key] = by_kind.get(key, 0) + size
    return by_round, dict(sorted(by_kind.items(), key=lambda item: -item[1]))


def accuracy_points(rows: list[dict[str, Any]], validated: bool) -> list[tuple[int, float]]:
    """(round, accuracy) at each evaluation: the test accuracy, or with `validated` the test accuracy of
    the best validated round so far (the later of equals, as FedIOD's selection, keep_if_best, takes it).
    A run that never validated (FedIOD's `selection = "last"`) hands over each epoch's student: its test
    accuracy."""
    validated = validated and any(row.get("val_accuracy") is not None for row in rows)
    points, best_val, chosen = [], None, None
    for row in rows:
        if validated:
            if row.get("val_accuracy") is not None and (best_val is None or row["val_accuracy"] >= best_val):
                best_val, chosen = row["val_accuracy"], row["test_accuracy"]
        else:
            chosen = row.get("test_accuracy")
        if chosen is not None:
            points.append((row["round"], chosen))
    return points


def curve(run: Path, validated: bool = False) -> dict[str, Any]:
    """A run's (cumulative bytes, accuracy) at every evaluation, its final accuracy, total bytes and
    bytes per direction and content kind."""
    by_round, by_kind = ledger_bytes(run / "ledger.jsonl")
    points = []
    for round_, accuracy in accuracy_points(read_jsonl(run / "metrics.jsonl"), validated):
        sent = sum(size for r, size in by_round.items() if r <= round_)
        points.append({"round": round_, "bytes": sent, "accuracy": accuracy})
    if not points:  # e.g. a run killed in its first round, kept with --unfinished
        raise SystemExit(f"{run}: no evaluated round yet, so no curve; run it again (without --unfinished)")
    return {"points": points, "final_accuracy": points[-1]["accuracy"], "total_bytes": sum(by_round.values()),
            "by_kind": by_kind}  # fmt: skip


#: Relative margin of a crossing: a level times FedAvg's final accuracy that a count over the test set
#: equals exactly can come out a rounding error above it (0.9 * 0.8 = 0.7200000000000001 > 0.72), while
#: two accuracies over any test set here differ by far more.
MARGIN = 1e-9


def first_reach(points: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first point whose accuracy reaches `target` (within `MARGIN`); None if none does."""
    return next((p for p in points if p["accuracy"] >= target * (1 - MARGIN)), None)


def reached(curves: dict[str, dict[str, Any]], reference: str = REFERENCE) -> dict[str, Any]:
    """Per method and level: the round and bytes of its first crossing of the level times the reference's
    final accuracy, and those bytes over the reference's at the same level (None where either never got
    there)."""
    final = curves[reference]["final_accuracy"]
    table: dict[str, Any] = {}
    for method, c in curves.items():
        table[method] = {}
        for level in LEVELS:
            point = first_reach(c["points"], level * final)
            ref = first_reach(curves[reference]["points"], level * final)
            table[method][f"{level:.2f}"] = None if point is None else {
                "round": point["round"], "bytes": point["bytes"],
                "ratio": None if ref is None or not ref["bytes"] else point["bytes"] / ref["bytes"]}  # fmt: skip
    return table


def megabytes(n: float) -> str:
    return f"{n / 1e6:.2f}"


def _reach_cell(hit: dict[str, Any] | None) -> list[str]:
    if hit is None:
        return ["-", "-"]
    ratio = "-" if hit["ratio"] is None else f"{hit['ratio']:.3g}"
    return [f"{megabytes(hit['bytes'])} (r{hit['round']})", ratio]


def by_kind_table(result: dict[str, Any]) -> list[str]:
    """Where each method's bytes went: MB per direction and content kind (at least 0.1 MB), largest first."""
    kinds = {m: c["by_kind"] for m, c in result["curves"].items() if "by_kind" in c}
    if not kinds:
        return []
    lines = ["", "Where the bytes went (whole run, MB per direction and content kind):", "",
             "| method | direction and kind | MB |", "|---|---|---|"]  # fmt: skip
    for method, totals in kinds.items():
        lines += [f"| {method} | {key} | {megabytes(size)} |" for key, size in totals.items() if size >= 1e5]
    return lines


def report(result: dict[str, Any]) -> str:
    """The Markdown report: the levels table, the provenance, the reading notes."""
    reference = result["curves"][REFERENCE]["final_accuracy"]
    header = ["method", "final test %", "total MB"]
    for level in LEVELS:
        header += [f"MB to {level:.2f}", "x FedAvg"]
    provenance = f"(commit `{result['commit']}`; {result['machine']})"
    lines = [f"# Bytes to quality: {result['title']}", "", f"Command: `{result['command']}` {provenance}", "",
             f"Levels: fractions of FedAvg's final test accuracy ({100 * reference:.2f}%); MB = 10^6 bytes, both "
             "directions, up to the first evaluation at that level (its round in brackets).", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]  # fmt: skip
    for method, c in result["curves"].items():
        label = method + (
            f" (stopped after round {c['stopped_after']} of {c['rounds']})" if "rounds" in c else ""
        )
        cells = [label, f"{100 * c['final_accuracy']:.2f}", megabytes(c["total_bytes"])]
        for level in LEVELS:
            cells += _reach_cell(result["reached"][method][f"{level:.2f}"])
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", result["note"]] if result.get("note") else []
    lines += by_kind_table(result)
    lines += [
        "",
        f"Runs (under the runs folder): {', '.join(f'`{r}`' for r in result['runs'].values())}.",
        "",
    ]
    return "\n".join(lines) + "\n" + NOTES


def plot(result: dict[str, Any], path: Path) -> None:
    """Accuracy against cumulative MB (log x), one line per method, dotted lines at the levels."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for method, c in result["curves"].items():
        ax.plot([p["bytes"] / 1e6 for p in c["points"]], [100 * p["accuracy"] for p in c["points"]],
                marker="o", ms=3, label=method)  # fmt: skip
    reference = result["curves"][REFERENCE]["final_accuracy"]
    for level in LEVELS:
        ax.axhline(100 * level * reference, ls=":", lw=1, color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("cumulative MB, both directions (log)")
    ax.set_ylabel("test accuracy (%)")
    title = textwrap.fill(result["title"], 70)  # a variant's flags make it long
    ax.set_title(f"{title}\n(dotted: 0.90 / 0.95 / 1.00 of FedAvg's final)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def reference_curve(record: Path, title: str) -> tuple[dict[str, Any], str]:
    """FedAvg's curve and run name from an earlier record of the same set (`--reference`; its `title`
    must be this run's): its bytes do not depend on the machine, so a variant of FedIOD can be measured
    against it without running FedAvg again (on the CIFAR-shaped set 20 rounds of FedAvg move 7.9 GB)."""
    try:
        earlier = json.loads(record.read_text())
        curve, run, made_for = earlier["curves"][REFERENCE], earlier["runs"][REFERENCE], earlier["title"]
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(
            f"--reference {record}: not a bytes-to-quality record with a FedAvg curve ({error})"
        ) from None
    if made_for != title:
        raise SystemExit(f"--reference {record}: a record of {made_for!r}, not of this set ({title!r})")
    return curve, f"{run}, from {record.name}"


def shown_path(path: str) -> str:
    """`path` as a record shows it: from the repository's root when inside it, else its name alone."""
    resolved = Path(path).resolve()
    root = RESULTS.resolve().parents[1]
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else resolved.name


def method_runs(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per method: its algorithm, rounds, `--set` options and further command-line options."""
    if args.demo:
        demo = ["--config", str(DEMO)]
        base = [f"threads={args.threads}"]
        fediod = {"algorithm": "fediod", "rounds": DEMO_SETTING["rounds"], "extra": demo}
        return {
            REFERENCE: {
                "algorithm": "fedavg",
                "rounds": DEMO_SETTING["rounds"],
                "extra": demo,
                "sets": [*base, *args.set],
            },
            "FedIOD (float32)": fediod | {"sets": [*base, "fediod.wire='float32'", *args.set]},
            "FedIOD (compact)": fediod | {"sets": [*base, "fediod.wire='compact'", *args.set]},
            "FedDF": {
                "algorithm": "feddf",
                "rounds": DEMO_SETTING["rounds"],
                "extra": demo,
                "sets": [*base, *args.set, f"feddf.local_epochs={DEMO_LOCAL_EPOCHS}", *args.feddf_set],
            },
        }
    common = [f"threads={args.threads}", f"device='{args.device}'", *shape_sets(args)]
    fediod_sets = [*common, f"fediod.teacher_epochs={args.teacher_epochs}", f"fediod.iters_per_epoch={args.iters}",
                   *STABILISERS]  # fmt: skip
    local = ["--local-epochs", "1"]
    resampled = args.image_size or args.channels  # the other set would keep its own shape: noise instead
    source = args.feddf_source or ("noise" if resampled else OTHER.get(args.dataset, "noise"))
    return {
        REFERENCE: {"algorithm": "fedavg", "rounds": args.fedavg_rounds, "extra": local, "sets": common},
        "FedIOD (float32)": {"algorithm": "fediod", "rounds": args.epochs, "extra": [],
                             "sets": [*fediod_sets, "fediod.wire='float32'", *args.set]},
        "FedIOD (compact)": {"algorithm": "fediod", "rounds": args.epochs, "extra": [],
                             "sets": [*fediod_sets, "fediod.wire='compact'", *args.set]},
        "FedDF": {"algorithm": "feddf", "rounds": args.feddf_rounds, "extra": local,
                  "sets": [*common, f"feddf.source='{source}'", *args.feddf_set]},
    }  # fmt: skip


def set_name(args: argparse.Namespace) -> str:
    """The result files' suffix: `digits` for the demo, else `<dataset>-alpha<alpha>` and any variant."""
    if args.demo:
        return "digits"
    return f"{args.dataset}-alpha{args.alpha}{'' if args.model == 'lenet-fedmdcg' else '_' + args.model}" + (
        variant_suffix(args)
    )


def command_line(args: argparse.Namespace) -> str:
    """The command as the result file records it (no machine paths)."""
    sets = "".join(f" --set {item}" for item in args.set)
    sets += "".join(f" --feddf-set {item}" for item in args.feddf_set)
    sets += "" if args.methods == ",".join(METHODS) else f" --methods {args.methods}"
    sets += f" --tag {args.tag}" if args.tag else ""
    sets += f" --reference {shown_path(args.reference)}" if args.reference else ""
    sets += " --unfinished" if args.unfinished else ""
    if args.demo:
        return (
            f"python benchmarks/bytes_to_quality.py --demo --seed {args.seed} --threads {args.threads}{sets}"
        )
    return (f"python benchmarks/bytes_to_quality.py --dataset {args.dataset} --alpha {args.alpha} "
            f"--clients {args.clients} --model {args.model} --epochs {args.epochs} --iters {args.iters} "
            f"--teacher-epochs {args.teacher_epochs} --fedavg-rounds {args.fedavg_rounds} "
            f"--feddf-rounds {args.feddf_rounds}"
            + (f" --feddf-source {args.feddf_source}" if args.feddf_source else "")
            + f" --seed {args.seed} --threads {args.threads}" + variant_flags(args) + sets)  # fmt: skip


def machine(device: str, gflops: float, threads: int, runs: Sequence[Path] = ()) -> str:
    """The host as a record names it: the CPU, kernel path and card its runs' summaries name (older runs: the
    CPU count here and the card a summary's `device_name` recorded), and this CPU's matmul rate."""
    summaries = [json.loads((r / "summary.json").read_text()) for r in runs if (r / "summary.json").is_file()]
    rate = f"fp32 matmul {gflops:.1f} GFLOP/s at {threads} thread(s)"
    if device.startswith("cuda") and not torch.cuda.is_available():
        rate += " on the machine that rendered the table"  # not the GPU host's: it is measured here
    if any("machine" in summary for summary in summaries):  # runs that name their CPU, kernels and card
        return f"{of_summaries(summaries)}; {rate}"
    card = ""
    if device.startswith("cuda"):
        recorded = [json.loads((r / "summary.json").read_text()).get("device_name") for r in runs
                    if (r / "summary.json").is_file()]  # fmt: skip
        named = sorted({name.split(" (", 1)[-1].rstrip(")") for name in recorded if name and "(" in name})
        if torch.cuda.is_available():
            card = f", {torch.cuda.get_device_name(torch.device(device))}"
        elif named:
            card = f", {' and '.join(named)} (rendered from its runs on a machine without a GPU)"
        else:
            card = ", rendered from CUDA runs on a machine without a GPU"
    return f"{os.cpu_count()} CPUs{card}; {rate}"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run every method (or keep it with `--reuse`) and read its curve; the whole result."""
    if args.demo:
        args.dataset, args.clients = DEMO_SETTING["dataset"], DEMO_SETTING["clients"]
        alpha, model = DEMO_SETTING["alpha"], DEMO_SETTING["model"]
    else:
        alpha, model = args.alpha, args.model
    prefix = f"b2q-{set_name(args)}-seed{args.seed}"
    title = "digits demo (K = 10, alpha 0.5, small-cnn)" if args.demo else (
        f"{args.dataset}, alpha {args.alpha}, K = {args.clients}, {args.model}{variant_flags(args)}")  # fmt: skip
    curves, runs = {}, {}
    chosen = [METHODS[key] for key in args.methods.split(",")] + ([REFERENCE] if args.reference else [])
    for method, spec in method_runs(args).items():
        if method not in chosen:
            continue
        if method == REFERENCE and args.reference:  # a published record's FedAvg, not run again
            curves[method], runs[method] = reference_curve(Path(args.reference), title)
            continue
        name = f"{prefix}-{next(key for key, label in METHODS.items() if label == method)}"
        name += f"-{args.tag}" if args.tag and method != REFERENCE else ""  # FedAvg's run serves every tag
        run = Path(args.out) / name / spec["algorithm"]
        stopped = (
            args.unfinished and not (run / "summary.json").is_file() and (run / "metrics.jsonl").is_file()
        )
        if not stopped:
            run_fedistill(spec["algorithm"], args, name=name, alpha=str(alpha), model=model,
                          rounds=spec["rounds"], out=args.out, sets=spec["sets"], extra=spec["extra"])  # fmt: skip
        curves[method] = curve(run, validated=spec["algorithm"] == "fediod")
        if stopped:  # killed before its last round: its curve as far as it got, named so in the report
            curves[method] |= {
                "stopped_after": curves[method]["points"][-1]["round"],
                "rounds": spec["rounds"],
            }
        runs[method] = f"{name}/{spec['algorithm']}"
    return {
        "title": title,
        "curves": curves,
        "runs": runs,
        "reached": reached(curves) if REFERENCE in curves else {},
    }


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--demo", action="store_true", help="the digits demo's settings (demo.toml)")
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--alpha", default="0.1")
    add_budget_arguments(parser, set_help="FedIOD's options")
    parser.add_argument("--feddf-rounds", type=int, default=50)
    parser.add_argument(
        "--feddf-source", default="", help="FedDF's distillation data (default: the other set)"
    )
    add_device_and_shape(parser)
    parser.add_argument(
        "--feddf-set", action="append", default=[], metavar="KEY=VALUE", help="FedDF's options"
    )
    parser.add_argument(
        "--methods", default=",".join(METHODS), help="a subset; without fedavg: the runs only"
    )
    parser.add_argument("--note", default="", help="a sentence for the report (e.g. why a method is missing)")
    parser.add_argument(
        "--unfinished",
        action="store_true",
        help="keep runs stopped before their last round (e.g. by a time limit) as far as they got, "
        "instead of running them again",
    )
    parser.add_argument(
        "--tag",
        default="",
        help="a variant's name (with its --set items): its FedIOD and FedDF runs and its result files "
        "(results/sweeps/..._<tag>) carry it, the published files stay as they are",
    )
    parser.add_argument(
        "--reference",
        default="",
        metavar="RECORD.json",
        help="take FedAvg's curve from this earlier record of the same set instead of running it again",
    )
    add_seed_and_out(parser)
    args = parser.parse_args()
    unknown = [m for m in args.methods.split(",") if m not in METHODS]
    if unknown:
        parser.error(f"--methods: choose among {', '.join(METHODS)} (got {args.methods!r})")
    check_shape(parser, args, [] if args.demo else [args.dataset])
    torch.set_num_threads(args.threads)
    gflops = matmul_peak_gflops()
    result = measure(args)
    if REFERENCE not in result["curves"]:  # runs made for a later `--reuse`; no levels without FedAvg
        print(
            f"Runs done: {', '.join(result['runs'].values())}; no table without FedAvg (--methods fedavg,...)"
        )
        return
    result |= {"command": command_line(args), "commit": head_commit(),
               "machine": machine(args.device, gflops, args.threads,
                                  [Path(args.out) / run for run in result["runs"].values()]),
               "matmul_peak_gflops": gflops, "note": args.note}  # fmt: skip
    folder = RESULTS / "sweeps" if args.tag else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"bytes_to_quality_{set_name(args)}" + (f"_{args.tag}" if args.tag else "")  # no with_suffix
    disk.write_text(folder / f"{stem}.md", report(result))
    disk.write_text(folder / f"{stem}.json", json.dumps(result, indent=2) + "\n")
    plot(result, folder / f"{stem}.png")
    print(report(result))


if __name__ == "__main__":
    main()
