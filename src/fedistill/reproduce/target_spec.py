"""What a reproducible result is, declared: a target names the paper's table it reproduces, and per scale
the runs it needs, the rows of its table and the numbers each row is expected to give.

A run is a config under configs/ (or the package's digits demo) plus `--set` overrides; it may hold several
algorithms side by side (one suite, one partition). A row reads one algorithm of one run, and one number
per column from that algorithm's summary.json, averaged over the run's seeds. Each (row, column) may carry
an `Expected`: the paper's number, our recorded number at that scale, and the tolerance that decides the
verdict. Below the paper's scale the verdict compares with our recorded number (the paper's is shown for
reference only: a scaled-down run is no reproduction of it); at `paper` scale it compares with the paper's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import fedistill.engine as engine_package
from fedistill.errors import UserError
from fedistill.reproduce.paths import CONFIGS

#: The scales, smallest first: `ci` a minute or two on 2 CPU cores (every run on the CPU at one torch
#: thread, so its recorded numbers hold on any x86-64 machine within a few points), `cpu` the scaled-down
#: configs of a CPU machine, `paper` the paper's own settings.
SCALES = ("ci", "cpu", "paper")

#: A run's `config` naming the package's digits demo (`fedistill run` with no options) instead of a file
#: under configs/.
DEMO = "@demo"


@dataclass(frozen=True)
class Column:
    """One number a row reports: read from summary.json at the first of `paths` that holds a value (dotted:
    `final.test_accuracy`), times `factor` (100: a fraction shown in %)."""

    key: str
    label: str
    paths: tuple[str, ...]
    factor: float = 100.0
    digits: int = 2
    higher_is_better: bool = True


@dataclass(frozen=True)
class Expected:
    """A (row, column)'s numbers: the paper's, ours as recorded at the scale, and the largest difference
    that still counts as reproduced."""

    paper: float | None = None
    ours: float | None = None
    tolerance: float = 2.0


@dataclass(frozen=True)
class Run:
    """One `fedistill run`: `config` (a path under configs/, or `DEMO`), then `sets` (`KEY=VALUE`, as
    `--set` takes them); `seeds` replace the scale's for this run alone."""

    name: str
    config: str
    sets: tuple[str, ...] = ()
    seeds: tuple[int, ...] | None = None

    def config_path(self) -> Path:
        if self.config == DEMO:
            return Path(engine_package.__file__).parent / "demo.toml"
        return CONFIGS / self.config


@dataclass(frozen=True)
class Row:
    """One line of the table: `algorithm` of the run named `run`, with what each column should give;
    `section` is the part of its summary the columns read ("floor": the task's trivial predictor, scored
    by the same run, instead of its final model)."""

    label: str
    run: str
    algorithm: str
    expected: Mapping[str, Expected] = field(default_factory=dict)
    section: str = "final"


@dataclass(frozen=True)
class Scale:
    """A target at one scale: its runs, rows and default seeds; `check` says which of `Expected`'s numbers
    the verdict compares with (`ours` below the paper's scale, `paper` at it); `columns` replace the
    target's where a scale reports other numbers (the paper's per test source, say)."""

    runs: tuple[Run, ...]
    rows: tuple[Row, ...]
    seeds: tuple[int, ...] = (0,)
    check: str = "ours"
    note: str = ""
    columns: tuple[Column, ...] = ()  # none: the target's

    def run(self, name: str) -> Run:
        return next(r for r in self.runs if r.name == name)

    def seeds_of(self, run: Run, override: tuple[int, ...] | None = None) -> tuple[int, ...]:
        return override or run.seeds or self.seeds


@dataclass(frozen=True)
class Target:
    """A reproducible result: its name (`fedistill reproduce NAME`), a title, the paper and table it
    reproduces, its columns and its scales."""

    name: str
    title: str
    source: str
    columns: tuple[Column, ...]
    scales: Mapping[str, Scale]

    def columns_at(self, scale: str) -> tuple[Column, ...]:
        return self.scales[scale].columns or self.columns

    def narrowed(self, scale: str, patterns: tuple[str, ...]) -> Target:
        """The target at `scale` with only the rows whose label matches every pattern (a regular
        expression, any case), and only the runs those rows read: one slice of a table, without starting
        the rest."""
        import re

        spec = self.scales[scale]
        try:
            compiled = [re.compile(p, re.IGNORECASE) for p in patterns]
        except re.error as exc:
            raise UserError(f"--rows takes regular expressions; {exc.pattern!r}: {exc}") from None
        rows = tuple(r for r in spec.rows if all(c.search(r.label) for c in compiled))
        if not rows:
            examples = "; ".join(r.label for r in spec.rows[:3])
            raise UserError(
                f"no row of {self.name} ({scale}) matches {' and '.join(map(repr, patterns))}"
                f" (rows are named like: {examples})"
            )
        needed = {r.run for r in rows}
        slice_note = f"only the rows matching {' and '.join(patterns)}"
        kept = replace(
            spec,
            runs=tuple(r for r in spec.runs if r.name in needed),
            rows=rows,
            note="; ".join(filter(None, (spec.note, slice_note))),
        )
        return replace(self, scales={**self.scales, scale: kept})
