"""The run loop of one algorithm: clients and server, rounds, checkpoints, the summary.

Each round is reproducible from (seed, round) and the checkpointed states alone, so a killed run
resumed with `--resume` ends with exactly the metrics of an uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from fedistill import devices, interrupt
from fedistill.algorithms.base import Algorithm, ServerContext, StopRun
from fedistill.algorithms.shared.oracle import ORACLE_LABEL, ORACLE_METRIC
from fedistill.algorithms.shared.stage1 import cache_folder
from fedistill.algorithms.shared.training import evaluate_model, task_of
from fedistill.config import RunConfig, write_config
from fedistill.data.partition import load_split
from fedistill.engine import decision_threshold, norm_statistics
from fedistill.engine.checkpoint import save_model, sweep_temporaries, write_checkpoint
from fedistill.engine.floor import floor_scores
from fedistill.engine.resume import (
    check_same_settings,
    intact_lines,
    resumable_settings,
    resume_point,
    warn_of_changes,
)
from fedistill.engine.rundir import MetricsWriter
from fedistill.engine.setup import Prepared, client_contexts, resolve, score_first, source_names
from fedistill.engine.site_data import check_sites, node_sites, save_partition, save_sites, site_greeting
from fedistill.engine.summary import write_summary
from fedistill.engine.tracking import start_tracking
from fedistill.errors import ConfigError, FederationError, RunDirError
from fedistill.federation.fleet import Fleet
from fedistill.federation.ledger import Ledger
from fedistill.machine import appended, history_after, machine
from fedistill.plots import plot_learning_curves, plot_partition
from fedistill.privacy import journal as privacy_journal
from fedistill.tasks import Task
from fedistill.transports.inprocess import InProcessFleet
from fedistill.version import __version__, code_fingerprint

log = logging.getLogger("fedistill")


def _peak_memory_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _device_peak_memory() -> dict[str, float]:
    """On CUDA, the most memory PyTorch held allocated on the card at once (the process's RSS does not see
    it); nothing on other devices."""
    if devices.current().type != "cuda":
        return {}
    return {"device_peak_memory_mb": torch.cuda.max_memory_allocated(devices.current()) / 2**20}


def versions() -> dict[str, str]:
    """The versions of the project, Python and the libraries a run's numbers depend on, as its summary records
    them; `code`: the fingerprint of the project's code (`--reuse` keeps a run only with this code's)."""
    return {
        "fedistill": __version__,
        "code": code_fingerprint(),
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
    resolved = resolve(config, config.algorithm)
    algorithm, options = resolved.algorithm, resolved.options
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "plots").mkdir(exist_ok=True)
    # a resume appends: its log keeps the earlier starts' and says which checkpoint it went back to
    handler = logging.FileHandler(run_dir / "run.log", mode="a" if resume else "w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        if resume:  # a write a crash or a full disk cut short may have left its temporary folder
            sweep_temporaries(run_dir / "checkpoints")
        point = resume_point(run_dir) if resume else None
        checkpoint, state = point if point is not None else (None, None)
        if resume and checkpoint is None and (done := intact_lines(run_dir / "metrics.jsonl")):
            log.warning(
                "%s: no checkpoint to resume from (checkpoint_every = %d): %d round%s run again from round 1",
                run_dir, config.checkpoint_every, done, "s" if done != 1 else "",
            )  # fmt: skip
        if checkpoint is None:
            write_config(config, run_dir / "config.toml")
            save_partition(config, data, run_dir)  # on Flower, written again once the nodes have answered
            save_sites(data, run_dir)
            counts = data.train_counts()  # None: the sites' own data, on their Flower nodes
            if counts is not None:
                how = "own data" if data.own_data else f"{config.partition} (alpha={config.alpha})"
                names = task_of(config, data.dataset.info).partition_names(data.dataset) or None
                plot_partition(
                    counts,
                    run_dir / "plots" / "partition.png",
                    class_names=("samples",) if counts.shape[1] == 1 and data.own_data else names,
                    title=f"{config.dataset}: {how}, {config.clients} clients",
                )
        else:  # an edited key is named first: a new seed or alpha also makes another partition
            check_same_settings(run_dir, state["runner"].get("settings"), config)
            if load_split(run_dir).hash() != data.split.hash():
                raise ConfigError(
                    f"{run_dir}: the saved partition differs from the one this config makes; cannot resume"
                )
            check_sites(data, run_dir)
        restarted = resume and checkpoint is None  # a resumed run that never checkpointed starts over
        return _loop(config, algorithm, options, run_dir, data, state, progress, grid, restarted)
    except FederationError as exc:  # why it stopped goes to run.log too; the console has the CLI's line
        handler.handle(logging.LogRecord("fedistill", logging.ERROR, "", 0, "run stopped: %s", (exc,), None))
        raise
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
    restarted: bool = False,
) -> dict[str, Any]:
    info, test = data.dataset.info, data.dataset.test
    task, test_sources = task_of(config, info), source_names(data.dataset)
    headline = f"test_{task.headline}"
    decision_threshold.check_algorithm(task, algorithm)
    norm_statistics.check_algorithm(config, algorithm, options)
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
        """The evaluation-only oracle (algorithms/shared/oracle.py): it reads the client objects' own states,
        in this process only; nothing is sent and nothing is written to the ledger."""
        if algorithm.oracle is None or not clients or not task.reports_global_accuracy:
            return None  # FedMD-CG's "global accuracy" is a column of image-classification tables
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
    tracking = None
    try:  # a failure before round 1 (stage 1 interrupted) closes what it opened, as one in a round does
        # None unless config.track names trackers; a new run under a used name is no resume of it
        tracking = start_tracking(config, run_dir, resume=state is not None or restarted)
        fleet = _fleet(config, algorithm, clients, ledger, grid, run_dir, data)
        if grid is not None and data.own_data:  # the sites as their nodes' HELLO answers describe them
            node_sites(config, data, run_dir, fleet, resumed=state is not None)
        # the versions of the code that starts the run, not of whatever is on disk when it ends
        ran_with, ran_on = versions(), machine()
        machines_so_far = history_after(runner_state.get("machines", []), ran_on)  # this start's machine last
        codes_so_far = appended(runner_state.get("codes", []), ran_with["code"])
        started = time.perf_counter() - runner_state["elapsed"]  # wall time includes set-up (stage 1)
        if state:
            missing = [
                part for part in ("server", *(f"client_{cid:03d}" for cid in clients)) if part not in state
            ]
            if missing:  # a checkpoint from before manifests, with files gone (a manifest's would fall back)
                raise RunDirError(
                    f"{run_dir}: its checkpoint lacks {', '.join(missing)}; start again under another --name"
                )
            server.load_state_dict(state["server"])
            for cid, client in clients.items():
                client.load_state_dict(state[f"client_{cid:03d}"])
            privacy_journal.catch_up(run_dir, clients)  # DP releases made after the checkpoint count
            fleet.dropped = {int(k): v for k, v in runner_state.get("dropped", {}).items()}
            log.info("resumed %s from round %d", algorithm.name, runner_state["round"])
            warn_of_changes(algorithm.name, runner_state, machines_so_far, codes_so_far)
        else:
            if restarted:  # its sites' DP releases before the stop reached the server: they count
                privacy_journal.catch_up(run_dir, clients, restarted=True)
            # on a GPU, which card (the summary's device_name); on the CPU nothing a user needs to read
            log.log(logging.INFO if devices.current().type == "cuda" else logging.DEBUG,
                    "%s on %s", algorithm.name, devices.describe())  # fmt: skip
            server.setup(fleet)
    except BaseException:
        ledger.close()
        metrics.close()
        if tracking is not None:
            tracking.abort()
        raise

    start_round = runner_state["round"] + 1
    rounds_done = runner_state["round"]  # rounds completed: fewer than planned when a StopRun ends it
    settings = resumable_settings(config)  # what every checkpoint records
    # timed once, by the start that ran it; a checkpoint carries it (None: one written before it did)
    setup_s = time.perf_counter() - started if not state else runner_state.get("setup_time_s")
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
            interrupt.check()  # Ctrl-C during a Flower simulation (interrupt.py)
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
            if tracking is not None:
                tracking.log_round(row)
            if headline in row:
                bar.set_postfix({headline: f"{row[headline]:.4f}"})
            if stopped:
                break
            rounds_done = round
            if round % config.checkpoint_every == 0 or round == config.rounds:
                runner_state = {
                    "round": round,
                    "ledger": ledger.count,
                    "metrics": len(metrics.rows),
                    "elapsed": time.perf_counter() - started,
                    "setup_time_s": setup_s,
                    "dropped": {str(k): v for k, v in fleet.dropped.items()},
                    "last_eval": last_eval,
                    "machines": machines_so_far,
                    "codes": codes_so_far,
                    "settings": settings,
                }
                parts = {"runner": runner_state, "server": server.state_dict()}
                parts |= {f"client_{cid:03d}": c.state_dict() for cid, c in clients.items()}
                write_checkpoint(run_dir / "checkpoints", f"round_{round:05d}", parts)
        final = server.final_evaluate(fleet, last_eval)

        def score(model: torch.nn.Module, scored: Task) -> dict[str, float]:
            meta = data.dataset.test_meta
            return evaluate_model(model, test, info, task=scored, meta=meta, groups=test_sources)

        # the statistics first: the threshold is chosen for the model as it is exported
        final = norm_statistics.recalibrated(config, options, server, fleet, task, final, score)
        task, final = decision_threshold.decide(task, config, options, server, fleet, final, score)
        final_oracle = oracle()
    finally:
        bar.close()
        ledger.close()
        metrics.close()
        if tracking is not None and sys.exc_info()[0] is not None:
            tracking.abort()  # interrupted or failed: `--resume` logs on from its checkpoint

    try:  # the models, plot and summary: a tracker still open is closed if writing them fails
        # the trivial predictor, where the task names one
        floor = floor_scores(task, data.dataset, test_sources)
        (run_dir / "models").mkdir(exist_ok=True)
        for name, module in server.models().items():
            # a module may name what its weights alone do not record (a generator: its upsamplings)
            described = getattr(module, "export_metadata", dict)()
            # the dataset's facts (normalisation, size, classes) travel with the weights: load_model
            # needs no data
            metadata = {"algorithm": algorithm.name, "dataset_info": info.to_json(),
                        "task_options": json.dumps(task.options()), **described}  # fmt: skip
            save_model(module, run_dir / "models" / f"{name}.safetensors", metadata)
        plot_learning_curves(
            {algorithm.name: metrics.rows},
            run_dir / "plots" / "learning_curve.png",
            title=f"{config.dataset}",
            metrics=(headline,),
            selected={algorithm.name: final.get("selected_epoch")},
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
            "device_name": devices.describe(),
            "rounds": config.rounds,
            "rounds_done": rounds_done,
            "seed": config.seed,
            "partition": {
                "method": "own-data" if data.own_data else config.partition,
                "alpha": None if data.own_data else config.alpha,
                "hash": data.split.hash(),
                "sizes": data.client_sizes() or getattr(fleet, "site_sizes", None) or [],
            },
            "final": final,
            headline: final.get(headline),  # the headline's value at the top level, as readers expect it
            **({"floor": floor} if floor else {}),
            "stopped": stopped,
            ORACLE_METRIC: final_oracle,
            "oracle": _oracle_note(algorithm, grid),
            "wall_time_s": time.perf_counter() - started,
            "setup_time_s": setup_s,  # before round 1 (FedIOD: stage 1), by the run's first start
            "peak_memory_mb": _peak_memory_mb(),
            **_device_peak_memory(),
            "communication": ledger.totals.summary(),
            "dropped_clients": {str(k): v for k, v in fleet.dropped.items()},
            "versions": ran_with,
            "machine": ran_on,  # the server's: in-process and on Flower's simulation, every site's too
            **({"machine_history": machines_so_far} if len(machines_so_far) > 1 else {}),  # resumed elsewhere
            **({"code_history": codes_so_far} if len(codes_so_far) > 1 else {}),  # resumed by other code
        }
        write_summary(run_dir, summary)
    except BaseException:
        if tracking is not None:
            tracking.abort()
        raise
    if tracking is not None:
        tracking.finish(summary, run_dir)
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
    config: RunConfig,
    algorithm: Algorithm,
    clients: dict[int, Any],
    ledger: Ledger,
    grid: Any,
    run_dir: Path,
    data: Prepared,
) -> Fleet:
    max_bytes, timeout = int(config.max_message_mb * 2**20), config.timeout or None
    if grid is None:

        def answered(cid: int) -> None:
            privacy_journal.keep(run_dir, cid, clients[cid])

        return InProcessFleet(clients, ledger, max_bytes=max_bytes, timeout=timeout, answered=answered)
    from fedistill.transports.flower.grid_fleet import GridFleet  # Flower is optional

    return GridFleet(
        grid,
        ledger,
        algorithm=algorithm.name,
        expected_clients=config.clients,
        max_bytes=max_bytes,
        timeout=timeout,
        connect_timeout=config.connect_timeout,
        # only a Flower node rebuilds the split, so only then compared; a site with its own data has no
        # split to compare but takes the server's dataset facts and test set (site_data.py)
        split_hash=None if data.own_data else data.split.hash(),
        greeting=(data.greeting or site_greeting(data.dataset)) if data.own_data else None,
        server_hash=data.records_hash if data.own_data else None,
    )
