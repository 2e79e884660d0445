"""FedIOD's segmentation tables (the paper's Tables 2, 4 and 8) end to end: plan every method's run
(`segmentation_plan`), run it, score the models it saved (`segmentation_scores`) and write the tables
(`segmentation_report`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

from fedistill.errors import ConfigError
from fedistill.reproduce.segmentation_plan import execute, parse, plan, tables, training_samples
from fedistill.reproduce.segmentation_report import earlier_record, write
from fedistill.reproduce.segmentation_scores import row


def main(argv: Sequence[str] | None = None) -> int:
    """The command line's tables (`argv`, else `sys.argv`), each printed once written."""
    args = parse(argv)
    torch.set_num_threads(args.threads)
    for table in tables(args):
        if args.merge:  # refused before any run when the record does not compare
            try:
                earlier_record(table, args)
            except ConfigError as error:
                print(f"segmentation_tables.py: error: {error}", file=sys.stderr)
                return 2
        specs = plan(table, args, training_samples(table, args))
        runs = {spec.method: execute(table, spec, args) for spec in specs}
        rows = {method: row(method, run, args, table.number) for method, run in runs.items()}
        path = write(table, rows, args, merge=args.merge)
        print(path.read_text(encoding="utf-8"))
    return 0
