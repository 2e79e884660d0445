"""The bytes-to-quality benchmark (benchmarks/bytes_to_quality.py): curves are the ledger's cumulative bytes
at each evaluation (stage 1 counted in the first point), FedIOD's accuracy is its validated student's, and
the levels and ratios are read against FedAvg's final accuracy, '-' where never reached."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bytes_to_quality as b2q  # noqa: E402

UP, DOWN = "client->server", "server->client"


def _write_run(run: Path, ledger: list[tuple[int, str, dict[str, int]]], metrics: list[dict]) -> Path:
    run.mkdir(parents=True)
    records = [{"seq": i, "round": r, "step": None, "direction": d, "client": 0, "type": "train",
                "kinds": kinds, "bytes": sum(kinds.values()), "status": "ok"}
               for i, (r, d, kinds) in enumerate(ledger)]  # fmt: skip
    (run / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return run


@pytest.fixture
def curves(tmp_path: Path) -> dict:
    fedavg = _write_run(
        tmp_path / "fedavg",
        [(r, d, {"parameters": 100}) for r in (1, 2, 3) for d in (DOWN, UP)],
        [
            {"round": 1, "test_accuracy": 0.5},
            {"round": 2, "test_accuracy": 0.9},
            {"round": 3, "test_accuracy": 0.8},
        ],
    )
    fediod = _write_run(
        tmp_path / "fediod",
        [(0, UP, {"label-statistics": 7, "metrics": 3}), (1, DOWN, {"synthetic-inputs": 20}),
         (1, UP, {"logits": 10}), (2, DOWN, {"synthetic-inputs": 20}), (2, UP, {"logits": 10})],
        # epoch 2 tests best but validates worse than epoch 1: the validated student stays epoch 1's
        [{"round": 1, "val_accuracy": 0.7, "test_accuracy": 0.75},
         {"round": 2, "val_accuracy": 0.6, "test_accuracy": 0.95}],
    )  # fmt: skip
    return {"FedIOD (float32)": b2q.curve(fediod, validated=True), "FedAvg": b2q.curve(fedavg)}


def test_curve_counts_cumulative_ledger_bytes_and_the_validated_student(curves):
    fediod, fedavg = curves["FedIOD (float32)"], curves["FedAvg"]
    assert [(p["round"], p["bytes"]) for p in fediod["points"]] == [(1, 40), (2, 70)]  # stage 1 in epoch 1
    assert [p["accuracy"] for p in fediod["points"]] == [0.75, 0.75]
    assert fediod["total_bytes"] == 70 and fediod["final_accuracy"] == 0.75
    assert [p["bytes"] for p in fedavg["points"]] == [200, 400, 600]
    assert fedavg["final_accuracy"] == 0.8 and fedavg["total_bytes"] == 600


def test_bytes_by_kind_split_each_direction_and_add_up_to_the_total(curves):
    fediod = curves["FedIOD (float32)"]
    assert fediod["by_kind"] == {f"{DOWN} synthetic-inputs": 40, f"{UP} logits": 20,
                                 f"{UP} label-statistics": 7, f"{UP} metrics": 3}  # fmt: skip
    assert list(fediod["by_kind"].values()) == sorted(fediod["by_kind"].values(), reverse=True)
    assert sum(fediod["by_kind"].values()) == fediod["total_bytes"]
    # the report lists kinds of at least 0.1 MB only: none of these toy sizes
    assert b2q.by_kind_table({"curves": curves})[-1] == "|---|---|---|"
    big = {"FedAvg": {"by_kind": {f"{DOWN} parameters": 3_000_000, f"{UP} metrics": 10}}}
    assert b2q.by_kind_table({"curves": big})[-1] == f"| FedAvg | {DOWN} parameters | 3.00 |"


def test_a_validation_tie_hands_over_the_later_epoch():
    rows = [{"round": 1, "val_accuracy": 0.5, "test_accuracy": 0.6}, {"round": 2, "val_accuracy": 0.5,
            "test_accuracy": 0.7}, {"round": 3, "val_accuracy": 0.4, "test_accuracy": 0.9}]  # fmt: skip
    assert b2q.accuracy_points(rows, validated=True) == [(1, 0.6), (2, 0.7), (3, 0.7)]
    assert b2q.accuracy_points(rows, validated=False) == [(1, 0.6), (2, 0.7), (3, 0.9)]


def test_a_run_that_never_validates_hands_over_each_epochs_student():
    # `selection = "last"`: no val_accuracy in any row, so each epoch's own test accuracy counts
    rows = [{"round": 1, "test_accuracy": 0.6}, {"round": 2, "test_accuracy": 0.5}]
    assert b2q.accuracy_points(rows, validated=True) == [(1, 0.6), (2, 0.5)]
    # validating every other epoch (eval_every = 2): the epochs between keep the last validated choice
    rows = [{"round": 1, "test_accuracy": 0.6}, {"round": 2, "val_accuracy": 0.5, "test_accuracy": 0.7},
            {"round": 3, "test_accuracy": 0.9}]  # fmt: skip
    assert b2q.accuracy_points(rows, validated=True) == [(2, 0.7), (3, 0.7)]


def test_levels_and_ratios_are_read_against_fedavgs_final_accuracy(curves):
    reached = b2q.reached(curves)
    # FedAvg's final is 0.8: 0.90 -> 0.72, 0.95 -> 0.76, 1.00 -> 0.8; it reaches all three in round 2
    assert {level: hit["bytes"] for level, hit in reached["FedAvg"].items()} == {
        "0.90": 400,
        "0.95": 400,
        "1.00": 400,
    }
    assert reached["FedAvg"]["1.00"]["ratio"] == 1.0
    assert reached["FedIOD (float32)"]["0.90"] == {"round": 1, "bytes": 40, "ratio": 0.1}
    assert reached["FedIOD (float32)"]["0.95"] is None and reached["FedIOD (float32)"]["1.00"] is None
    result = {"title": "t", "command": "c", "commit": "abc1234", "machine": "m", "curves": curves,
              "reached": reached, "runs": {"FedAvg": "x/fedavg", "FedIOD (float32)": "y/fediod"}}  # fmt: skip
    row = next(line for line in b2q.report(result).splitlines() if line.startswith("| FedIOD"))
    assert row.split(" | ")[1:] == ["75.00", "0.00", "0.00 (r1)", "0.1", "-", "-", "-", "- |"]


def test_unfinished_keeps_a_stopped_run_as_far_as_it_got_and_a_tag_names_only_the_variants_runs(
    tmp_path, monkeypatch
):
    args = Namespace(demo=False, dataset="digits", alpha="1", clients=3, model="mlp", epochs=4, iters=2,
                     teacher_epochs=1, fedavg_rounds=2, feddf_rounds=1, feddf_source="", threads=1,
                     device="cpu", image_size=0, channels=0, reuse=True, unfinished=True, tag="last", seed=0,
                     out=str(tmp_path), data_dir=str(tmp_path), methods="fedavg,fediod-compact",
                     set=["fediod.selection='last'"], feddf_set=[], reference="")  # fmt: skip
    prefix = tmp_path / "b2q-digits-alpha1_mlp-seed0"
    fedavg = _write_run(Path(f"{prefix}-fedavg") / "fedavg", [(1, DOWN, {"parameters": 100})],
                        [{"round": 1, "test_accuracy": 0.8}])  # fmt: skip
    (fedavg / "summary.json").write_text("{}")
    # killed in epoch 3 of 4: no summary; it never validated (selection = "last")
    _write_run(Path(f"{prefix}-fediod-compact-last") / "fediod", [(1, DOWN, {"synthetic-inputs": 30}),
               (2, DOWN, {"synthetic-inputs": 30})],
               [{"round": 1, "test_accuracy": 0.5}, {"round": 2, "test_accuracy": 0.6}])  # fmt: skip
    launched = []
    monkeypatch.setattr(b2q, "run_fedistill", lambda algorithm, *a, **k: launched.append(k["name"]))
    result = b2q.measure(args)
    # FedAvg's untagged run goes to run_fedistill, whose --reuse keeps it; the stopped run is not relaunched
    assert launched == ["b2q-digits-alpha1_mlp-seed0-fedavg"]
    stopped = result["curves"]["FedIOD (compact)"]
    assert (stopped["stopped_after"], stopped["rounds"], stopped["final_accuracy"]) == (2, 4, 0.6)
    assert [p["accuracy"] for p in stopped["points"]] == [0.5, 0.6]
    result |= {"command": "c", "commit": "abc1234", "machine": "m", "note": ""}
    assert "| FedIOD (compact) (stopped after round 2 of 4) | 60.00 | 0.00 |" in b2q.report(result)


@pytest.mark.slow  # four `fedistill run` processes: about 30 s on an idle machine, minutes on a busy one
def test_tiny_digits_run_end_to_end(tmp_path):
    args = Namespace(demo=False, dataset="digits", alpha="1", clients=3, model="mlp", epochs=2, iters=2,
                     teacher_epochs=1, fedavg_rounds=2, feddf_rounds=1, feddf_source="", threads=1,
                     device="cpu", image_size=0, channels=0, reuse=False, unfinished=False, tag="", seed=0,
                     out=str(tmp_path),
                     data_dir=str(tmp_path), methods=",".join(b2q.METHODS),
                     set=["fediod.generator_width=16", "fediod.discriminator_width=16"],
                     feddf_set=["feddf.steps=10", "feddf.eval_every_steps=5"], reference="")  # fmt: skip
    result = b2q.measure(args)
    assert list(result["curves"]) == ["FedAvg", "FedIOD (float32)", "FedIOD (compact)", "FedDF"]
    for method, run in result["runs"].items():
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        communication = summary["communication"]
        assert (
            result["curves"][method]["total_bytes"]
            == communication[UP]["total_bytes"] + communication[DOWN]["total_bytes"]
        )
        assert result["curves"][method]["final_accuracy"] == summary["final"]["test_accuracy"]
    float32, compact = result["curves"]["FedIOD (float32)"], result["curves"]["FedIOD (compact)"]
    assert compact["total_bytes"] < float32["total_bytes"]
    assert result["reached"]["FedAvg"]["1.00"]["ratio"] == 1.0
    result |= {"command": "c", "commit": "abc1234", "machine": "m"}
    b2q.plot(result, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 0


def test_a_run_with_no_evaluated_round_stops_with_one_line(tmp_path):
    run = _write_run(tmp_path / "killed", [(0, UP, {"label-statistics": 7})], [])
    with pytest.raises(SystemExit, match="no evaluated round yet"):
        b2q.curve(run, validated=True)


def test_a_table_rendered_without_a_gpu_names_the_card_its_runs_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(b2q.torch.cuda, "is_available", lambda: False)
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"device_name": "cuda:0 (NVIDIA H200)"}))
    named = b2q.machine("cuda", 90.0, 2, [run, tmp_path / "missing"])
    assert ", NVIDIA H200 (rendered from its runs" in named
    assert "rendered from CUDA runs on a machine without a GPU" in b2q.machine("cuda", 90.0, 2, [])
    assert b2q.machine("cpu", 90.0, 1, [run]).startswith(f"{b2q.os.cpu_count()} CPUs; fp32")
    assert named.endswith("at 2 thread(s) on the machine that rendered the table")
    assert not b2q.machine("cpu", 90.0, 1, [run]).endswith("rendered the table")


def test_reference_takes_fedavgs_curve_from_an_earlier_record_without_running_it(tmp_path, monkeypatch):
    earlier = {"curves": {"FedAvg": {"points": [{"round": 1, "bytes": 100, "accuracy": 0.8}],
                                     "final_accuracy": 0.8, "total_bytes": 100, "by_kind": {}}},
               "runs": {"FedAvg": "b2q-x-seed0-fedavg/fedavg"},
               "title": "digits, alpha 1, K = 3, mlp"}  # fmt: skip
    record = tmp_path / "earlier.json"
    record.write_text(json.dumps(earlier))
    args = Namespace(demo=False, dataset="digits", alpha="1", clients=3, model="mlp", epochs=2, iters=2,
                     teacher_epochs=1, fedavg_rounds=2, feddf_rounds=1, feddf_source="", threads=1,
                     device="cpu", image_size=0, channels=0, reuse=True, unfinished=False, tag="v", seed=0,
                     out=str(tmp_path), data_dir=str(tmp_path), methods="fediod-compact", set=[],
                     feddf_set=[], reference=str(record))  # fmt: skip
    _write_run(tmp_path / "b2q-digits-alpha1_mlp-seed0-fediod-compact-v" / "fediod",
               [(1, DOWN, {"synthetic-inputs": 30})], [{"round": 1, "test_accuracy": 0.76}])  # fmt: skip
    launched = []
    monkeypatch.setattr(b2q, "run_fedistill", lambda algorithm, *a, **k: launched.append(k["name"]))
    result = b2q.measure(args)
    assert launched == ["b2q-digits-alpha1_mlp-seed0-fediod-compact-v"]  # FedAvg is not run
    assert result["curves"]["FedAvg"] == earlier["curves"]["FedAvg"]
    assert result["runs"]["FedAvg"] == "b2q-x-seed0-fedavg/fedavg, from earlier.json"
    assert result["reached"]["FedIOD (compact)"]["0.95"] == {"round": 1, "bytes": 30, "ratio": 0.3}
    assert " --reference earlier.json" in b2q.command_line(args)
    record.write_text(json.dumps(earlier | {"title": "mnist, alpha 1, K = 3, mlp"}))
    with pytest.raises(SystemExit, match="a record of 'mnist, alpha 1, K = 3, mlp', not of this set"):
        b2q.measure(args)
    record.write_text("{}")
    with pytest.raises(SystemExit, match="not a bytes-to-quality record with a FedAvg curve"):
        b2q.measure(args)


@pytest.mark.parametrize("demo", [False, True])
def test_a_variants_wire_outranks_the_methods_own(demo):
    args = Namespace(demo=demo, dataset="fashion-mnist", alpha="0.1", clients=10, model="resnet8", epochs=2,
                     iters=2, teacher_epochs=1, fedavg_rounds=2, feddf_rounds=1, feddf_source="", threads=1,
                     device="cpu", image_size=0, channels=0, set=["fediod.wire='compact8-gradients'"],
                     feddf_set=[])  # fmt: skip
    sets = b2q.method_runs(args)["FedIOD (compact)"]["sets"]
    assert sets.index("fediod.wire='compact8-gradients'") > sets.index("fediod.wire='compact'")


def test_an_accuracy_equal_to_a_level_reaches_it_despite_the_products_rounding():
    # FedAvg ends at 0.80 of 10,000 test images; 0.9 * 0.80 is 0.7200000000000001 in floats, yet 0.72
    # (7,200 images) is exactly 0.90 of it, and 0.76 exactly 0.95 of it
    curves = {
        "FedAvg": {"points": [{"round": 1, "bytes": 100, "accuracy": 0.72},
                              {"round": 2, "bytes": 200, "accuracy": 0.80}], "final_accuracy": 0.80},
        "FedDF": {"points": [{"round": 1, "bytes": 50, "accuracy": 0.7199},
                             {"round": 2, "bytes": 100, "accuracy": 0.76}], "final_accuracy": 0.76},
    }  # fmt: skip
    reached = b2q.reached(curves)
    assert reached["FedAvg"]["0.90"] == {"round": 1, "bytes": 100, "ratio": 1.0}
    assert reached["FedDF"]["0.90"] == {"round": 2, "bytes": 100, "ratio": 1.0}  # 0.7199 is below 0.72
    assert reached["FedDF"]["0.95"] == {"round": 2, "bytes": 100, "ratio": 0.5}
    assert reached["FedDF"]["1.00"] is None
