"""Targets at the paper's scale only, one row per ready config (GPU runs on the papers' datasets):
FedDF's Tables 3-8 and its Figures 3 and 4, FedIOD's Table 1 rows of FedMD and FedKD. The figures have
no numbers in the papers' text, so their rows report ours and check nothing."""

from __future__ import annotations

from fedistill.reproduce.target_configs import config_keys, config_scale
from fedistill.reproduce.target_spec import Column, Target

ACCURACY = (Column("test_accuracy", "test accuracy %", ("final.test_accuracy",)),)


def paper_targets() -> list[Target]:
    feddf_tables = [*config_keys("feddf", "table3"), *config_keys("feddf", "table4"),
                    *config_keys("feddf", "ablation")]  # fmt: skip
    return [
        Target(
            name="feddf-tables",
            title="FedDF: drop-worst VGG-9, binarized ResNet-8 and the ablations of its Tables 5-8",
            source="FedDF paper, Tables 3-8 (CIFAR-10)",
            columns=ACCURACY,
            scales={"paper": config_scale(feddf_tables, ACCURACY)},
        ),
        Target(
            name="feddf-figures",
            title="FedDF: DistilBERT fine-tuning (AG News, SST-2) and heterogeneous architectures (CIFAR-10)",
            source="FedDF paper, Figures 3 and 4",
            columns=ACCURACY,
            scales={
                "paper": config_scale(
                    [*config_keys("feddf-text"), *config_keys("feddf", "figure4")],
                    ACCURACY,
                    note="figures: the papers give no number to check, only the ordering of the curves",
                )
            },
        ),
        Target(
            name="fediod-table1",
            title="FedIOD's Table 1: FedMD and FedKD on CIFAR-10 / CIFAR-100",
            source="FedIOD paper, Table 1 (K = 20, ResNet-8)",
            columns=ACCURACY,
            scales={"paper": config_scale(config_keys("fediod-table1"), ACCURACY)},
        ),
    ]
