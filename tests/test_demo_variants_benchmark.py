"""The demo-variant sweep (fedistill.reproduce.demo_variants, driven by benchmarks/fediod_demo_variants.py):
cells and variants parse as documented, and the table compares each variant with `base` on exactly the
seeds both ran."""

import argparse

import pytest

from fedistill.reproduce import demo_variants as sweep


def test_cells_and_variants_parse_as_documented():
    assert sweep.parse_cells("10:0.5:3-5,20:0.1:0+7-8") == [(10, "0.5", [3, 4, 5]), (20, "0.1", [0, 7, 8])]
    variants = sweep.parse_variants(["n=fediod.student_noise=0.85", "two=fediod.tau=2.0;fediod.w_adv=0.1"])
    assert variants == {
        "base": [],
        "n": ["fediod.student_noise=0.85"],
        "two": ["fediod.tau=2.0", "fediod.w_adv=0.1"],
    }
    with pytest.raises(SystemExit, match="NAME=KEY=VALUE"):
        sweep.parse_variants(["noise"])
    for bad in ("10:0.5", "10:half:3-5", "10:0.5:three"):
        with pytest.raises(SystemExit, match="K:alpha:seeds"):
            sweep.parse_cells(bad)


def _row(variant, seed, test, ens=0.98, **extra):
    return {"variant": variant, "clients": 10, "alpha": 0.5, "seed": seed, "test_accuracy": test,
            "ensemble_accuracy": ens, "wall_time_s": 40.0, **extra}  # fmt: skip


def test_the_table_pairs_each_variant_with_base_on_the_same_seeds():
    rows = [
        _row("base", 3, 0.90, fedavg_accuracy=0.97),
        _row("base", 4, 0.94, fedavg_accuracy=0.95),
        _row("v", 3, 0.92),  # +2 points
        _row("v", 4, 0.93),  # -1 point
        _row("v", 5, 0.99),  # no base run at seed 5: in the mean, not in the pairing
        {"variant": "v", "clients": 10, "alpha": 0.5, "seed": 6, "error": "boom"},
    ]
    lines = sweep.table(rows)
    variant = next(line for line in lines if "| v |" in line)
    cells = [c.strip() for c in variant.split("|")[1:-1]]
    assert cells[3] == "3,4,5"
    assert cells[4] == f"{100 * (0.92 + 0.93 + 0.99) / 3:.2f}"
    assert cells[5] == "+0.50 (2)" and cells[6] == "1 / 1"
    assert any("FedAvg 96.00%" in line for line in lines)
    assert lines[-1] == "- v K=10 alpha=0.5 seed 6: boom"
    assert cells[9] == "-"  # no FedAvg times in these rows: no ratio


def test_fediods_time_is_given_as_a_multiple_of_fedavgs_in_the_same_sweep():
    """The demo's time goal is a ratio: each variant's mean time over FedAvg's mean time on the base seeds."""
    rows = [
        _row("base", 3, 0.90, fedavg_accuracy=0.97, fedavg_wall_time_s=4.0),
        _row("base", 4, 0.94, fedavg_accuracy=0.95, fedavg_wall_time_s=6.0),
        _row("v", 3, 0.92, wall_time_s=15.0),
    ]
    lines = sweep.table(rows)
    ratios = {line.split("|")[3].strip(): line.split("|")[10].strip() for line in lines if "| 10 |" in line}
    assert ratios == {"base": "8.0x", "v": "3.0x"}  # 40 s and 15 s against FedAvg's mean 5 s
    assert any("FedAvg 5 s a run" in line for line in lines)


def test_runs_tag_names_the_run_folders_and_tag_the_result_files(tmp_path, monkeypatch):
    """`--runs-tag` lets a sweep reuse another sweep's finished runs under its own result files."""
    seen = []

    def fake_run_on_demo(**kwargs):
        seen.append(kwargs["name"])
        return "stopped here"  # no summary is read after an error

    monkeypatch.setattr(sweep, "run_on_demo", fake_run_on_demo)
    args = argparse.Namespace(tag="new", runs_tag="old", out=str(tmp_path), fedavg=False, reuse=True)
    row = sweep.run_variant(args, "base", [], 10, "0.5", 3)
    assert seen == ["variant-base-K10-alpha0.5-seed3-old"] and row["error"] == "stopped here"
    args.runs_tag = None
    sweep.run_variant(args, "base", [], 10, "0.5", 3)
    assert seen[-1] == "variant-base-K10-alpha0.5-seed3-new"
