"""FedIOD next to the one-shot methods (DENSE, Co-Boosting, one-shot FedAvg and FedDF) on identical
teachers, as a target: the student's test accuracy per method and heterogeneity (`one_shot_table`).

ci: the embedded digits, 5 clients at Dirichlet alpha 0.5 and 0.1, one suite per alpha (FedIOD trains the
teachers, the others load them from the stage-1 cache): 10 teacher epochs, 5 distillation epochs of 10
G-steps, DENSE and Co-Boosting with a smaller generator and 50 student batches per epoch. cpu: the ready
configs under configs/one-shot/ at the budget of the recorded table (benchmarks/results/one_shot_*.md: 8
distillation epochs, FedIOD 30 G-steps per epoch, one torch thread), checked against its numbers. The
papers' own numbers are on other clients, models and budgets: no row has one.
"""

from __future__ import annotations

from fedistill.reproduce.target_spec import DEMO, Column, Expected, Row, Run, Scale, Target

COLUMNS = (Column("test", "student test accuracy %", ("final.test_accuracy",)),)
LABELS = {
    "fediod": "FedIOD",
    "fediod-stable": "FedIOD (stable preset)",
    "dense": "DENSE",
    "dense-kd200": "DENSE (200 student batches)",
    "coboosting": "Co-Boosting",
    "coboosting-kd200": "Co-Boosting (200 student batches)",
    "fedavg-oneshot": "one-shot FedAvg",
    "feddf-oneshot": "one-shot FedDF",
}

CI_METHODS = ("fediod", "dense", "coboosting", "fedavg-oneshot")
CI_ALPHAS = ("0.5", "0.1")
_PEER = ("teacher_epochs=10", "synthetic_batch_size=64", "g_steps=10", "latent_dim=64", "generator_width=16",
         "kd_batch_size=64", "kd_steps=50", "lr_student=0.05", "samples_every=0")  # fmt: skip
CI_SETS = (
    f"algorithm='{','.join(CI_METHODS)}'", "threads=1", "device='cpu'", "clients=5", "rounds=5",
    "fediod.teacher_epochs=10", "fediod.iters_per_epoch=10", "fediod.synthetic_batch_size=64",
    "fediod.pool_steps=5", "fediod.samples_every=0",
    *(f"{peer}.{item}" for peer in ("dense", "coboosting") for item in _PEER),
    "fedavg-oneshot.teacher_epochs=10", "fedavg-oneshot.rounds=1",
)  # fmt: skip
#: ci: our student test % per (alpha, method), seed 0, measured with `fedistill reproduce one-shot --scale ci`
CI_RECORDED = {
    ("0.5", "fediod"): 93.06,  # with `wire = "compact"`, the default (92.50 with float32)
    ("0.5", "dense"): 46.11,
    ("0.5", "coboosting"): 45.00,  # re-measured after the re-weighting became one pass (44.17 before)
    ("0.5", "fedavg-oneshot"): 86.94,
    ("0.1", "fediod"): 84.72,  # (85.83 with float32)
    ("0.1", "dense"): 33.61,
    ("0.1", "coboosting"): 30.83,  # likewise (33.06 before); both on an AVX-512 Intel host
    ("0.1", "fedavg-oneshot"): 58.61,
}
#: ci tolerances per method: float rounding differs between CPUs, and a generator's samples amplify it. Seed
#: 0 on one Intel host through three kernel paths (AVX-512, AVX2, SSE4.1 and no vectorised ATen:
#: ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA) moved DENSE by up to 3.33 points from the numbers above
#: (measured on another host), Co-Boosting by up to 2.50, FedIOD by up to 1.94, one-shot FedAvg by 0.28:
#: 1.5 times the largest gap, rounded up, and never below 3.
CI_TOLERANCE = {"fediod": 3.0, "dense": 5.0, "coboosting": 4.0, "fedavg-oneshot": 3.0}

CPU_METHODS = tuple(LABELS)
CPU_DATASETS = ("mnist", "fashion-mnist")
CPU_ALPHAS = ("0.1", "0.5", "1")
#: cpu: the recorded table's student test % (benchmarks/results/one_shot_<dataset>.json), per config stem.
#: The coboosting-kd200 cells predate the fix to Co-Boosting's re-weighting (one pass over the pool, whatever
#: kd_steps); the code now gives 72.40 / 82.87 / 83.12 on Fashion-MNIST and 88.65 / 94.41 / 94.95 on MNIST
#: at alpha 0.1 / 0.5 / 1 on this table's configs (benchmarks/results/recorded/coboosting-kd200-*.md).
CPU_RECORDED = {
    "mnist": {
        "0.1": {"fedavg-oneshot": 62.11, "feddf-oneshot": 72.05, "dense": 19.45, "dense-kd200": 80.18,
                "coboosting": 15.85, "coboosting-kd200": 88.53, "fediod": 88.59, "fediod-stable": 91.44},
        "0.5": {"fedavg-oneshot": 88.41, "feddf-oneshot": 93.03, "dense": 30.33, "dense-kd200": 93.54,
                "coboosting": 32.92, "coboosting-kd200": 94.73, "fediod-stable": 94.4},
        "1": {"fedavg-oneshot": 92.58, "feddf-oneshot": 93.86, "dense": 36.42, "dense-kd200": 94.78,
              "coboosting": 31.68, "coboosting-kd200": 94.36, "fediod": 93.74, "fediod-stable": 94.84},
    },
    "fashion-mnist": {
        "0.1": {"fedavg-oneshot": 60.48, "feddf-oneshot": 67.75, "dense": 36.48, "dense-kd200": 65.25,
                "coboosting": 43.23, "coboosting-kd200": 73.84, "fediod": 71.6, "fediod-stable": 76.93},
        "0.5": {"fedavg-oneshot": 80.3, "feddf-oneshot": 80.59, "dense": 56.89, "dense-kd200": 81.41,
                "coboosting": 52.47, "coboosting-kd200": 82.88, "fediod-stable": 82.54},
        "1": {"fedavg-oneshot": 82.83, "feddf-oneshot": 83.26, "dense": 62.12, "dense-kd200": 83.21,
              "coboosting": 62.33, "coboosting-kd200": 83.68, "fediod": 82.42, "fediod-stable": 84.05},
    },
}  # fmt: skip


def ci_scale() -> Scale:
    runs = tuple(Run(f"digits-alpha{alpha}", DEMO, (*CI_SETS, f"alpha={alpha}")) for alpha in CI_ALPHAS)
    rows = tuple(
        Row(
            f"{LABELS[method]}, alpha {alpha}",
            f"digits-alpha{alpha}",
            method,
            {"test": Expected(ours=CI_RECORDED[alpha, method], tolerance=CI_TOLERANCE[method])},
        )
        for alpha in CI_ALPHAS
        for method in CI_METHODS
    )
    return Scale(runs, rows, note="digits, 5 clients; every method of an alpha distils the same teachers")


def cpu_sets(method: str) -> tuple[str, ...]:
    """The recorded table's budget on top of a ready config: 8 distillation epochs (the multi-epoch
    methods), FedIOD's 30 G-steps per epoch, one torch thread, the stage-1 cache beside the runs."""
    sets = ["threads=1", "cache_dir=''"]
    if not method.endswith("-oneshot"):
        sets.append("rounds=8")
    if method.startswith("fediod"):
        sets.append("fediod.iters_per_epoch=30")
    return tuple(sets)


def cpu_scale() -> Scale:
    runs, rows = [], []
    for dataset in CPU_DATASETS:
        for alpha in CPU_ALPHAS:
            for method in CPU_METHODS:
                name = f"{method}-{dataset}-alpha{alpha}"
                runs.append(Run(name, f"one-shot/{name}.toml", cpu_sets(method)))
                ours = CPU_RECORDED[dataset][alpha].get(method)
                algorithm = method.split("-kd")[0].removesuffix("-stable")
                label = f"{LABELS[method]}, {dataset}, alpha {alpha}"
                rows.append(Row(label, name, algorithm, {"test": Expected(ours=ours, tolerance=2.0)}))
    return Scale(tuple(runs), tuple(rows), note="K = 10, lenet-fedmdcg, 10 teacher epochs")


def one_shot_target() -> Target:
    return Target(
        name="one-shot",
        title="FedIOD against DENSE, Co-Boosting and one-shot FedAvg/FedDF on identical teachers",
        source="FedIOD (heterogeneity), DENSE (Zhang et al. 2022), Co-Boosting (Dai et al. 2024)",
        columns=COLUMNS,
        scales={"ci": ci_scale(), "cpu": cpu_scale()},
    )
