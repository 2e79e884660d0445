"""Every algorithm end to end on a tiny federation on one device, with the traceback of any failure:
`python benchmarks/device_smoke.py --device cuda [--out DIR]`. A check for the `device` key, not a
benchmark: it records which algorithms ran and how long each took."""

from __future__ import annotations

import argparse
import tempfile
import time
import traceback
from pathlib import Path

from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import run_suite

TINY = {"clients": 3, "rounds": 2, "batch_size": 32, "alpha": 1.0, "model": "lenet-fedmdcg"}
PER_ALGORITHM = {
    "fediod": {"fediod": {"preset": "paper", "teacher_epochs": 1, "iters_per_epoch": 2, "synthetic_batch_size": 16,
                          "generator_width": 8, "discriminator_width": 8, "w_bn": 1.0, "pool_size": 64,
                          "pool_steps": 1}},
    "feddf": {"feddf": {"steps": 4, "eval_every_steps": 2}},
    "dense": {"dense": {"teacher_epochs": 1, "g_steps": 2, "synthetic_batch_size": 16, "generator_width": 8}},
    "coboosting": {"coboosting": {"teacher_epochs": 1, "g_steps": 2, "synthetic_batch_size": 16,
                                  "generator_width": 8}},
    "fedkd": {"fedkd": {"teacher_epochs": 1}},
    "fedmd": {"fedmd": {"alignment_size": 64, "transfer_epochs": 1}},
    "asyndgan": {"asyndgan": {"generator_width": 4, "generator_blocks": 1, "discriminator_width": 4,
                              "discriminator_layers": 2, "synthetic_batch_size": 4, "iters_per_epoch": 2}},
    "flmrcm": {"flmrcm": {"discriminator_width": 8, "feature_batches": 1}},
}  # fmt: skip
DENSE_TASKS = {
    "segmentation": {"dataset": "mni152-synthetic-lesions", "model": "unet", "partition": "natural",
                     "mni152-synthetic-lesions": {"image_size": 32, "train_subjects": 8, "test_subjects": 2},
                     "model_options": {"width": 4, "depth": 2}, "task": {"hd95": False}},
    "reconstruction": {"dataset": "mni152-t1", "model": "unet-fastmri", "partition": "natural",
                       "mni152-t1": {"image_size": 32, "sites": 3},
                       "model_options": {"chans": 4, "num_pool_layers": 2}},
}  # fmt: skip
DENSE_FEDIOD = {"fediod": {"teacher_epochs": 1, "iters_per_epoch": 2, "synthetic_batch_size": 4,
                           "student_steps": 1, "generator_width": 4, "generator_blocks": 1,
                           "discriminator_width": 4, "discriminator_layers": 2}}  # fmt: skip


def planned_runs(algorithms: list[str]) -> list[tuple[str, dict]]:
    """(label, config layer) for each algorithm on classification, then the per-pixel tasks' methods;
    per-pixel FedIOD takes DENSE_FEDIOD's table whole (a table given twice is replaced, not merged)."""
    runs = [(name, TINY | PER_ALGORITHM.get(name, {})) for name in algorithms]
    dense = {
        "segmentation": ("fediod", "fedavg", "asyndgan"),
        "reconstruction": ("fediod", "fedavg", "flmrcm"),
    }
    runs += [(f"{a}-{task}", TINY | layer | (DENSE_FEDIOD if a == "fediod" else PER_ALGORITHM.get(a, {})))
             for task, layer in DENSE_TASKS.items() for a in dense[task]]  # fmt: skip
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--algorithms", default="fedavg,standalone,centralized,fediod,feddf,fedper,lgfedavg,"
                        "fedmdcg,fedgen,fedcg,dense,coboosting,fedkd,fedmd")  # fmt: skip
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp())
    for label, layer in planned_runs(args.algorithms.split(",")):
        algorithm = label.split("-")[0]
        config = build_config(RunConfig(), layer, {"algorithm": algorithm, "device": args.device})
        start = time.perf_counter()
        try:
            summary = run_suite(config, out / label, progress=False)[0]
            print(f"OK   {label:28s} {time.perf_counter() - start:6.1f}s  {summary['headline']} "
                  f"{summary['final'].get(summary['headline'])}  device {summary['device']}", flush=True)  # fmt: skip
        except Exception:
            print(f"FAIL {label}", flush=True)
            traceback.print_exc()


if __name__ == "__main__":
    main()
