"""A finished run's results as Python objects, read from the files the run wrote: per algorithm its
metrics per round (metrics.jsonl), final metrics, what crossed the boundary (the ledger's totals) and
its whole summary.json; per run the results table `fedistill summary` prints."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedistill.engine.suite_dir import still_running
from fedistill.errors import RunDirError
from fedistill.inference.run_folder import algorithms_in, check_run_dir, is_algorithm_dir, planned_algorithms


@dataclass(frozen=True)
class AlgorithmResult:
    """One algorithm of a run: `metrics` (one dict per round, as metrics.jsonl holds them), `final` (the
    summary's final metrics), `communication` (bytes and messages per direction, kind and client) and
    `summary` (summary.json as it is)."""

    name: str
    run_dir: Path
    metrics: list[dict[str, Any]]
    final: dict[str, Any]
    communication: dict[str, Any]
    summary: dict[str, Any]

    @property
    def headline(self) -> str:
        """The metric the run leads with (`test_accuracy` for classification)."""
        return str(self.summary.get("headline", "test_accuracy"))

    @property
    def bytes_up(self) -> int:
        """Every byte the sites sent to the server."""
        from fedistill.federation.ledger import UP

        return int(self.communication[UP]["total_bytes"])

    @property
    def bytes_down(self) -> int:
        """Every byte the server sent to the sites."""
        from fedistill.federation.ledger import DOWN

        return int(self.communication[DOWN]["total_bytes"])

    def curve(self, metric: str) -> list[tuple[int, float]]:
        """(round, value) of `metric` over the rounds that recorded it; KeyError naming the metrics the run
        recorded when no round recorded this one (a misspelt name)."""
        if not any(metric in row for row in self.metrics):
            recorded = sorted({key for row in self.metrics for key in row} - {"round"})
            raise KeyError(
                f"no round of {self.name} recorded {metric!r} (recorded: {', '.join(recorded) or 'nothing'})"
            )
        return [(int(row["round"]), row[metric]) for row in self.metrics if row.get(metric) is not None]


@dataclass(frozen=True)
class RunResult:
    """A run directory's results, one `AlgorithmResult` per algorithm in the run's order:
    `result["fedavg"].final["test_accuracy"]`. `unfinished`: the algorithms the run plans that have no
    summary.json yet (running, failed or interrupted; `--resume` finishes them)."""

    run_dir: Path
    algorithms: dict[str, AlgorithmResult]
    unfinished: tuple[str, ...] = ()

    def __getitem__(self, name: str) -> AlgorithmResult:
        if name in self.unfinished:
            advice = still_running(self.run_dir) or f"fedistill run --resume {self.run_dir}"
            raise KeyError(f"{name} has not finished in {self.run_dir}: {advice}")
        if name not in self.algorithms:
            raise KeyError(f"no {name!r} in {self.run_dir} (it holds: {', '.join(self.algorithms)})")
        return self.algorithms[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.algorithms)

    def __len__(self) -> int:
        return len(self.algorithms)

    def __contains__(self, name: object) -> bool:
        return name in self.algorithms

    @property
    def summaries(self) -> list[dict[str, Any]]:
        """The summaries of the run's algorithms, in the run's order."""
        return [result.summary for result in self.algorithms.values()]

    def table(self) -> list[dict[str, str]]:
        """The results table as rows of column title -> cell, as `fedistill summary` prints it."""
        from fedistill.engine.summary import results_rows

        return results_rows(self.summaries)

    def markdown(self) -> str:
        """The results table in Markdown (results.md's table)."""
        from fedistill.engine.summary import results_markdown

        return results_markdown(self.summaries)


def read_algorithm(run_dir: Path) -> AlgorithmResult:
    """One finished algorithm's folder; RunDirError naming the damaged or missing file."""
    from fedistill.engine.rundir import read_jsonl
    from fedistill.engine.summary import read_summary

    summary = read_summary(run_dir)
    path = run_dir / "metrics.jsonl"
    try:
        metrics = read_jsonl(path) if path.is_file() else []
    except (UnicodeDecodeError, ValueError) as exc:
        raise RunDirError(f"{path} is damaged ({type(exc).__name__}); --resume rebuilds it") from None
    return AlgorithmResult(
        name=str(summary["algorithm"]),
        run_dir=run_dir,
        metrics=metrics,
        final=dict(summary["final"]),
        communication=dict(summary["communication"]),
        summary=summary,
    )


def read_run(run_dir: str | Path, *, stacklevel: int = 2) -> RunResult:
    """The results of a finished run directory, or of one algorithm's folder of one. Algorithms the run
    plans that have not finished are left out, named in `unfinished` and in a UserWarning, as `fedistill
    summary` names them on stderr; `stacklevel`: the warning's, so that it points at the user's line."""
    path = check_run_dir(Path(run_dir))
    unfinished: list[str] = []
    one_algorithm = is_algorithm_dir(path)
    if one_algorithm:
        folders = [path]
    else:
        folders = [path / name for name in algorithms_in(path) if (path / name / "summary.json").is_file()]
        done = {folder.name for folder in folders}
        unfinished = [name for name in planned_algorithms(path) if name not in done]
    suite = path.parent if one_algorithm else path
    if not folders or not (folders[0] / "summary.json").is_file():
        advice = still_running(suite) or f"finish it with `fedistill run --resume {suite}`"
        raise RunDirError(f"{path} holds no finished run yet (no summary.json); {advice}")
    results = [read_algorithm(folder) for folder in folders]
    if unfinished:
        warnings.warn(
            f"{path}: not finished (no summary.json): {', '.join(unfinished)}; "
            + (still_running(path) or f"finish with `fedistill run --resume {path}`"),
            UserWarning,
            stacklevel=stacklevel,
        )
    algorithms = {result.name: result for result in results}
    return RunResult(run_dir=path, algorithms=algorithms, unfinished=tuple(unfinished))
