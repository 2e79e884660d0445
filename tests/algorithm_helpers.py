"""Helpers for the end-to-end tests of the partial-sharing methods (FedPer, LG-FedAvg, FedGen, FedCG,
FedMD-CG): a small non-IID setting, one client built as the runner builds it, a suite run that notes the
array names of every message the ledger records, and the crash-and-resume check."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from fedistill.algorithms.base import ServerLogic
from fedistill.algorithms.registry import get_algorithm
from fedistill.config import RunConfig, options_for
from fedistill.engine.launch import resume_suite, run_suite
from fedistill.engine.rundir import read_jsonl
from fedistill.engine.setup import client_contexts, prepare_data
from fedistill.federation.client import ClientLogic
from fedistill.federation.fleet import Fleet, Reply
from fedistill.federation.ledger import DOWN, UP
from fedistill.federation.messages import Message

#: Five clients on a Dirichlet(0.5) split of the embedded digits: small, quick and clearly non-IID.
SMALL_NON_IID = {"clients": 5, "alpha": 0.5, "batch_size": 32, "seed": 0}


def make_client(config: RunConfig, algorithm: str, k: int = 0) -> ClientLogic:
    """Client `k` of `algorithm`, built from its private data as the runner builds it."""
    method = get_algorithm(algorithm)
    options = options_for(config, algorithm, method.options)
    return method.client(client_contexts(config, method, options, prepare_data(config))[k])


class Sent(NamedTuple):
    """One message as the ledger records it, by array names."""

    direction: str  # UP (client -> server) or DOWN
    round: int
    type: str
    arrays: dict[str, set[str]]  # content kind -> array names


def run_recording(config: RunConfig, out: Path) -> tuple[dict[str, dict], dict[str, list[Sent]]]:
    """Run a suite, noting every message the ledger records; returns the summaries and the messages,
    both by algorithm."""
    seen: dict[str, list[Sent]] = {}
    request, reply = Fleet.record_request, Fleet.record_reply

    def note(fleet: Fleet, direction: str, message: Message | None) -> None:
        if message is not None:
            arrays = {kind: set(named) for kind, named in message.arrays.items()}
            sent = Sent(direction, fleet.round, message.type, arrays)
            seen.setdefault(fleet.ledger.path.parent.name, []).append(sent)

    def record_request(self: Fleet, client: int, message: Message, step: int | None) -> None:
        note(self, DOWN, message)
        request(self, client, message, step)

    def record_reply(self: Fleet, answer: Reply, request_type: str, step: int | None, expect=None) -> Reply:
        note(self, UP, answer.message)
        return reply(self, answer, request_type, step, expect)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Fleet, "record_request", record_request)
        patch.setattr(Fleet, "record_reply", record_reply)
        summaries = run_suite(config, out, progress=False)
    return {s["algorithm"]: s for s in summaries}, seen


def _strip_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.endswith("_s")} for row in rows]


#: Where a run's inputs came from, not what it computed: the second run of a test meets the first
#: one's stage-1 cache.
PROVENANCE = ("teachers_from_cache",)


def _results(final: dict) -> dict:
    return {k: v for k, v in final.items() if k not in PROVENANCE}


def run_until_crash(config: RunConfig, server: type[ServerLogic], out: Path, crash_round: int) -> None:
    """Run `config` into `out`, crashing in `crash_round` (its last checkpoint is the one before)."""
    run_round = server.run_round

    def crash(self: ServerLogic, fleet: Fleet, round: int) -> dict[str, float]:
        if round == crash_round:
            raise RuntimeError("simulated crash")
        return run_round(self, fleet, round)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(server, "run_round", crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_suite(config, out, progress=False)


def check_resume_after_crash(
    config: RunConfig, server: type[ServerLogic], out: Path, crash_round: int = 3
) -> Path:
    """Run `config` (one algorithm) once through, and once crashing in `crash_round` then resuming from
    the checkpoint: the final metrics and every metrics row (timings aside) must be the same.
    Returns the resumed run's directory."""
    (algorithm,) = config.algorithms
    reference = run_suite(config, out / "ref", progress=False)[0]
    run_until_crash(config, server, out / "crashed", crash_round)
    resumed = resume_suite(out / "crashed", progress=False)[0]
    assert _results(resumed["final"]) == _results(reference["final"])
    got = _strip_times(read_jsonl(out / "crashed" / algorithm / "metrics.jsonl"))
    assert got == _strip_times(read_jsonl(out / "ref" / algorithm / "metrics.jsonl"))
    return out / "crashed" / algorithm


#: Two sites of semi-synthetic lesion slices (8 training subjects) at 32 px, a small U-Net: the
#: per-pixel tests' run.
SMALL_LESIONS = {
    "dataset": "mni152-synthetic-lesions",
    "mni152-synthetic-lesions": {"image_size": 32, "train_subjects": 8, "test_subjects": 2},
    "model": "unet",
    "model_options": {"width": 4, "depth": 2},
    "partition": "natural",
    "clients": 2,
    "batch_size": 8,
}

#: FedIOD options small enough for a test that compares two runs of it (transports, site data).
SMALL_FEDIOD = {
    "teacher_epochs": 2,
    "iters_per_epoch": 3,
    "generator_width": 16,
    "discriminator_width": 16,
    "student_steps": 2,
}
#: The smallest FedIOD run that exercises every message type (3 clients, 2 epochs of 2 G-steps), with
#: the paper's settings (the protocol tests check its arithmetic; the default preset has its own tests).
TINY_FEDIOD = {
    "clients": 3,
    "alpha": 1.0,
    "model": "lenet-fedmdcg",
    "rounds": 2,
    "batch_size": 32,
    "fediod": {
        "preset": "paper",
        "teacher_epochs": 2,
        "iters_per_epoch": 2,
        "synthetic_batch_size": 16,
        "student_steps": 2,
        "generator_width": 8,
        "discriminator_width": 8,
        "latent_dim": 16,
    },
}


def fediod_parts(config: RunConfig) -> tuple[dict[int, ClientLogic], ServerLogic, dict[int, int]]:
    """FedIOD's client objects and server for `config`, outside the runner (stage 1 not yet run), and
    each client's training-set size."""
    from fedistill.algorithms.base import ServerContext
    from fedistill.algorithms.fediod import FedIODClient, FedIODOptions, FedIODServer
    from fedistill.algorithms.shared.training import evaluate_model, task_of
    from fedistill.engine.setup import score_first

    options = options_for(config, "fediod", FedIODOptions)
    data = prepare_data(config)
    contexts = client_contexts(config, get_algorithm("fediod"), options, data)
    clients = {ctx.client_id: FedIODClient(ctx) for ctx in contexts}
    test, info = data.dataset.test, data.dataset.info
    task = task_of(config, info)
    server = FedIODServer(
        ServerContext(
            info,
            config,
            options,
            len(clients),
            lambda m: evaluate_model(m, test, info, task=task),
            None,
            test.y,
            score=lambda outputs: score_first(task, data.dataset, outputs, None),
        )
    )
    return clients, server, {ctx.client_id: len(ctx.train) for ctx in contexts}
