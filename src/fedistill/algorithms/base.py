"""What an algorithm is: client logic + server logic + options, registered by name.

The run loop builds one client per site from that site's private data (`ClientContext`) and one
server from public facts only (`ServerContext`); the two halves meet only through a Fleet.
"""

from __future__ import annotations

import difflib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.errors import ConfigError
from fedistill.federation.client import ClientLogic
from fedistill.federation.fleet import Fleet


@dataclass
class ClientContext:
    """Everything one site holds: its private splits, plus the shared evaluation set and config."""

    client_id: int
    train: ImageSet
    val: ImageSet  # the client's shard of the held-out validation split
    test: ImageSet  # the client's IID shard of the test set ("local accuracy")
    info: DatasetInfo
    config: RunConfig
    options: Any
    global_test: ImageSet  # the evaluation harness's test set, for reporting a local model's accuracy
    cache_dir: Path | None = (
        None  # the site's own cache of stage-1 models (algorithms/shared/stage1.py); None: off
    )
    # the evaluation harness's facts of `global_test` (per-volume scores, stitched patches, sources)
    global_test_meta: dict[str, Any] = field(default_factory=dict)
    global_test_sources: list[str] | None = None


@dataclass
class ServerContext:
    """What the server may know: the config, public dataset facts and the evaluation harness."""

    info: DatasetInfo
    config: RunConfig
    options: Any
    num_clients: int
    evaluate: Callable[[nn.Module], dict[str, float]]  # test-set harness for server-side models
    run_dir: Path | None = None  # where the server may write artifacts (plots, samples)
    test_labels: torch.Tensor | None = None  # evaluation harness only: scores logits clients report on it
    progress: bool = False  # whether the server may show its own progress bars (inner steps)
    # The held-out validation split (labelled) that FedDF's server keeps for model selection, early
    # stopping and drop-worst; algorithms that select on the clients' shards ignore it.
    validation: ImageSet | None = None
    # Evaluation harness: the task's metrics of given outputs (an ensemble's, say) on the first
    # len(outputs) test samples, for servers that hold outputs rather than a model
    score: Callable[[torch.Tensor], dict[str, float]] | None = None


class StopRun(Exception):
    """Raised by `ServerLogic.run_round` to end the run early and cleanly (for example when a client
    refuses to exceed its privacy budget). The runner evaluates the current model(s), writes the
    round's row, the final metrics and the summary (with this reason), as at the end of a full run.
    `metrics` are the round's metrics so far."""

    def __init__(self, reason: str, metrics: dict[str, float] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.metrics = dict(metrics or {})


class ServerLogic(ABC):
    """Drives the protocol one round at a time, so the run loop can checkpoint between rounds."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    def setup(self, fleet: Fleet) -> None:  # noqa: B027 - optional hook
        """Round-0 work before the first round (for example building the global model)."""

    @abstractmethod
    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        """One round of the protocol; returns metrics to stream to metrics.jsonl."""

    @abstractmethod
    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        """Test metrics of the current model(s); must include the task's headline, `test_<headline>`
        (`Task.headline`), which the run's progress, curves and summary lead with."""

    def final_evaluate(self, fleet: Fleet, last: dict[str, float]) -> dict[str, float]:
        """The metrics reported for the run: by default `last`, the last round's evaluation. Methods
        that keep the best model by validation override this to report that model instead."""
        return last

    def models(self) -> dict[str, nn.Module]:
        """Server-side models to export at the end of a run (name -> module)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the server (models, optimisers, counters); empty by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore what state_dict() returned (stateless servers ignore it)."""


@dataclass(frozen=True)
class NoOptions:
    """The options of an algorithm that takes none: its config table must stay empty."""

    pass


#: An evaluation-only oracle: (each client's ``state_dict()``, its training-set size, the config, the
#: dataset facts, the test set) -> an accuracy. The runner reports it as ``global_accuracy_oracle``.
Oracle = Callable[[Sequence[Mapping[str, Any]], Sequence[float], RunConfig, DatasetInfo, ImageSet], float]


@dataclass(frozen=True)
class Algorithm:
    """A registered method: its client and server logic, its options, and the tasks it runs on."""

    name: str
    summary: str
    client: Callable[[ClientContext], ClientLogic]
    server: Callable[[ServerContext], ServerLogic]
    options: type = NoOptions
    pooled: bool = False  # True: one client holds all training data (not federated)
    # Evaluation only, outside the protocol: the in-process runner calls it with the client objects'
    # own states (never a message, never the ledger); see algorithms/shared/oracle.py.
    oracle: Oracle | None = None
    # Its options as its clients and server run them, a `preset` filled into the keys the config leaves
    # unset (config, options, dataset facts -> options); None: as the config gives them. The dry run's plan
    # shows these.
    resolve_options: Callable[[RunConfig, Any, DatasetInfo], Any] | None = None
    # The tasks it runs on (fedistill.tasks); the run refuses any other with a clear message.
    tasks: tuple[str, ...] = ("classification",)
    # The common keys it never reads, each with what decides that instead ("{name}" stands for the
    # algorithm): set in its own table (`[dense] local_epochs`), such a key is refused rather than ignored;
    # set at the top level it serves the suite's other algorithms. Every other common key is read.
    unused_keys: Mapping[str, str] = field(default_factory=dict, hash=False)


#: For `Algorithm.tasks`: every image task there is.
ALL_TASKS = ("classification", "semantic-segmentation", "instance-segmentation", "reconstruction")
#: Token-id inputs: for the methods that exchange only parameters or logits, never generated inputs.
TEXT_TASKS = ("text-classification",)


ALGORITHMS: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
    """Add `algorithm` to the registry under its name (a later one of the same name replaces it), once the
    keys it declares exist: a misspelt one would otherwise fail mid-setup as an AttributeError."""
    check_declared_keys(algorithm)
    ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def check_declared_keys(algorithm: Algorithm) -> None:
    """ValueError unless each of `unused_keys` is a common key and each of the options' `model_keys` one of
    its options, naming the key and the closest valid one."""
    common = [name for name in RunConfig.__dataclass_fields__ if name != "options"]
    for key in algorithm.unused_keys:
        if key not in common:
            close = difflib.get_close_matches(key, common, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{algorithm.name}: unused_keys names {key!r}, not a common key{hint}")
    options = algorithm.options
    names = [item.name for item in fields(options)] if is_dataclass(options) else []
    for key in str(getattr(options, "model_keys", "")).split():
        if key not in names:
            raise ValueError(
                f"{algorithm.name}: {options.__name__}.model_keys names {key!r}, not one of its options "
                f"({', '.join(names) or 'none'})"
            )


def model_cycle(names: str, default: str, *, key: str) -> list[str]:
    """A comma list of model names cycled over the clients (client k gets entry k % len); empty: `default`."""
    cycle = [n.strip() for n in (names or default).split(",") if n.strip()]
    if not cycle:
        raise ConfigError(f"{key} names no model: {names!r}")
    return cycle


def clone_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of a module's state dict, safe to keep while the module trains on."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}
