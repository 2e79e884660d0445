"""`fedistill reproduce`: list the reproducible results, or reproduce one at a scale.

    fedistill reproduce --list
    fedistill reproduce NAME [--scale ci|cpu|paper] [--seeds 0,1,2] [--rows TEXT ...] [--jobs N] [--out DIR]

Runs what is missing (a finished run is reused, an interrupted one resumes), then writes table.md,
table.json and table.png into <out>/reproduce/<NAME>-<scale>/. Exit code 0 when every checked number is
within its tolerance, 1 when one is not (or has no result) or a run failed, 2 for a usage mistake.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path

from fedistill import interrupt
from fedistill.errors import UserError
from fedistill.reproduce.paths import DATA, DATA_ENV, require_configs
from fedistill.reproduce.target_spec import SCALES, Target

INTERRUPTED = (
    "fedistill: interrupted; run the same command again to continue "
    "(finished runs are reused, interrupted ones resume)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="the target to reproduce (see --list)")
    parser.add_argument("--list", action="store_true", help="list every target with its scales and runs")
    parser.add_argument("--scale", default="ci", help=f"one of {', '.join(SCALES)} (default: ci)")
    parser.add_argument(
        "--seeds", help="comma list of seeds for every run, e.g. 0,1,2 (default: the target's)"
    )
    parser.add_argument(
        "--rows",
        action="append",
        default=[],
        metavar="TEXT",
        help="only the rows whose label matches TEXT (a regular expression, any case; repeat to narrow"
        " further) and only the runs they read",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at once, each in its own process (default: 1); the cores are shared between them",
    )
    parser.add_argument(
        "--out",
        default="runs",
        help="parent folder: writes <out>/reproduce/<NAME>-<scale>/ (default: runs, in the current folder)",
    )
    parser.add_argument(
        "--data-dir",
        default=str(DATA),
        help=f"folder holding the dataset files (default: ${DATA_ENV}, else a checkout's ../shared/data,"
        " else data)",
    )


def runs_per_scale(target: Target) -> str:
    """`ci 7 runs | cpu 33 runs`: every (run, seed) a scale starts."""
    counts = []
    for scale in SCALES:
        if scale in target.scales:
            spec = target.scales[scale]
            counts.append(f"{scale} {sum(len(spec.seeds_of(run)) for run in spec.runs)} runs")
    return " | ".join(counts)


def list_targets() -> None:
    from fedistill.reproduce.targets import all_targets

    for target in all_targets().values():
        print(f"{target.name:<24} {runs_per_scale(target)}")
        print(f"{'':<4}{target.title} ({target.source})")


def parse_seeds(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise UserError(f"--seeds takes a comma list of whole numbers, e.g. 0,1,2; got {text!r}") from None
    if len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise UserError(f"--seeds takes distinct whole numbers >= 0; got {text!r}")
    return seeds


def reproduce(args: argparse.Namespace) -> int:
    from fedistill.reproduce import worker_pool
    from fedistill.reproduce.execute import execute_all, state
    from fedistill.reproduce.needed_data import require_data
    from fedistill.reproduce.plan import plan
    from fedistill.reproduce.report import write_report
    from fedistill.reproduce.targets import get_target
    from fedistill.reproduce.verdict import checks, exit_code

    if args.scale not in SCALES:
        raise UserError(f"unknown scale {args.scale!r} (valid: {', '.join(SCALES)})")
    target = get_target(args.name, args.scale)
    if args.rows:
        target = target.narrowed(args.scale, tuple(args.rows))
    seeds = parse_seeds(args.seeds)
    if args.jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {args.jobs}")
    _say_if_seeds_replace_recorded(target, args.scale, seeds)
    folder = Path(args.out) / "reproduce" / f"{target.name}-{args.scale}"
    # a run leaving `threads` to torch gets the count it will run on in its config, and so in its digest
    threads = worker_pool.run_threads(args.jobs)
    jobs = plan(target, args.scale, folder / "runs", args.data_dir, seeds, threads=threads)
    require_data(
        [job for job in jobs if state(job) != "finished"], args.data_dir
    )  # a finished run reads none
    require_writable(folder / "runs", args.out)
    print(f"reproduce {target.name} ({args.scale}): {len(jobs)} runs in {folder / 'runs'}", file=sys.stderr)
    outcomes = execute_all(jobs, args.jobs)
    folders: dict[str, list[Path]] = {}
    for job in jobs:
        folders.setdefault(job.run, []).append(job.folder)
    cells = checks(target, args.scale, folders)
    markdown = write_report(folder, target, args.scale, cells, outcomes)
    print(markdown.read_text(encoding="utf-8"))
    print(
        f"written: {markdown.parent / 'table'}.md, .json and .png",
        file=sys.stderr,
    )
    return exit_code(cells, any(o.status == "failed" for o in outcomes))


def require_writable(runs: Path, out: str) -> None:
    """A one-line UserError naming `--out` when the runs' folder cannot be made or written (a file in the
    way, no permission): else every run would fail on its own and the table could not be written."""
    try:
        runs.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=runs).close()
    except OSError as exc:
        raise UserError(
            f"--out {out}: cannot write {runs} ({exc.strerror or exc}); pass --out a folder you can write"
        ) from None


def _say_if_seeds_replace_recorded(target: Target, scale: str, seeds: tuple[int, ...] | None) -> None:
    """A recorded mean was taken over the target's own seeds: other seeds give another sample of the same
    runs, so a cell outside its tolerance then says less than it does with the recorded seeds. Runs may be
    recorded on different seeds: the note is due when `seeds` differ from any run's."""
    spec = target.scales[scale]
    own = sorted({tuple(sorted(spec.seeds_of(run))) for run in spec.runs})
    if seeds is not None and any(tuple(sorted(seeds)) != run_seeds for run_seeds in own):
        shown = " or ".join(",".join(map(str, run_seeds)) for run_seeds in own)
        print(
            f"note: --seeds {','.join(map(str, seeds))} replaces the seeds the recorded numbers were taken "
            f"over ({shown}{', by run' if len(own) > 1 else ''}); the table compares other runs with them",
            file=sys.stderr,
        )


def run_command(args: argparse.Namespace) -> int:
    """`--list`, or reproduce `args.name`; a usage mistake ends with one line and exit code 2, Ctrl-C with
    one line and 130 that says how to go on (the same command, not `fedistill run --resume` of one run),
    SIGTERM (where the command line takes it as Ctrl-C) with the same advice and 143."""
    try:
        require_configs()
        if args.list:
            list_targets()
            return 0
        if not args.name:
            raise UserError("name a target to reproduce, or pass --list to see them")
        return reproduce(args)
    except UserError as exc:
        print(f"fedistill: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if interrupt.terminated():
            from fedistill.reproduce.execute import STOPPED

            print(STOPPED, file=sys.stderr)
            return 128 + signal.SIGTERM
        print(INTERRUPTED, file=sys.stderr)
        return 130
