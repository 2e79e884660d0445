"""Model selection (FedIOD, DENSE, AsynDGAN): the best validated epoch wins, a tie goes to the later one."""

import torch
from torch import nn

from fedistill.algorithms.shared.selection import keep_if_best, nothing_selected


def test_the_best_score_wins_and_a_tie_goes_to_the_later_epoch():
    model = nn.Linear(2, 1)
    best = nothing_selected()
    for epoch, score in enumerate([0.50, 0.70, 0.60, 0.70, 0.65], start=1):
        with torch.no_grad():
            model.weight.fill_(float(epoch))  # the state of each epoch is recognisable
        best = keep_if_best(best, score, epoch, model)
    assert best["epoch"] == 4 and best["score"] == 0.70
    assert torch.equal(best["state"]["weight"], torch.full((1, 2), 4.0))


def test_the_kept_state_is_a_copy_that_later_training_does_not_change():
    model = nn.Linear(2, 1)
    best = keep_if_best(nothing_selected(), 0.9, 1, model)
    kept = best["state"]["weight"].clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    best = keep_if_best(best, 0.8, 2, model)  # worse: the record stays
    assert best["epoch"] == 1 and torch.equal(best["state"]["weight"], kept)


def test_a_fediod_run_hands_over_the_latest_of_its_best_validated_epochs(tmp_path):
    """End to end: the run's final student is the latest epoch with the best validation score in
    metrics.jsonl, and its test accuracy is that epoch's. A student rate of 1e-12 leaves the (batch-norm
    free) student almost as it starts, so epochs tie: the latest of them must be handed over, not the
    first."""
    import copy

    from algorithm_helpers import TINY_FEDIOD
    from fedistill.config import RunConfig, build_config
    from fedistill.engine.launch import run_suite
    from fedistill.engine.rundir import read_jsonl

    layer = copy.deepcopy(TINY_FEDIOD) | {"rounds": 4}
    layer["fediod"]["lr_student"] = 1e-12
    config = build_config(RunConfig(), layer, {"algorithm": "fediod"})
    summary = run_suite(config, tmp_path, progress=False)[0]
    rows = read_jsonl(tmp_path / "fediod" / "metrics.jsonl")
    scores = [row["val_accuracy"] for row in rows]
    assert scores.count(max(scores)) > 1  # epochs tie
    latest_best = max(i for i, score in enumerate(scores) if score == max(scores))
    assert summary["final"]["selected_epoch"] == rows[latest_best]["round"]
    assert summary["final"]["test_accuracy"] == rows[latest_best]["test_accuracy"]


def test_a_fediod_run_reports_the_validation_score_of_the_epoch_it_selected(tmp_path, monkeypatch):
    """Epoch 2 validates best and is handed over; epoch 3 validates worse. The summary's validation score
    must be epoch 2's, beside epoch 2's test accuracy, not the last epoch's. The clients still score each
    epoch, but the scores are set here: the trained ones rank the epochs by a sample or two of the
    validation split, an order that other kernels' rounding changes."""
    import copy

    from algorithm_helpers import TINY_FEDIOD
    from fedistill.algorithms.fediod import student
    from fedistill.config import RunConfig, build_config
    from fedistill.engine.launch import run_suite
    from fedistill.engine.rundir import read_jsonl

    scripted = iter([0.25, 0.75, 0.5])
    clients_score = student.clients_validation_score
    monkeypatch.setattr(
        student, "clients_validation_score", lambda *a, **k: (clients_score(*a, **k), next(scripted))[1]
    )
    layer = copy.deepcopy(TINY_FEDIOD) | {"rounds": 3, "val_fraction": 0.1}
    layer["fediod"]["selection"] = "validation"
    config = build_config(RunConfig(), layer, {"algorithm": "fediod", "dataset": "digits"})
    final = run_suite(config, tmp_path, progress=False)[0]["final"]
    rows = {row["round"]: row for row in read_jsonl(tmp_path / "fediod" / "metrics.jsonl")}
    assert [rows[r]["val_accuracy"] for r in (1, 2, 3)] == [0.25, 0.75, 0.5]
    assert final["selected_epoch"] == 2  # the last epoch is not the one kept
    assert final["val_accuracy"] == 0.75
    assert final["test_accuracy"] == rows[2]["test_accuracy"]
