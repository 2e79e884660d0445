"""A fast smoke test of the gradient-inversion threat models (fedistill.analysis.threat_models) on the
embedded 8x8 digits (no files needed): replies are intercepted exactly, partial sharing is attacked on the
shared part only, and FedIOD's replay reproduces the client's real answer from the real batch."""

from __future__ import annotations

import argparse

import pytest
import torch
from torch import nn

from fedistill.analysis import threat_models
from fedistill.analysis.interception import RecordingFleet
from fedistill.data.registry import load_dataset
from fedistill.federation.ledger import Ledger
from fedistill.models import build_model
from fedistill.transports.inprocess import InProcessFleet


@pytest.fixture(scope="module")
def bench():
    return threat_models


def _in_process(clients):
    return InProcessFleet(clients, Ledger(None))


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _setup(bench, digits, variant: str = "dlg"):
    args = argparse.Namespace(seed=0, data_dir="data", iterations=3, fediod_iterations=2, kappa=0.1)
    return bench.Setup("digits", digits.info, digits.train, digits.test, variant, args, _in_process)


def test_variants_are_registered_models(digits) -> None:
    sigmoid = build_model("lenet-fedmdcg-sigmoid", digits.info)
    dlg = build_model("lenet-fedmdcg-dlg", digits.info, norm="none")
    assert not any(isinstance(m, nn.ReLU) for m in sigmoid.modules())
    assert any(isinstance(m, nn.MaxPool2d) for m in sigmoid.modules())
    assert not any(isinstance(m, (nn.MaxPool2d, nn.BatchNorm2d)) for m in dlg.modules())
    assert dlg(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_fedavg_reply_is_intercepted_exactly_and_attacked(bench, digits) -> None:
    results, offset = bench.fedavg_setting(_setup(bench, digits), 1, 1, 0)
    (entry,) = results[""]
    assert offset == 2 and entry["kinds"] == ["parameters"]
    assert entry["truth"].shape == (1, 1, 8, 8)
    assert entry["gradient_check"] < 1e-5  # the update is exactly lr x the gradient of the captured batch
    for attack in ("dlg", "idlg"):
        score = entry["scores"][attack]
        assert len(score.psnr) == len(score.ssim) == 1 and score.reconstruction.shape == (1, 1, 8, 8)


@pytest.mark.parametrize(("algorithm", "batch"), [("fedper", 1), ("lgfedavg", 1), ("fedmdcg", 2)])
def test_partial_sharing_is_attacked_on_the_shared_part(bench, digits, algorithm, batch) -> None:
    out, _ = bench.partial_setting(_setup(bench, digits), algorithm, 1, batch, 0)
    known, unknown = out["known"][0], out["unknown"][0]
    assert known["gradient_check"] < 1e-5 and unknown["gradient_check"] is None
    assert known["truth"].shape[0] == batch
    if algorithm == "fedmdcg":
        assert known["kinds"] == ["label-statistics", "parameters"]
    if algorithm == "fedper":  # the last layer stays private: no label for iDLG to read
        assert known["scores"]["idlg"].psnr == [] and known["scores"]["idlg"].note.startswith("n/a")
    else:
        assert len(known["scores"]["idlg"].psnr) == batch


def test_fediod_replay_reproduces_the_client_reply(bench, digits) -> None:
    out, _ = bench.fediod_setting(_setup(bench, digits, "relu"), 2, 0)
    inversion = out["dstep-inversion"]
    # no parameter or gradient of one; the class counts of stage 1 (here: the labels of the whole batch)
    assert inversion["kinds"] == ["discriminator-outputs", "input-gradients", "label-statistics", "logits"]
    replay = inversion["replay_error"]
    assert replay["input_gradient"] < 1e-4 and replay["ratio"] < 1e-5
    assert replay["objective_true_batch"] < 1e-8 <= replay["objective_other_batch"]
    assert len(inversion["score"].psnr) == 2 and len(out["server-inputs"]["score"].psnr) == 2


def test_the_recording_fleet_keeps_every_exchange_over_its_transport() -> None:
    """What the server holds: every request and reply, with the round it set stamped on the ledger."""
    from fedistill.federation.messages import Message

    class Echo:
        def handle(self, request: Message) -> Message:
            return Message.build("query.echo", scalars={"metrics": {"type": request.type}})

    inner = _in_process({0: Echo(), 1: Echo()})
    fleet = RecordingFleet(inner)
    fleet.round = 3
    replies = fleet.broadcast(Message.build("query.ping"))
    assert fleet.clients == [0, 1] and inner.round == 3 and set(replies) == {0, 1}
    request, reply = fleet.exchange("query.ping", 1)
    assert request.type == "query.ping" and reply.scalar("metrics", "type") == "query.ping"
    with pytest.raises(KeyError):
        fleet.exchange("query.pong", 0)
    assert fleet.kinds_sent(0) == []  # scalars only

    class Counts:
        def handle(self, request: Message) -> Message:
            if request.type == "query.ping":
                return Message.build("query.echo", scalars={"metrics": {"type": request.type}})
            return Message.build("train", {"label-statistics": {"class_counts": torch.ones(3)}})

    fleet = RecordingFleet(_in_process({0: Counts()}))
    fleet.broadcast(Message.build("train"))
    fleet.broadcast(Message.build("query.ping"))
    assert fleet.kinds_sent(0) == ["label-statistics"]  # what an earlier exchange sent counts too


def test_per_image_scores_line_up_with_the_images_they_score(digits, monkeypatch) -> None:
    """A batch recovered in reverse order: each PSNR, SSIM and label sits with the image it scores."""
    from fedistill.analysis import inversion_scores
    from fedistill.data.transforms import to_float
    from fedistill.metrics.image_quality import psnr
    from fedistill.privacy.attacks import AttackResult

    truth, labels = to_float(digits.train.x[:2], digits.info), digits.train.y[:2]
    noise = torch.randn(truth.shape, generator=torch.Generator().manual_seed(0))
    # image 0 recovered coarsely, image 1 almost exactly, the attack returning them as (1, 0)
    rec = torch.stack([truth[1] + 0.01 * noise[1], truth[0] + 0.3 * noise[0]])

    def attack(*args, **kwargs):
        return AttackResult("fake", rec, labels.flip(0), None, [1.0])

    monkeypatch.setattr(inversion_scores, "dlg_attack", attack)
    monkeypatch.setattr(inversion_scores, "idlg_attack", attack)
    model = build_model("lenet-fedmdcg-dlg", digits.info, norm="none")
    scores = inversion_scores.attack_gradient(model, {}, truth, labels, digits.info, iterations=1, seed=0)
    got = scores["dlg"]
    truth01 = inversion_scores.to_unit(truth, digits.info)
    expected = psnr(truth01, got.reconstruction).tolist()
    assert torch.equal(got.reconstruction[1], inversion_scores.to_unit(rec[:1], digits.info)[0])
    assert got.psnr == pytest.approx(expected) and got.psnr[1] > got.psnr[0] + 10
    assert got.ssim[1] > got.ssim[0] and got.label_accuracy == 1.0


def test_the_mean_image_reference_scores_each_attacked_image_once(bench, digits) -> None:
    """FedPer's known and unknown rows attack the same 2 images: the reference has 2 scores, not 4."""
    from fedistill.reproduce.privacy_attacks import run_dataset_variant

    setup = _setup(bench, digits)
    setup.args.iterations, setup.args.images, setup.args.multi_steps = 1, 2, 1
    setup.args.methods = "fedper"
    results = run_dataset_variant(setup)
    known, unknown = results["fedper/known-head"]["truth"], results["fedper/unknown-head"]["truth"]
    assert torch.equal(known, unknown) and len(known) == 2
    assert len(results["reference/mean-image"]["scores"]["attack"].psnr) == 2


def test_only_a_missing_last_layer_makes_idlg_not_applicable(digits) -> None:
    """A bad setting (here 0 iterations) is an error, not a table of n/a cells; a reply without the last
    layer (FedPer's) still makes iDLG n/a, with the reason."""
    import torch.nn.functional as F

    from fedistill.analysis.inversion_scores import attack_gradient
    from fedistill.data.transforms import to_float

    model = build_model("lenet-fedmdcg-dlg", digits.info, norm="none")
    truth, labels = to_float(digits.train.x[:1], digits.info), digits.train.y[:1]
    named = dict(model.named_parameters())
    grads = torch.autograd.grad(F.cross_entropy(model(truth), labels), list(named.values()))
    observed = dict(zip(named, grads, strict=True))
    with pytest.raises(ValueError, match="iterations must be >= 1, got 0"):
        attack_gradient(model, observed, truth, labels, digits.info, iterations=0, seed=0)
    extractor = {n: g for n, g in observed.items() if n.startswith("extractor.")}
    scores = attack_gradient(model, extractor, truth, labels, digits.info, iterations=1, seed=0)
    assert len(scores["dlg"].psnr) == 1
    assert scores["idlg"].psnr == [] and "last layer" in scores["idlg"].note


def test_a_grid_without_an_attack_row_says_why(digits, tmp_path, monkeypatch) -> None:
    """FedPer's grid has no iDLG row (its reply holds no last layer): the grid's title says so."""
    from types import SimpleNamespace

    from fedistill.analysis.inversion_scores import Score
    from fedistill.reproduce import privacy_attacks

    drawn: list[tuple[int, str]] = []

    def grid(images: torch.Tensor, path, *, nrow: int, titles: list[str], title: str):
        drawn.append((len(images), title))
        return path

    monkeypatch.setattr(privacy_attacks, "save_image_grid", grid)
    truth = torch.zeros(2, 1, 8, 8)
    note = "n/a: the reply holds no last layer to read labels from"
    results = {
        "fedper/known-head": {
            "truth": truth,
            "scores": {
                "dlg": Score([1.0, 2.0], [0.1, 0.2], reconstruction=torch.zeros(2, 1, 8, 8)),
                "idlg": Score([], [], note=note),
            },
        }
    }
    setup = SimpleNamespace(dataset="digits", variant="dlg", info=digits.info)
    privacy_attacks.save_grids(setup, results, tmp_path)
    # two rows (the client's batch, DLG) and the missing one named in the title
    assert drawn == [(4, f"digits, dlg: fedper/known-head; no idlg row ({note})")]


def test_a_misspelt_method_is_named_and_a_setting_that_cannot_run_says_why(bench, digits) -> None:
    """`methods` used to drop a misspelt name silently (an empty table), and FedMD-CG's rows vanished
    when one image per setting left no batch of 2 to train on."""
    from fedistill.reproduce.privacy_attacks import run_dataset_variant

    setup = _setup(bench, digits)
    setup.args.iterations, setup.args.images, setup.args.multi_steps = 1, 1, 1
    setup.args.methods = "fedavg,fedpr"
    with pytest.raises(
        ValueError, match=r"unknown method 'fedpr'.*fedavg, fedper, lgfedavg, fedmdcg, fediod"
    ):
        run_dataset_variant(setup)
    setup.args.methods = "fedmdcg"
    results = run_dataset_variant(setup)
    for setting in ("fedmdcg/known-extractor", "fedmdcg/unknown-extractor"):
        for attack in ("dlg", "idlg"):
            score = results[setting]["scores"][attack]
            assert (
                score.psnr == [] and score.note == "n/a: FedMD-CG's setting needs images >= 2 (a batch of 2)"
            )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--kappa", "-0.1"], "--kappa must be >= 0, got -0.1"),
        (["--fediod-iterations", "-1"], "--fediod-iterations must be >= 0, got -1"),
        (["--iterations", "0"], "--iterations must be >= 1, got 0"),
        (["--methods", "fedavg,fedpr"], "unknown method 'fedpr'"),
    ],
)
def test_the_benchmark_refuses_bad_budgets_up_front(flags, message, tmp_path, capsys) -> None:
    """A negative kappa used to mean the exact (unrelaxed) replay and a negative FedIOD budget none."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import privacy_attacks

    args = ["--datasets", "digits", "--variants", "dlg", "--methods", "fedavg", "--images", "1"]
    with pytest.raises(SystemExit) as exit_info:
        privacy_attacks.main([*args, "--iterations", "1", "--out", str(tmp_path), *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_the_mean_image_reference_reads_float_images_as_they_are(bench, digits) -> None:
    """Images stored as float32 in [0, 1] (as a data set may hold them) used to be divided by 255 once
    more, putting the mean-image reference at a black image."""
    from fedistill.data.base import ImageSet
    from fedistill.reproduce.privacy_attacks import run_dataset_variant

    references = []
    for train in (digits.train, ImageSet(digits.train.x.float() / 255.0, digits.train.y)):
        setup = _setup(bench, digits)
        setup.train = train
        setup.args.iterations, setup.args.images, setup.args.multi_steps = 1, 1, 1
        setup.args.methods = "fedavg"
        references.append(run_dataset_variant(setup)["reference/mean-image"]["scores"]["attack"].psnr)
    assert references[1] == pytest.approx(references[0], abs=1e-4)


def test_a_test_split_smaller_than_the_public_share_is_attacked_whole(bench, digits) -> None:
    """A run on one's own small image folder has fewer than the 200 test images the attacked round lends
    its server as public data: the round uses all there are instead of stopping on an IndexError."""
    small = digits.test.subset(range(24))
    setup = bench.Setup(
        "digits", digits.info, digits.train, small, "dlg", _setup(bench, digits).args, _in_process
    )
    results, _ = bench.fedavg_setting(setup, 1, 1, 0)
    assert results[""][0]["kinds"] == ["parameters"]


def test_a_batch_larger_than_the_classes_makes_idlg_not_applicable(digits) -> None:
    """iDLG reads one label per class: a batch of 11 on 10 classes (`--multi-steps 11`) is an n/a cell with
    the reason, not an error that stops the whole table."""
    import torch.nn.functional as F

    from fedistill.analysis.inversion_scores import attack_gradient
    from fedistill.data.transforms import to_float

    model = build_model("lenet-fedmdcg-dlg", digits.info, norm="none")
    truth, labels = to_float(digits.train.x[:11], digits.info), digits.train.y[:11]
    named = dict(model.named_parameters())
    grads = torch.autograd.grad(F.cross_entropy(model(truth), labels), list(named.values()))
    scores = attack_gradient(
        model, dict(zip(named, grads, strict=True)), truth, labels, digits.info, iterations=1, seed=0
    )
    assert len(scores["dlg"].psnr) == 11
    assert scores["idlg"].psnr == []
    assert (
        scores["idlg"].note
        == "n/a: iDLG reads one label per class, and the batch of 11 exceeds the 10 classes"
    )


def test_a_dataset_the_benchmark_cannot_load_is_refused_before_any_attack(tmp_path, capsys) -> None:
    """A misspelt or missing second dataset used to end in a traceback after the first one's attacks."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import privacy_attacks

    args = ["--datasets", "digits,mnsit", "--variants", "dlg", "--methods", "fedavg", "--images", "1"]
    with pytest.raises(SystemExit) as exit_info:
        privacy_attacks.main([*args, "--iterations", "1", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--datasets" in err and "mnsit" in err and "Traceback" not in err
    assert not (tmp_path / "privacy_attacks").exists()


def test_a_perfect_reconstruction_is_written_as_valid_json_and_read_as_infinite() -> None:
    """An exact reconstruction has PSNR inf, which the result file held as `Infinity` (not JSON: jq and
    JavaScript refuse it). Now it is null with a count and a note; the table still shows it as infinite."""
    import json
    import math

    from fedistill.analysis.inversion_scores import Score
    from fedistill.reproduce.privacy_report import cell

    for psnrs in ([math.inf, 20.0], [math.inf, math.inf]):
        summary = Score(psnrs, [1.0, 0.5]).summary()
        back = json.loads(json.dumps(summary, allow_nan=False))
        assert back["psnr"][0] is None and back["psnr_mean"] is None and back["psnr_std"] is None
        assert back["psnr_infinite"] == psnrs.count(math.inf)
        assert "exact" in back["note"]
        assert cell(back) == "∞ / 0.75"
    finite = Score([20.0, 30.0], [1.0, 0.5]).summary()
    assert (finite["psnr_mean"], "psnr_infinite" in finite, cell(finite)) == (25.0, False, "25.0 / 0.75")


def test_every_row_states_how_many_images_it_attacked(tmp_path) -> None:
    """Multi-step FedAvg attacks whole clients of `--multi-steps` images and FedMD-CG batches of 2: with
    `--images 3 --multi-steps 2` both attacked 2 images while the report said 3 for every setting. Each
    row now carries the count it attacked, and the report names it where it differs from `--images`."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import privacy_attacks

    args = ["--datasets", "digits", "--variants", "dlg", "--methods", "fedavg,fedmdcg", "--images", "3"]
    assert (
        privacy_attacks.main([*args, "--multi-steps", "2", "--iterations", "1", "--out", str(tmp_path)]) == 0
    )
    results = json.loads((tmp_path / "privacy_attacks.json").read_text())["results"]["digits"]["dlg"]
    attacked = {setting: entry["images"] for setting, entry in results.items() if "images" in entry}
    assert attacked == {
        "fedavg-1step": 3,
        "fedavg-multistep": 2,
        "fedmdcg/known-extractor": 2,
        "fedmdcg/unknown-extractor": 2,
    }
    rows = {
        line.split("|")[1].strip(" `"): line
        for line in (tmp_path / "privacy_attacks.md").read_text().splitlines()
        if line.startswith("| `")
    }
    assert "images attacked" not in rows["fedavg-1step"]
    assert "2 images attacked, not 3: whole clients of 2 steps" in rows["fedavg-multistep"]
    for knowledge in ("known", "unknown"):
        assert "2 images attacked, not 3: whole batches of 2" in rows[f"fedmdcg/{knowledge}-extractor"]
    # FedIOD on one image attacks two (its D-step needs a batch of 2); a row that attacked none is n/a
    from fedistill.reproduce.privacy_report import images_note

    one = {"images": 1, "multi_steps": 4}
    assert images_note("fediod/dstep-inversion", {"images": 2}, one) == (
        "; 2 images attacked, not 1: its D-step needs a batch of 2 or more"
    )
    assert images_note("fedmdcg/known-extractor", {"images": 0}, one) == ""
