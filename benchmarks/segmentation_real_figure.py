"""The two real lesion patients with every segmentation method's prediction overlaid
(`fedistill.reproduce.segmentation_real_figure`), each model loaded with `fedistill.load_model` and
predicted as `fedistill predict` predicts a NIfTI volume.

    python benchmarks/segmentation_real_figure.py --runs RUNS_DIR [--out DIR] [--slices 2]

RUNS_DIR holds the segmentation run folders, e.g. `<out>/reproduce/segmentation-table2-ci/runs` after
`fedistill reproduce segmentation-table2 --scale ci --out <out>`. Writes segmentation_real_patients.png
and .json into --out (benchmarks/results by default).
"""

from __future__ import annotations

import sys

from fedistill import load_model
from fedistill.inference.segment import segment_volume
from fedistill.reproduce.segmentation_real_figure import main

if __name__ == "__main__":
    sys.exit(main(None, load=load_model, segment=segment_volume))
