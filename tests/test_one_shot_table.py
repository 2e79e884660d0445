"""benchmarks/one_shot_table.py: every method gets the same stage-1 options, FedDF distils on the other
MNIST-family domain, and the table reports each method as a fraction of its ensemble."""

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import one_shot_table as table


def test_every_method_shares_the_stage1_options_and_feddf_uses_the_other_domain():
    args = SimpleNamespace(teacher_epochs=7, iters=11, feddf_steps=13)
    for method in table.METHODS:
        assert f"{table.algorithm_of(method)}.teacher_epochs=7" in table.method_sets(method, args, "mnist")
    assert "feddf-oneshot.source='dataset:fashion-mnist'" in table.method_sets("feddf-oneshot", args, "mnist")
    assert "feddf-oneshot.source='noise'" in table.method_sets("feddf-oneshot", args, "digits")
    assert "fediod.iters_per_epoch=11" in table.method_sets("fediod", args, "mnist")
    # the stable row is FedIOD with its preset, on the same budget
    stable = table.method_sets("fediod-stable", args, "mnist")
    assert "fediod.iters_per_epoch=11" in stable and "fediod.preset='stable'" in stable
    # the other FedIOD row keeps the paper's settings it was measured with, plus its stabilisers
    assert table.method_sets("fediod", args, "mnist")[2:] == ["fediod.preset='paper'", *table.STABILISERS]


def test_the_table_divides_each_student_by_its_ensemble():
    row = {"test_accuracy": 0.6, "ensemble_accuracy": 0.8, "ensemble_uniform_accuracy": 0.75,
           "teacher_mean_accuracy": 0.5,
           "teachers_from_cache": 10.0, "wall_time_s": 3.0, "parameters_up": 1234}  # fmt: skip
    text = table.markdown([{"dataset": "mnist", "alpha": "0.1", "rows": {"dense": row}}], "cmd")
    assert "| mnist | 0.1 | dense | 60.00 | 80.00 | 0.750 | 0.800 | 10 | 1,234 | 3 | DENSE: 0.77" in text


def test_kd_steps_give_dense_and_coboosting_a_longer_student_schedule_as_extra_rows():
    args = SimpleNamespace(teacher_epochs=7, iters=11, feddf_steps=13)
    assert table.kd_step_list("0,200") == [0, 200]
    for wrong in ("abc", "-5", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="comma list"):
            table.kd_step_list(wrong)
    assert "dense.kd_steps=200" in table.method_sets("dense", args, "mnist", 200)
    assert not any("kd_steps" in s for s in table.method_sets("dense", args, "mnist"))
    row = {"test_accuracy": 0.6, "ensemble_accuracy": 0.8, "ensemble_uniform_accuracy": 0.75,
           "teacher_mean_accuracy": 0.5, "teachers_from_cache": 10.0, "wall_time_s": 3.0,
           "parameters_up": 1}  # fmt: skip
    text = table.markdown(
        [{"dataset": "mnist", "alpha": "0.1", "rows": {"coboosting (kd_steps 200)": row}}], "c"
    )
    assert "| coboosting (kd_steps 200) | 60.00 |" in text and "DENSE: 0.77" in text


def test_running_a_subset_of_the_methods_leaves_the_table_file_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(table, "RESULTS", tmp_path)
    monkeypatch.setattr(table, "cell", lambda args, dataset, alpha: {})
    monkeypatch.setattr(table, "markdown", lambda cells, command: command)
    base = ["one_shot_table.py", "--datasets", "mnist", "--alphas", "0.5"]
    monkeypatch.setattr("sys.argv", [*base, "--methods", "dense,coboosting"])
    table.main()
    assert not (tmp_path / "one_shot_mnist.md").exists()
    assert "left as it was" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", [*base, "--methods", "dense", "--table-only"])
    table.main()
    assert (tmp_path / "one_shot_mnist.md").is_file()
