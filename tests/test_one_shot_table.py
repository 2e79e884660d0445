"""The one-shot table (fedistill.reproduce.one_shot_table, driven by benchmarks/one_shot_table.py): every
method gets the same stage-1 options, FedDF distils on the other MNIST-family domain, and the table
reports each method as a fraction of its ensemble."""

import argparse
import json
from types import SimpleNamespace

import pytest

from fedistill.reproduce import one_shot_table as table


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
    # the other FedIOD row keeps the paper's settings it was measured with, plus its stabilisers; both rows
    # keep the full-precision messages their numbers were recorded with
    paper = table.method_sets("fediod", args, "mnist")
    assert paper[3:] == ["fediod.preset='paper'", *table.STABILISERS]
    assert "fediod.wire='float32'" in paper and "fediod.wire='float32'" in stable


def test_the_table_divides_each_student_by_its_ensemble():
    row = {"test_accuracy": 0.6, "ensemble_accuracy": 0.8, "ensemble_uniform_accuracy": 0.75,
           "teacher_mean_accuracy": 0.5,
           "teachers_from_cache": 10.0, "wall_time_s": 3.0, "parameters_up": 1234}  # fmt: skip
    text = table.markdown([{"dataset": "mnist", "alpha": "0.1", "rows": {"dense": row}}], "cmd")
    assert "| mnist | 0.1 | dense | 60.00 | 80.00 | 0.750 | 0.800 | 10 | 1,234 | 3 | DENSE: 0.77" in text
    assert "Machine: not recorded." in text  # a run older than the summary's machine
    row["machine"] = "Some CPU, 2 CPUs, AVX2 kernels"
    text = table.markdown([{"dataset": "mnist", "alpha": "0.1", "rows": {"dense": row}}], "cmd")
    assert "Machine: Some CPU, 2 CPUs, AVX2 kernels." in text


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


def test_running_a_subset_of_the_methods_leaves_the_table_file_alone(tmp_path):
    every = ",".join(table.METHODS)
    assert not table.keeps_the_table_file(every, table_only=False)
    assert table.keeps_the_table_file("dense,coboosting", table_only=False)
    assert not table.keeps_the_table_file("dense", table_only=True)  # it tabulates every finished run
    row = {"test_accuracy": 0.6, "ensemble_accuracy": 0.8, "ensemble_uniform_accuracy": 0.75,
           "teacher_mean_accuracy": 0.5, "teachers_from_cache": 10.0, "wall_time_s": 3.0,
           "parameters_up": 1}  # fmt: skip
    cells = [{"dataset": "mnist", "alpha": "0.5", "rows": {"dense": row}}]
    text = table.write(cells, "mnist", "cmd", tmp_path)
    assert (tmp_path / "one_shot_mnist.md").read_text() == text == table.markdown(cells, "cmd")
    assert json.loads((tmp_path / "one_shot_mnist.json").read_text()) == {"command": "cmd", "cells": cells}
