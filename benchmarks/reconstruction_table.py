"""FedIOD's Table 9 (appendix, "Brain MRI reconstruction") at CPU scale: SSIM and PSNR per test source.

The runs, their budgets, the scoring and the table are `fedistill.reproduce.reconstruction_plan`,
`reconstruction_scores` and `reconstruction_report` (`--help` describes them).

    python benchmarks/reconstruction_table.py --image-size 64 --epochs 20 --fediod-epochs 30 --iters 10 \\
        --threads 1 --reuse

Writes <results>/reconstruction_table9.{md,json} (default benchmarks/results/); runs go under --out
(default benchmarks/runs/reconstruction-table/). benchmarks/reconstruction_figures.py draws Figure 7 from
the JSON.
"""

from __future__ import annotations

from fedistill.reproduce.reconstruction_report import main

if __name__ == "__main__":
    main()
