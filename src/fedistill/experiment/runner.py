"""The run loop: data and partition, clients and server, rounds, checkpoints, summary.

Each round is reproducible from (seed, round) and the checkpointed states alone, so a killed run
resumed with `--resume` ends with exactly the metrics of an uninterrupted run.
"""

from __future__ import annotations

import difflib
import logging
import platform
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

import fedistill
from fedistill import devices
from fedistill.algorithms.base import (
    Algorithm,
    ClientContext,
    ServerContext,
    StopRun,
    algorithm_names,
    for_task,
    get_algorithm,
)
from fedistill.algorithms.oracle import ORACLE_LABEL, ORACLE_METRIC
from fedistill.algorithms.stage1 import cache_folder
from fedistill.algorithms.training import evaluate_model, task_of
from fedistill.data.base import LoadedDataset
from fedistill.data.partition import FederatedSplit, load_split, make_split, save_split
from fedistill.data.registry import dataset_names, load_dataset
from fedistill.errors import ConfigError, DataError, RunDirError, unknown_name
from fedistill.experiment import interrupt
from fedistill.experiment.checkpoint import save_model, write_checkpoint
from fedistill.experiment.config import RunConfig, for_algorithm, options_for, read_config, write_config
from fedistill.experiment.plots import plot_learning_curves, plot_partition
from fedistill.experiment.resume import resume_point
from fedistill.experiment.rundir import MetricsWriter, read_jsonl
from fedistill.experiment.summary import read_summary, write_suite_results, write_summary
from fedistill.federation.fleet import Fleet
from fedistill.federation.inprocess import InProcessFleet
from fedistill.federation.ledger import Ledger
from fedistill.models import model_names
from fedistill.seeding import derive_seed
from fedistill.tasks import Task

log = logging.getLogger("fedistill")

#: Sections of `config.options` that are not algorithm names.
NON_ALGORITHM_SECTIONS = {"partition", "task", "model_options"}


@dataclass
class Prepared:
    """The data side of a run, shared by every algorithm of a suite."""

    dataset: LoadedDataset
    split: FederatedSplit


def partition_labels(dataset: LoadedDataset) -> tuple[np.ndarray, np.ndarray, int]:
    """What the partitioner splits by: the class of each image, or, for per-pixel targets, the
    dataset's natural groups (one group when it names none); and how many values they take."""
    if not dataset.train.dense:
        return dataset.train.y.numpy(), dataset.test.y.numpy(), dataset.info.num_classes
    train = dataset.train_groups if dataset.train_groups is not None else np.zeros(len(dataset.train))
    test = dataset.test_groups if dataset.test_groups is not None else np.zeros(len(dataset.test))
    train, test = np.asarray(train, dtype=np.int64), np.asarray(test, dtype=np.int64)
    return train, test, int(max(train.max(initial=0), test.max(initial=0))) + 1


def source_names(dataset: LoadedDataset) -> list[str] | None:
    """Each test sample's source (site, organ, dataset) by name, for per-source metrics; None without."""
    if dataset.test_groups is None:
        return None
    names = dataset.group_names
    return [names[g] if 0 <= g < len(names) else str(g) for g in np.asarray(dataset.test_groups).tolist()]


def score_first(
    task: Task, dataset: LoadedDataset, outputs: torch.Tensor, sources: list[str] | None
) -> dict[str, float]:
    """The task's metrics of `outputs` on the first len(outputs) test samples (evaluation harness)."""
    n, test = len(outputs), dataset.test
    subset = test if n == len(test) else test.subset(torch.arange(n))
    meta = {key: np.asarray(value)[:n] for key, value in dataset.test_meta.items()}
    groups = None if sources is None else sources[:n]
    return task.score(outputs, subset, dataset.info, meta=meta, groups=groups)


def prepare_data(config: RunConfig) -> Prepared:
    dataset = load_dataset(
        config.dataset, config.data_dir, download=config.download, **config.options.get(config.dataset, {})
    )
    train_labels, test_labels, num_labels = partition_labels(dataset)
    split = make_split(
        train_labels,
        test_labels,
        config.clients,
        method=config.partition,
        alpha=config.alpha,
        seed=derive_seed(config.seed, "partition"),
        num_classes=num_labels,
        val_fraction=config.val_fraction,
        val_mode=config.val_mode,
        **config.options.get("partition", {}),
    )
    return Prepared(dataset, split)


def check_sections(config: RunConfig) -> None:
    """Every config table is an algorithm's, the dataset's or [partition], and every algorithm table is
    valid for its algorithm, whether or not it runs (a typo in another table is still a typo)."""
    algorithms, datasets = set(algorithm_names()), set(dataset_names())
    for section in config.options:
        if section in NON_ALGORITHM_SECTIONS or section == config.dataset:
            continue
        if section in datasets:
            raise ConfigError(
                f"config table [{section}] sets options of dataset {section!r}, "
                f"but the run uses dataset {config.dataset!r}"
            )
        if section not in algorithms:
            valid = sorted(algorithms | NON_ALGORITHM_SECTIONS | {config.dataset})
            close = difflib.get_close_matches(section, valid, n=1)
            hint = f"; did you mean [{close[0]}]?" if close else ""
            raise ConfigError(
                f"unknown config table [{section}]{hint}; tables are algorithm names, the dataset's "
                f"name or [partition] (valid: {', '.join(valid)})"
            )
        algorithm = get_algorithm(section)
        options_for(for_algorithm(config, section), section, algorithm.options)


def validate_setup(config: RunConfig) -> Prepared:
    """Everything a user's input can get wrong, checked before a run writes anything: names, config
    tables, every running algorithm's options, its models, the dataset files and the partition."""
    check_sections(config)
    devices.resolve(config.device)  # a device this machine lacks is a mistake named before any work
    for name in config.algorithms:
        algorithm = get_algorithm(name)
        algo_config = for_algorithm(config, name)
        options_for(algo_config, name, algorithm.options)
        if algo_config.model not in model_names():
            raise unknown_name("model", algo_config.model, model_names(), ConfigError)
    data = prepare_data(config)
    info = data.dataset.info
    task = task_of(config, info)
    for what, images in (("training set", data.dataset.train), ("test set", data.dataset.test)):
        try:
            task.check(info, images, f"{config.dataset} {what}")
        except ValueError as exc:
            raise DataError(str(exc)) from exc
    for name in config.algorithms:
        algorithm = get_algorithm(name)
        if task.name not in algorithm.tasks:
            raise ConfigError(
                f"{name} runs on {', '.join(algorithm.tasks)} only, and dataset {config.dataset!r} is a "
                f"{task.name} task; algorithms for it: {', '.join(for_task(task.name))}"
            )
        model = for_algorithm(config, name).model
        if model not in model_names(task.name):
            raise ConfigError(
                f"model {model!r} does not serve {task.name} (dataset {config.dataset!r}); "
                f"models that do: {', '.join(model_names(task.name))}"
            )
    return data


def client_contexts(
    config: RunConfig, algorithm: Algorithm, options: Any, data: Prepared, cache_dir: Path | None = None
) -> list[ClientContext]:
    train, test, split, info = data.dataset.train, data.dataset.test, data.split, data.dataset.info
    if algorithm.pooled:
        everything = np.sort(np.concatenate(split.client_train))
        return [
            ClientContext(
                0,
                train.subset(everything),
                train.subset(split.server_val),
                test,
                info,
                config,
                options,
                test,
                cache_dir,
                data.dataset.test_meta,
                source_names(data.dataset),
            )
        ]
    return [
        ClientContext(
            k,
            train.subset(split.client_train[k]),
            train.subset(split.client_val[k]),
            test.subset(split.client_test[k]),
            info,
            config,
            options,
            test,
            cache_dir,
            data.dataset.test_meta,
            source_names(data.dataset),
        )
        for k in range(len(split.client_train))
    ]


def _peak_memory_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def versions() -> dict[str, str]:
    return {
        "fedistill": fedistill.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
    }


def run_algorithm(
    config: RunConfig,
    run_dir: Path,
    data: Prepared,
    *,
    resume: bool = False,
    progress: bool = True,
    grid: Any = None,
) -> dict[str, Any]:
    """Run one algorithm in `run_dir` (a fresh one, or resume it from its last checkpoint).

    With a Flower `grid`, the clients live on Flower nodes and keep their own state; otherwise they
    are built here and reached in-process.
    """
    algorithm = get_algorithm(config.algorithm)
    options = options_for(config, algorithm.name, algorithm.options)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "plots").mkdir(exist_ok=True)
    point = resume_point(run_dir) if resume else None
    checkpoint, state = point if point is not None else (None, None)
    if checkpoint is None:
        write_config(config, run_dir / "config.toml")
        save_split(data.split, run_dir)
        grouped = data.dataset.train.dense  # per-pixel targets: the partition splits natural groups
        plot_partition(
            data.split.train_counts,
            run_dir / "plots" / "partition.png",
            class_names=(data.dataset.group_names if grouped else data.dataset.info.class_names) or None,
            title=f"{config.dataset}: {config.partition} (alpha={config.alpha}), {config.clients} clients",
        )
    elif load_split(run_dir).hash() != data.split.hash():
        raise ConfigError(
            f"{run_dir}: the saved partition differs from the one this config makes; cannot resume"
        )

    handler = logging.FileHandler(run_dir / "run.log", mode="a" if checkpoint else "w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        return _loop(config, algorithm, options, run_dir, data, state, progress, grid)
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def _loop(
    config: RunConfig,
    algorithm: Algorithm,
    options: Any,
    run_dir: Path,
    data: Prepared,
    state: dict[str, Any] | None,
    progress: bool,
    grid: Any = None,
) -> dict[str, Any]:
    info, test = data.dataset.info, data.dataset.test
    task, test_sources = task_of(config, info), source_names(data.dataset)
    headline = f"test_{task.headline}"
    if grid is None:
        contexts = client_contexts(
            config, algorithm, options, data, cache_folder(config, beside=run_dir.parent.parent)
        )
        clients = {ctx.client_id: algorithm.client(ctx) for ctx in contexts}
        num_clients = len(clients)
        sizes = {ctx.client_id: float(len(ctx.train)) for ctx in contexts}
    else:
        clients, num_clients, sizes = {}, config.clients, {}  # they live on the Flower nodes

    def oracle() -> float | None:
        """The evaluation-only oracle (algorithms/oracle.py): it reads the client objects' own states,
        in this process only; nothing is sent and nothing is written to the ledger."""
        if algorithm.oracle is None or not clients or task.name != "classification":
            return None  # FedMD-CG's "global accuracy" is a classification table's column
        ids = sorted(clients)
        states = [clients[c].state_dict() for c in ids]
        return algorithm.oracle(states, [sizes[c] for c in ids], config, info, test)

    server = algorithm.server(
        ServerContext(
            info,
            config,
            options,
            num_clients,
            lambda model: evaluate_model(
                model, test, info, task=task, meta=data.dataset.test_meta, groups=test_sources
            ),
            run_dir,
            test.y,
            progress,
            validation=data.dataset.train.subset(data.split.server_val),
            score=lambda outputs: score_first(task, data.dataset, outputs, test_sources),
        )
    )
    runner_state = state["runner"] if state else {"round": 0, "ledger": 0, "metrics": 0, "elapsed": 0.0}
    ledger = Ledger(run_dir / "ledger.jsonl", resume_at=runner_state["ledger"] if state else None)
    metrics = MetricsWriter(run_dir / "metrics.jsonl", resume_at=runner_state["metrics"] if state else None)
    fleet = _fleet(config, algorithm, clients, ledger, grid)
    started = time.perf_counter() - runner_state["elapsed"]  # wall time includes set-up (stage 1)
    if state:
        server.load_state_dict(state["server"])
        for cid, client in clients.items():
            client.load_state_dict(state.get(f"client_{cid:03d}", {}))
        fleet.dropped = {int(k): v for k, v in runner_state.get("dropped", {}).items()}
        log.info("resumed %s from round %d", algorithm.name, runner_state["round"])
    else:
        server.setup(fleet)

    start_round = runner_state["round"] + 1
    setup_s = time.perf_counter() - started if not state else None
    last_eval: dict[str, float] = dict(runner_state.get("last_eval", {}))
    stopped: str | None = None  # why the server ended the run early (StopRun), if it did
    bar = tqdm(
        range(start_round, config.rounds + 1),
        initial=start_round - 1,
        total=config.rounds,
        desc=f"{algorithm.name:>12}",
        unit="round",
        disable=not progress,
        leave=False,
        file=sys.stderr,
    )
    try:
        for round in bar:
            interrupt.check()  # Ctrl-C during a Flower simulation (experiment/interrupt.py)
            fleet.round = round
            round_start = time.perf_counter()
            try:
                row: dict[str, Any] = {"round": round, **server.run_round(fleet, round)}
            except StopRun as stop:  # a clean early end: evaluate what there is, then the summary
                stopped = stop.reason
                log.warning("%s: %s", algorithm.name, stop.reason)
                row = {"round": round, **stop.metrics, "stopped": True}
            if stopped or round % config.eval_every == 0 or round == config.rounds:
                last_eval = server.evaluate(fleet, round)
                row.update(last_eval)
                if (value := oracle()) is not None:
                    row[ORACLE_METRIC] = value
            row["round_time_s"] = time.perf_counter() - round_start
            metrics.write(row)
            ledger.flush()
            if headline in row:
                bar.set_postfix({headline: f"{row[headline]:.4f}"})
            if stopped:
                break
            if round % config.checkpoint_every == 0 or round == config.rounds:
                runner_state = {
                    "round": round,
                    "ledger": ledger.count,
                    "metrics": len(metrics.rows),
                    "elapsed": time.perf_counter() - started,
                    "dropped": {str(k): v for k, v in fleet.dropped.items()},
                    "last_eval": last_eval,
                }
                parts = {"runner": runner_state, "server": server.state_dict()}
                parts |= {f"client_{cid:03d}": c.state_dict() for cid, c in clients.items()}
                write_checkpoint(run_dir / "checkpoints", f"round_{round:05d}", parts)
        final = server.final_evaluate(fleet, last_eval)
        final_oracle = oracle()
    finally:
        bar.close()
        ledger.close()
        metrics.close()

    (run_dir / "models").mkdir(exist_ok=True)
    for name, module in server.models().items():
        # a module may name what its weights alone do not record (a generator: its number of upsamplings)
        described = getattr(module, "export_metadata", dict)()
        save_model(
            module, run_dir / "models" / f"{name}.safetensors", {"algorithm": algorithm.name, **described}
        )
    plot_learning_curves(
        {algorithm.name: metrics.rows},
        run_dir / "plots" / "learning_curve.png",
        title=f"{config.dataset}",
        metrics=(headline,),
    )
    summary = {
        "algorithm": algorithm.name,
        "description": algorithm.summary,
        "federated": not algorithm.pooled,
        "dataset": config.dataset,
        "task": task.name,
        "headline": headline,
        "columns": [list(column) for column in task.columns],
        "model": config.model,
        "clients": num_clients,
        "transport": "flower" if grid is not None else "inprocess",
        "device": str(devices.current()),
        "rounds": config.rounds,
        "seed": config.seed,
        "partition": {
            "method": config.partition,
            "alpha": config.alpha,
            "hash": data.split.hash(),
            "sizes": [len(idx) for idx in data.split.client_train],
        },
        "final": final,
        "test_accuracy": final.get("test_accuracy"),
        "stopped": stopped,
        ORACLE_METRIC: final_oracle,
        "oracle": _oracle_note(algorithm, grid),
        "wall_time_s": time.perf_counter() - started,
        "setup_time_s": setup_s,  # before round 1 (FedIOD: stage 1); None when resumed
        "peak_memory_mb": _peak_memory_mb(),
        "communication": ledger.totals.summary(),
        "dropped_clients": {str(k): v for k, v in fleet.dropped.items()},
        "versions": versions(),
    }
    write_summary(run_dir, summary)
    return summary


def _oracle_note(algorithm: Algorithm, grid: Any) -> str | None:
    """What the summary says of the evaluation-only oracle (None: the algorithm declares none)."""
    if algorithm.oracle is None:
        return None
    if grid is not None:
        return (
            f"{ORACLE_LABEL}: not computed on the Flower transport (the clients live on their nodes, "
            "and the protocol never sends the full local models the oracle averages)"
        )
    return ORACLE_LABEL


def _fleet(
    config: RunConfig, algorithm: Algorithm, clients: dict[int, Any], ledger: Ledger, grid: Any
) -> Fleet:
    max_bytes, timeout = int(config.max_message_mb * 2**20), config.timeout or None
    if grid is None:
        return InProcessFleet(clients, ledger, max_bytes=max_bytes, timeout=timeout)
    from fedistill.flower.grid_fleet import GridFleet

    return GridFleet(
        grid,
        ledger,
        algorithm=algorithm.name,
        expected_clients=config.clients,
        max_bytes=max_bytes,
        timeout=timeout,
    )


def default_name(config: RunConfig) -> str:
    return f"{config.dataset}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_suite(
    config: RunConfig,
    suite_dir: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    grid: Any = None,
    data: Prepared | None = None,
) -> list[dict[str, Any]]:
    """Run every algorithm named in the config side by side on the same partition.

    The setup is validated before anything is written (`validate_setup`, or the caller passes the
    `data` it validated). On resume, an algorithm with a summary is done; one whose summary is damaged
    is finished again from its last checkpoint, which gives the same summary.

    `transport = "flower"` without a grid starts Flower's simulation engine, whose ServerApp comes
    back here with its grid. Pooled algorithms (Centralized) are not federated: they run in-process.
    """
    data = validate_setup(config) if data is None else data
    if config.transport == "flower" and grid is None:
        from fedistill.flower.simulation import run_simulation_suite

        return run_simulation_suite(config, suite_dir, resume=resume, progress=progress)
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    devices.use(config.device)
    suite_dir.mkdir(parents=True, exist_ok=True)
    write_config(config, suite_dir / "config.toml")
    summaries = []
    for name in config.algorithms:
        run_dir = suite_dir / name
        if resume and (run_dir / "summary.json").is_file():
            try:
                summaries.append(read_summary(run_dir))
                continue
            except RunDirError as exc:
                log.warning("%s; finishing %s again from its last checkpoint", exc, name)
        on_grid = grid if not get_algorithm(name).pooled else None
        summaries.append(
            run_algorithm(
                for_algorithm(config, name), run_dir, data, resume=resume, progress=progress, grid=on_grid
            )
        )
    curves = {s["algorithm"]: read_jsonl(suite_dir / s["algorithm"] / "metrics.jsonl") for s in summaries}
    write_suite_results(suite_dir, summaries, curves)
    return summaries


def resume_suite(suite_dir: Path, *, progress: bool = True) -> list[dict[str, Any]]:
    if not (suite_dir / "config.toml").is_file():
        raise ConfigError(f"{suite_dir} is not a run directory (no config.toml); nothing to resume")
    return run_suite(read_config(suite_dir / "config.toml"), suite_dir, resume=True, progress=progress)
