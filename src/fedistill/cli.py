"""The `fedistill` command: run, list, summary, and the commands that live in their own modules
(predict, export, reproduce).

A user mistake (unknown name, bad value, missing file, unreadable config) ends with one line on
stderr and exit code 2; a run that cannot go on (a diverging loss, too few clients) with one line
and exit code 1, the details in the run's run.log.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import signal
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any, NoReturn

from fedistill import interrupt
from fedistill.errors import FederationError, UserError
from fedistill.version import __version__

#: CLI flag -> config key, for the flags that are shortcuts of config keys.
FLAG_KEYS = {
    "algorithm": "algorithm",
    "dataset": "dataset",
    "data_dir": "data_dir",
    "site_data_dir": "site_data_dir",
    "model": "model",
    "clients": "clients",
    "alpha": "alpha",
    "partition": "partition",
    "rounds": "rounds",
    "local_epochs": "local_epochs",
    "local_steps": "local_steps",
    "batch_size": "batch_size",
    "lr": "lr",
    "seed": "seed",
    "out": "out",
    "name": "name",
    "transport": "transport",
    "device": "device",
    "track": "track",
}

#: Commands whose arguments and handler live in their own module (`add_arguments`, `run_command`).
MODULE_COMMANDS = {
    "predict": ("fedistill.inference.predict", "label or segment images and volumes, or reconstruct scans"),
    "export": ("fedistill.inference.export", "write a run's model as safetensors, ONNX or TorchScript"),
    "reproduce": ("fedistill.reproduce.command", "reproduce a paper's table and check it (see --list)"),
    "deploy": ("fedistill.engine.flower.deploy", "credentials for an authenticated Flower deployment"),
}

#: Commands that a SIGTERM stops as the first Ctrl-C does, with exit code 143: what runs for long.
STOPPED_BY_SIGTERM = {"run", "reproduce"}


#: What `fedistill run` runs when given no options: the main job on the embedded digits data.
DEMO_CONFIG = Path(__file__).parent / "engine" / "demo.toml"
#: Flags that say where and how a run goes, not what it runs: with only these, `run` still runs the demo.
PLACEMENT_KEYS = {"out", "name", "transport", "device", "track"}


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage mistakes are one line on stderr (exit 2), like every other mistake
    `fedistill` reports, instead of argparse's usage block; `--help` still prints the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parse_arguments(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`parser.parse_args`, except that an unknown option is refused by the subcommand it was given to,
    with the closest of that command's options. Why: argparse refuses it at the top, as `fedistill:
    error: unrecognized arguments` pointing at `fedistill --help`, which lists no option of `run`. A
    misspelt command gets the closest command, where argparse lists them all."""
    words = sys.argv[1:] if argv is None else argv
    commands = _subcommands(parser)
    misspelt = words[0] if words and not words[0].startswith("-") and words[0] not in commands else ""
    if misspelt and (close := difflib.get_close_matches(misspelt, list(commands), n=1)):
        parser.error(
            f"unknown command {misspelt!r}; did you mean {close[0]!r}? (valid: {', '.join(commands)})"
        )
    args, unknown = parser.parse_known_args(argv)
    if not unknown:
        return args
    command = commands[args.command]
    options = [name for action in command._actions for name in action.option_strings]  # argparse's own
    message = f"unrecognized arguments: {' '.join(unknown)}"
    assignments = getattr(args, "set", None) or []
    if assignments and (unknown[0].startswith("=") or any(item.endswith("=") for item in assignments)):
        message += (
            "; --set takes KEY=VALUE as one word, without spaces around '=' (e.g. --set fedprox.mu=0.1)"
        )
    for word in (w.split("=", 1)[0] for w in unknown if w.startswith("--")):
        close = difflib.get_close_matches(word, options, n=1) or difflib.get_close_matches(
            word.replace("_", "-"), options, n=1
        )
        if close:
            message += f"; did you mean {close[0]}?"
            break
    command.error(message)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parsers of `parser`'s subcommands, by name."""
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def build_parser(module_commands: tuple[str, ...] | None = None) -> argparse.ArgumentParser:
    """The `fedistill` argument parser: run, list, summary and the module commands. Only the module
    commands named in `module_commands` (default: all) import their module for their arguments; the
    others appear by name and help alone. Why: those modules pull in torch, SciPy and the medical
    readers, seconds that `fedistill --help` or `fedistill run` should not wait for."""
    parser = OneLineParser(
        prog="fedistill",
        description="Federated learning by distillation (FedIOD, FedDF, FedMD-CG, baselines).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    placement = ", ".join(f"--{flag.replace('_', '-')}" for flag in FLAG_KEYS if flag in PLACEMENT_KEYS)
    run = commands.add_parser(
        "run",
        help="run one or more algorithms side by side (default: the demo on digits)",
        description=(
            "Run one or more algorithms side by side on the same partition. Without options, or with only "
            f"{placement} or --quiet, it runs the demo ({DEMO_CONFIG.name}: FedIOD, Standalone, FedAvg and "
            "Centralized on digits); any other option runs the plain defaults instead, which the options "
            "change. Later sources win: the defaults, --config, the flags, then --set."
        ),
    )
    run.add_argument("--algorithm", help="algorithm name, or several separated by commas")
    run.add_argument("--dataset", help="dataset name (see `fedistill list`)")
    run.add_argument("--data-dir", help="folder holding the dataset files")
    run.add_argument(
        "--site-data-dir",
        help="each site's own folder ({site}: its number), for sites that hold only their own records; the "
        "server then reads --data-dir for its test and validation data",
    )
    run.add_argument("--download", action="store_true", help="download missing dataset files (md5-checked)")
    run.add_argument("--model", help="model name (see `fedistill list`)")
    run.add_argument("--clients", type=int, help="number of clients K")
    run.add_argument("--alpha", type=float, help="Dirichlet concentration (smaller: more heterogeneous)")
    run.add_argument("--partition", help="partitioner name (see `fedistill list`)")
    run.add_argument("--rounds", type=int, help="communication rounds")
    run.add_argument("--local-epochs", type=int, help="local epochs per round")
    run.add_argument("--local-steps", type=int, help="local mini-batch steps per round (overrides epochs)")
    run.add_argument("--batch-size", type=int, help="mini-batch size of local training")
    run.add_argument("--lr", type=float, help="learning rate of local training")
    run.add_argument(
        "--seed", type=int, help="the one seed of the run: partition, initialisation, sampling, client order"
    )
    run.add_argument("--out", help="parent folder of run directories (default: runs)")
    run.add_argument(
        "--name", help="run directory name under --out (default: <dataset>-<time>, then -2, -3, ... if taken)"
    )
    run.add_argument(
        "--transport",
        choices=["inprocess", "flower"],
        help="how messages travel (flower: its simulation engine)",
    )
    run.add_argument(
        "--device",
        help="auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N or mps; with --resume: where it goes on",
    )
    run.add_argument(
        "--track", metavar="TRACKERS", help="stream the run to tensorboard, mlflow or both (comma-separated)"
    )
    run.add_argument("--config", metavar="FILE.toml", help="a TOML config file")
    run.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="any config key, e.g. fedprox.mu=0.1 (repeatable; the value is read as TOML, else as text)",
    )
    run.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run directory from its last checkpoint with its saved config (only --device, "
        "--dry-run and --quiet go with it)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="check the run's set-up (or --resume's) as a run does, print its plan and write nothing",
    )

    listing = commands.add_parser("list", help="list algorithms, datasets, models and partitioners")
    listing.add_argument(
        "--options", metavar="NAME", help="every option of algorithm NAME with its default and one line"
    )

    summary = commands.add_parser("summary", help="show the results of a run directory")
    summary.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="a run directory written by `fedistill run` (every algorithm of the run), or one algorithm's "
        "folder in it",
    )
    for name, (module, help_text) in MODULE_COMMANDS.items():
        sub = commands.add_parser(name, help=help_text)
        if module_commands is None or name in module_commands:
            importlib.import_module(module).add_arguments(sub)
    return parser


def config_from_args(args: argparse.Namespace) -> Any:
    """The run's config: the demo when no experiment option is given, else config file, flags, `--set`."""
    from fedistill.config import RunConfig, build_config, load_toml, parse_assignment
    from fedistill.engine.key_homes import key_homes

    layers: list[dict[str, Any]] = []
    flags = {key: getattr(args, flag) for flag, key in FLAG_KEYS.items() if getattr(args, flag) is not None}
    chosen = set(flags) - PLACEMENT_KEYS
    if not (args.config or chosen or args.set or args.download):
        print(f"fedistill: no experiment options given, running the demo: {DEMO_CONFIG}", file=sys.stderr)
        layers.append(load_toml(DEMO_CONFIG))
    if args.config:
        layers.append(load_toml(args.config))
    if args.download:
        flags["download"] = True
    layers.append(flags)
    layers.append(dict(parse_assignment(item) for item in args.set))
    return build_config(RunConfig(), *layers, homes=key_homes)


#: The run folder the current command writes, for the messages of an interrupted or failed run.
_CURRENT_RUN: list[Path] = []


def command_run(args: argparse.Namespace) -> int:
    """`fedistill run`: a new run (validated before anything is written) or `--resume` of one."""
    from fedistill.engine.dry_run import plan_new, plan_resume
    from fedistill.engine.launch import continue_suite, start_suite
    from fedistill.engine.summary import print_results

    progress = not args.quiet
    if args.resume:
        given = [flag for flag in FLAG_KEYS if flag != "device" and getattr(args, flag) is not None] + (
            ["set"] if args.set else []
        )
        if given or args.config or args.download:
            raise UserError(
                "--resume continues with the run's saved config.toml; drop the other options "
                "(only --device may change: a run resumes on any device)"
            )
        if args.dry_run:
            return _print_plan(plan_resume(Path(args.resume), device=args.device))
        suite_dir, summaries = continue_suite(
            Path(args.resume), device=args.device, progress=progress, started=_CURRENT_RUN.append
        )
    else:
        config = config_from_args(args)
        hint = "use --resume {dir} or another --name"
        if args.dry_run:
            return _print_plan(plan_new(config, resume_hint=hint))
        suite_dir, summaries = start_suite(
            config, progress=progress, resume_hint=hint, started=_CURRENT_RUN.append
        )
    print_results(summaries, title=f"results in {suite_dir}")
    return 0


def _print_plan(plan: str) -> int:
    """`run --dry-run`: the plan on stdout, exit code 0 (every check passed, nothing was written)."""
    print(plan)
    return 0


def command_list(args: argparse.Namespace) -> int:
    """`fedistill list`: the registries, or `--options NAME`: every option of one algorithm."""
    if args.options:
        from fedistill.reference.options import format_options

        _refuse_another_kind(args.options)

        print(format_options(args.options))
        return 0
    from fedistill.algorithms.registry import ALGORITHMS, algorithm_names
    from fedistill.data.partition import PARTITIONERS
    from fedistill.data.registry import dataset_names
    from fedistill.models import model_names

    print("algorithms:")
    for name in algorithm_names():
        print(f"  {name:<14} {ALGORITHMS[name].summary}")
    print("datasets:     " + ", ".join(dataset_names()))
    print("models:       " + ", ".join(model_names()))
    print("partitioners: " + ", ".join(sorted(PARTITIONERS)))
    return 0


def _refuse_another_kind(name: str) -> None:
    """`list --options NAME` where NAME is a dataset, model or partitioner: say where its options go. Why:
    the registry's "unknown algorithm" is true, and no help to a user who wanted that name's options."""
    from fedistill.algorithms.registry import ALGORITHMS
    from fedistill.data.partition import PARTITIONERS
    from fedistill.data.registry import dataset_names, dataset_options
    from fedistill.models import model_names, model_options

    if name in ALGORITHMS:
        return
    if name in dataset_names():
        kind, table, options = "dataset", f"a [{name}] table", dataset_options(name)
    elif name in model_names():
        kind, table, options = "model", "[model_options]", model_options(name)
    elif name in PARTITIONERS:
        kind, table, options = "partitioner", "[partition_options]", None  # None: named on the page alone
    else:
        return
    page = "Models" if kind == "model" else "Datasets and partitions"
    shown = f" ({', '.join(options)})" if options else ""
    takes = f"its options{shown} go in {table} of a config file (see the page '{page}')"
    takes = "it takes no options of its own" if options == () else takes
    raise UserError(
        f"{name!r} is a {kind}, not an algorithm; {takes}; "
        f"fedistill list --options takes an algorithm ({', '.join(sorted(ALGORITHMS))})"
    )


def command_summary(args: argparse.Namespace) -> int:
    """`fedistill summary RUN`: the results table of a finished run directory, its algorithms in the order
    `fedistill run` printed them; those not finished yet (running, failed, interrupted) are named on
    stderr, with the command that finishes them."""
    from fedistill.config import read_config
    from fedistill.engine.suite_dir import still_running
    from fedistill.engine.summary import print_results, read_summary

    run_dir = Path(args.run_dir)
    if run_dir.is_file():  # a model file or an export: name the run that holds it, as the API does
        from fedistill.inference.run_folder import check_run_dir

        check_run_dir(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a folder; pass a run directory written by `fedistill run`")
    suite = run_dir.parent if (run_dir.parent / "config.toml").is_file() else run_dir
    if (run_dir / "summary.json").is_file():
        summaries, unfinished = [read_summary(run_dir)], []
    elif suite != run_dir and (run_dir / "config.toml").is_file():  # one algorithm's folder of a run
        summaries, unfinished = [], [run_dir.name]
    elif (run_dir / "config.toml").is_file():
        names = read_config(run_dir / "config.toml").algorithms
        summaries = [read_summary(run_dir / n) for n in names if (run_dir / n / "summary.json").is_file()]
        unfinished = [n for n in names if not (run_dir / n / "summary.json").is_file()]
    else:
        summaries = [read_summary(d) for d in sorted(run_dir.iterdir()) if (d / "summary.json").is_file()]
        unfinished = []
    if not summaries:
        from fedistill.engine.flower.outcome import failure_exit_code, failure_line, recorded_failure

        if (failure := recorded_failure(run_dir)) is not None:  # a `flwr run` that failed says why here
            print(failure_line(failure), file=sys.stderr)
            return failure_exit_code(failure)
        if unfinished:
            advice = still_running(suite) or f"finish it with `fedistill run --resume {suite}`"
            raise UserError(f"{run_dir} holds no finished run yet (no summary.json); {advice}")
        runs = [d for d in sorted(run_dir.iterdir()) if (d / "config.toml").is_file()]
        if runs:  # the --out folder, which holds runs: name them
            shown = ", ".join(str(d) for d in runs[:5])
            shown += f", ... ({len(runs)} in all)" if len(runs) > 5 else ""
            raise UserError(f"{run_dir} holds run directories, not one run; pass one of them: {shown}")
        raise UserError(f"{run_dir} holds no run (no summary.json); pass a folder written by `fedistill run`")
    print_results(summaries, title=str(run_dir))
    for s in summaries:  # the table shows such a run's completed rounds and last metrics; say why it stopped
        if s.get("stopped"):
            print(f"fedistill: {s['algorithm']} stopped early: {s['stopped']}", file=sys.stderr)
    if unfinished:
        names = ", ".join(unfinished)
        finish = still_running(suite) or f"finish with `fedistill run --resume {suite}`"
        print(f"fedistill: not finished (no summary.json): {names}; {finish}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line's entry point: one line and an exit code for every user mistake or stop."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    words = sys.argv[1:] if argv is None else argv
    asked = tuple(word for word in words[:1] if word in MODULE_COMMANDS)  # the subcommand comes first
    args = parse_arguments(build_parser(module_commands=asked), argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("fedistill").setLevel(logging.INFO)
    handlers = {"run": command_run, "list": command_list, "summary": command_summary}
    if args.command in MODULE_COMMANDS:
        handlers[args.command] = importlib.import_module(MODULE_COMMANDS[args.command][0]).run_command
    _CURRENT_RUN.clear()  # a message names only this command's run
    # a scheduler's SIGTERM stops a run as Ctrl-C does, here only: a library call keeps its program's
    stops = (
        interrupt.sigterm_as_interrupt(lambda: _stopped_by_sigterm(args))
        if args.command in STOPPED_BY_SIGTERM
        else nullcontext()
    )
    try:
        with stops:
            code = handlers[args.command](args)
        sys.stdout.flush()  # a reader that went away shows here, not as a traceback at exit
        return code
    except UserError as exc:
        print(f"fedistill: error: {exc}", file=sys.stderr)
        return 2
    except FederationError as exc:
        print(f"fedistill: run stopped: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (`fedistill list | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141
    except OSError as exc:  # the disk filled up or the folder went away during a run
        where = exc.filename or (_CURRENT_RUN[-1] if _CURRENT_RUN else "a file")
        if not _CURRENT_RUN and args.command != "run":  # predict, export, ...: it may be a read as well
            print(f"fedistill: {args.command} stopped: {where}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        then = f"; once fixed, continue with --resume {_CURRENT_RUN[-1]}" if _CURRENT_RUN else ""
        print(f"fedistill: run stopped: cannot write {where}: {exc.strerror or exc}{then}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if interrupt.terminated():  # 128 + 15, what a scheduler expects of a job it stopped
            print(_stopped_by_sigterm(args), file=sys.stderr)
            return 128 + signal.SIGTERM
        print(f"fedistill: interrupted{_after_interrupt(args)}", file=sys.stderr)
        return 130


def _stopped_by_sigterm(args: argparse.Namespace) -> str:
    """The last line of a command SIGTERM stopped."""
    return f"fedistill: stopped by SIGTERM{_after_interrupt(args)}"


def _after_interrupt(args: argparse.Namespace) -> str:
    """What to do after Ctrl-C: resume the run it names, or nothing where no run folder was made yet (a new
    run stopped while it loaded its data) or the command resumes nothing (summary, predict, ...)."""
    run = (
        _CURRENT_RUN[-1] if _CURRENT_RUN else getattr(args, "resume", None) if args.command == "run" else None
    )
    if run:
        return f"; continue with --resume {run}"
    return " before the run directory was made; nothing to resume" if args.command == "run" else ""


if __name__ == "__main__":
    sys.exit(main())
