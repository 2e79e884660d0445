"""FedIOD's segmentation figures (the paper's Figures 5, 3 and 6) from the runs of segmentation_tables.py
(`fedistill.reproduce.segmentation_figures`).

    python benchmarks/segmentation_figures.py [--results DIR] [--slices 4]

Reads the runs named in <results>/segmentation_table{2,4}.json (either may be missing) and writes
segmentation_figure5.png, segmentation_figure3_nuclei.png and segmentation_figure6[_nuclei].png there.
"""

from __future__ import annotations

import sys

from fedistill.reproduce.segmentation_figures import main

if __name__ == "__main__":
    sys.exit(main())
