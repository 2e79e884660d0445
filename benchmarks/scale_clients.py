"""How wall time and memory grow with the number of clients: FedAvg and FedDF with 100, 300 and 1,000
MNIST clients (a fraction of them sampled per round), FedIOD with 100 and 1,000 sites, in-process and on
Flower's simulation engine (the `-simulation` cases).

Every run is `fedistill run` in its own process, so its peak memory is its own. Memory, two ways:
`peak_rss_mb` is the run process's ru_maxrss from os.wait4 (the largest single process of its tree);
`tree_peak_mb` is the peak over time of the summed PSS (proportional set size, /proc/<pid>/smaps_rollup)
of the run process and all its descendants, sampled every `--sample-s` seconds: on the simulation
engine that adds Ray's workers, raylet and GCS, with shared pages (Ray's object store) counted once.
Round times come from each run's metrics.jsonl (`round_time_s`).

    python benchmarks/scale_clients.py [--data-dir ../shared/data] [--out benchmarks/runs/scale-runs] \
        [--cases fedavg,feddf,fediod,fedavg-simulation,feddf-simulation,fediod-simulation] \
        [--sizes 100,300,1000] [--fraction 0.1] \
        [--set fediod.sites_per_step=100 ...] [--append] [--device cuda]

`--set KEY=VALUE` (repeatable) passes a config key to every run after the case's own (e.g. FedIOD's
per-step site sampling); the rows record it. FedIOD runs 100 and 1,000 sites unless `--sizes` names others.
On a GPU (`--device cuda`) each row adds the card's peak allocation, into scale_clients_cuda.{md,json}.
Writes benchmarks/results/scale_clients.{md,json}; `--append` keeps the rows already there (a row with the
same case, size and settings is replaced).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fediod_step_time import matmul_peak_gflops  # noqa: E402
from fedistill import disk  # noqa: E402
from fedistill.reproduce.arguments import check_device, shown_arguments  # noqa: E402
from fedistill.reproduce.paths import DATA, RUNS  # noqa: E402

RESULTS = HERE / "results"
FEDIOD_SIZES = (100, 1000)  # FedIOD queries every site at every generator step: two sizes only
FEDDF_SET = ("feddf.steps=20", "feddf.eval_every_steps=10")
FEDIOD_SET = ("fediod.preset=paper", "fediod.teacher_epochs=1", "fediod.iters_per_epoch=2",
              "fediod.generator_width=16", "fediod.discriminator_width=16")  # fmt: skip
CASES = {  # name: (algorithm, transport, extra --set items)
    "fedavg": ("fedavg", "inprocess", ()),
    "feddf": ("feddf", "inprocess", FEDDF_SET),
    "fediod": ("fediod", "inprocess", FEDIOD_SET),
    "fedavg-simulation": ("fedavg", "flower", ()),
    "feddf-simulation": ("feddf", "flower", FEDDF_SET),
    "fediod-simulation": ("fediod", "flower", FEDIOD_SET),
}


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, from the parent ids in /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(parents.get(current, []))
    return tree


def pss_mb(pid: int) -> float:
    """A process's proportional set size in MiB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def run_measured(command: list[str], sample_s: float, log: Path) -> dict[str, float]:
    """Run `command`; its wall time, its own ru_maxrss and the sampled peak PSS of its process tree."""
    started = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    peak, done = [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], sum(pss_mb(p) for p in descendants(process.pid)))
            done.wait(sample_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    sampler.join()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({process.returncode}):\n{log.read_text()[-3000:]}")
    return {"wall_s": time.monotonic() - started, "peak_rss_mb": usage.ru_maxrss / 1024.0,
            "tree_peak_mb": peak[0]}  # fmt: skip


def one_run(case: str, clients: int, args: argparse.Namespace) -> dict:
    """One case at one size, as its own `fedistill run`, with the `--set` items after the case's own."""
    algorithm, transport, extra = CASES[case]
    extra = (*extra, *args.set)
    name = f"{case}-{clients}" + "".join(f"-{item.rsplit('.', 1)[-1]}" for item in args.set)
    command = [sys.executable, "-m", "fedistill.cli", "run", "--quiet", "--algorithm", algorithm,
               "--dataset", args.dataset, "--data-dir", args.data_dir, "--model", args.model,
               "--clients", str(clients), "--rounds", str(args.rounds), "--local-epochs", "1",
               "--transport", transport, "--out", args.out, "--name", name,
               "--set", "threads=1", "--set", f"fraction={args.fraction}", "--device", args.device]  # fmt: skip
    for item in extra:
        command += ["--set", item]
    measured = run_measured(command, args.sample_s, Path(args.out) / f"{name}.stderr")
    run = Path(args.out) / name / algorithm
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    row = {"case": case, "algorithm": algorithm, "transport": transport, "clients": clients,
           "sampled": rows[-1].get("clients", "all"), "set": list(args.set), "round_times_s": [r["round_time_s"] for r in rows],
           "setup_s": summary.get("setup_time_s"), "run_wall_s": summary["wall_time_s"],
           # sites that loaded their stage-1 model from the runs folder's cache: set-up is then no training
           "stage1_cached": summary.get("final", {}).get("teachers_from_cache"),
           "test_accuracy": summary.get("test_accuracy"), **measured,
           **({"device": args.device, "device_name": torch.cuda.get_device_name(args.device),
               "device_peak_mb": summary.get("device_peak_memory_mb")}
              if args.device != "cpu" else {})}  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def growth(rows: list[dict]) -> list[dict]:
    """Per case, the peak memory and mean round time at the largest size over those at the smallest."""
    out = []
    for case, settings in dict.fromkeys((r["case"], tuple(r.get("set", []))) for r in rows):
        mine = [r for r in rows if r["case"] == case and tuple(r.get("set", [])) == settings]
        mine = sorted(mine, key=lambda r: r["clients"])
        if len(mine) < 2:
            continue
        small, large = mine[0], mine[-1]
        mean = lambda r: sum(r["round_times_s"]) / len(r["round_times_s"])  # noqa: E731
        out.append({"case": case, "set": list(settings), "from": small["clients"], "to": large["clients"],
                    "memory_mb": large["tree_peak_mb"] - small["tree_peak_mb"],
                    "memory_x": large["tree_peak_mb"] / small["tree_peak_mb"],
                    "round_x": mean(large) / mean(small)})  # fmt: skip
    return out


def sampled(row: dict) -> str:
    """Who takes part: the clients sampled per round, or FedIOD's sites per G-step (`sites_per_step`)."""
    for item in row.get("set", []):
        if item.startswith("fediod.sites_per_step="):
            return f"{item.split('=', 1)[1]} per G-step"
    return "all" if row["sampled"] in (None, "all") else str(row["sampled"])


def write(args: argparse.Namespace, rows: list[dict], gflops: float) -> None:
    """The table and the raw rows."""
    command = " ".join(["python benchmarks/scale_clients.py", *shown_arguments(sys.argv[1:])])
    cpus = getattr(args, "cpus", None) or os.cpu_count()
    commands = args.earlier_commands if args.table_only else [*args.earlier_commands, command]
    command = commands[-1]  # a table rewritten from its rows keeps the command that measured them
    record = {"command": command, "commands": commands, "matmul_peak_gflops_1thread": gflops, "cpus": cpus,
              "torch": torch.__version__, "rows": rows, "growth": growth(rows)}  # fmt: skip
    gpu = args.device.startswith("cuda")
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    disk.write_text(results / f"{stem(args)}.json", json.dumps(record, indent=2) + "\n")
    lines = [
        f"# Scale: clients per run ({args.dataset}, {args.model}, fraction {args.fraction}, threads=1)",
        "",
        *(f"Command: `{c}`" + ("" if i == len(commands) - 1 else "  ") for i, c in enumerate(commands)),
        "",
        f"Machine: {cpus} CPUs, single-thread fp32 matmul {gflops:.1f} GFLOP/s at the last command "
        "(`matmul_peak_gflops`, benchmarks/fediod_step_time.py), shared with other jobs while measured."
        + (
            f" Device: {args.device} ({', '.join(sorted({r.get('device_name', '?') for r in rows}))});"
            " *GPU peak* is the run's largest"
            " allocation on the card at once (`torch.cuda.max_memory_allocated`, the summary's"
            " device_peak_memory_mb)."
            if gpu
            else ""
        ),
        "",
        "Memory: *peak RSS* is the run process's ru_maxrss (os.wait4); *tree peak* is the sampled peak of",
        "the summed PSS of the run process and its descendants (Ray's workers on the simulation engine).",
        "Round time: `round_time_s` of each round (metrics.jsonl); *set-up s* is the summary's setup_time_s",
        "(server set-up before round 1: FedIOD's stage 1; *teachers cached*: the sites loaded their stage-1",
        "models from an earlier run's cache in the runs folder, so no training is in it); *process s* is the",
        "whole command (imports, data, building the clients, plots, checkpoints included). The matmul rate is",
        "measured under the same load.",
        "",
        "*set*: the `--set` items of that run beyond the case's own (FedIOD's `sites_per_step`: sites per G-step;",
        "`reference_samples`: the test images stage 1's teacher report scores, evaluation only, which bounds",
        "its K x N logits and its time).",
        "",
        "| case | transport | clients | sampled | set | round s | set-up s | process s | peak RSS MiB | tree peak MiB |"
        + (" GPU peak MiB |" if gpu else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if gpu else ""),
    ]
    for r in rows:
        rounds = ", ".join(f"{t:.2f}" for t in r["round_times_s"])
        setup = f"{r['setup_s']:.1f}" if r["setup_s"] is not None else "-"
        setup += " (teachers cached)" if r.get("stage1_cached") else ""
        settings = ", ".join(r.get("set", [])) or "-"
        lines.append(f"| {r['case']} | {r['transport']} | {r['clients']} | {sampled(r)} | {settings} | {rounds} | {setup} | "
                     f"{r['wall_s']:.1f} | {r['peak_rss_mb']:.0f} | {r['tree_peak_mb']:.0f} |"
                     + (f" {r.get('device_peak_mb') or 0:.0f} |" if gpu else ""))  # fmt: skip
    lines += [
        "",
        "| case | set | from | to | tree peak growth MiB | x memory | x round time |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in record["growth"]:
        lines.append(f"| {g['case']} | {', '.join(g['set']) or '-'} | {g['from']} | {g['to']} | {g['memory_mb']:+.0f} | {g['memory_x']:.2f} | "
                     f"{g['round_x']:.2f} |")  # fmt: skip
    disk.write_text(results / f"{stem(args)}.md", "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", default=str(DATA))
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--cases", default="fedavg,feddf,fediod,fedavg-simulation")
    parser.add_argument("--sizes", default=None, help="default 100,300,1000 (FedIOD: 100,1000)")
    parser.add_argument(
        "--fraction", type=float, default=0.1, help="clients sampled per round (FedAvg, FedDF)"
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--sample-s", type=float, default=0.5, help="memory sampling period")
    parser.add_argument("--out", default=str(RUNS / "scale-runs"))
    parser.add_argument("--results", default=str(RESULTS), help="where the table is written")
    parser.add_argument(
        "--device", default="cpu", help="every run's device; not cpu: files scale_clients_<device>"
    )
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for every run (repeatable)")
    parser.add_argument("--append", action="store_true", help="keep the rows already in the results")
    parser.add_argument("--table-only", action="store_true", help="rewrite the table from the results' rows")
    args = parser.parse_args()
    if not args.table_only:  # a device this machine lacks: one line now, not a failed run later
        check_device(parser, args.device)
    torch.set_num_threads(1)
    if args.table_only:
        rows, args.earlier_commands = earlier_results(Path(args.results), stem(args))
        record = json.loads((Path(args.results) / f"{stem(args)}.json").read_text())
        args.cpus = record.get("cpus")  # the machine that measured, not the one rewriting
        write(args, rows, record["matmul_peak_gflops_1thread"])
        return
    gflops = matmul_peak_gflops()
    sizes = [int(s) for s in (args.sizes or "100,300,1000").split(",")]
    rows, args.earlier_commands = earlier_results(Path(args.results), stem(args)) if args.append else ([], [])
    for case in args.cases.split(","):
        for clients in [s for s in sizes if not case.startswith("fediod") or args.sizes or s in FEDIOD_SIZES]:
            row = one_run(case, clients, args)
            rows = [r for r in rows if row_key(r) != row_key(row)] + [row]
            write(args, rows, gflops)  # the table so far, should a later run fail
    write(args, rows, gflops)


def row_key(row: dict) -> tuple:
    """What makes two rows the same measurement: case, size and extra settings."""
    return row["case"], row["clients"], tuple(row.get("set", []))


def stem(args: argparse.Namespace) -> str:
    """The results' file name: one table per device, so a GPU's rows never mix with the CPU's."""
    return "scale_clients" + ("" if args.device == "cpu" else f"_{args.device.replace(':', '')}")


def earlier_results(results: Path, name: str) -> tuple[list[dict], list[str]]:
    """The rows of the results already written and the commands that wrote them (none if none)."""
    path = results / f"{name}.json"
    if not path.is_file():
        return [], []
    record = json.loads(path.read_text())
    return record["rows"], record.get("commands", [record["command"]])


if __name__ == "__main__":
    main()
