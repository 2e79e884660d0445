"""FedIOD's segmentation tables (the paper's Tables 2, 4 and 8) on the semi-synthetic stand-ins.

The runs, budgets and scoring are `fedistill.reproduce.segmentation_plan` and its neighbours (`--help`
describes them).

    python benchmarks/segmentation_tables.py [--tables 2,4] [--methods ...] [--reuse]

Writes benchmarks/results/segmentation_table2.{md,json} and segmentation_table4.{md,json}. Every run is
its own `fedistill run` process at `--threads` torch threads (one by default).
"""

from __future__ import annotations

import sys

from fedistill.reproduce.segmentation_tables import main

if __name__ == "__main__":
    sys.exit(main())
