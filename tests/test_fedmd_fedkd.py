"""FedMD and FedKD: their defining steps by hand, what crosses the boundary (never parameters), that
each beats training alone on non-IID digits, clear errors, invalid replies, and exact resume.

The comparison setting: five clients on a Dirichlet(0.5) split of digits, the public set being the
held-out 30% of the training split, which the partition draws before it deals the rest to the clients,
so no client trains on it. It runs in seconds and is fair: Standalone trains on exactly the same private
shards (same seed, same partition) for as many private epochs as FedMD's clients (5 set-up + 5 revisit),
FedMD must also beat its own clients before collaboration (`start_test_accuracy`, transfer learning on
the same public set, the paper's baseline), and FedKD's student is compared with the very local models
it distils (`teacher_mean_accuracy`)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from algorithm_helpers import Sent, check_resume_after_crash, make_client, run_recording
from fedistill.algorithms.base import ServerContext
from fedistill.algorithms.fedmd.fedkd import (
    FedKDClient,
    FedKDOptions,
    FedKDServer,
    VotesSpec,
    aggregate,
    calibrate,
    quantise,
)
from fedistill.algorithms.fedmd.fedmd import FedMDClient, FedMDOptions, FedMDServer, consensus, digest_loss
from fedistill.algorithms.fedmd.public_data import build_public
from fedistill.cli import main
from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import run_suite
from fedistill.engine.setup import prepare_data
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.ledger import DOWN, UP
from fedistill.federation.messages import ArraySpec, Message
from fedistill.privacy import pate

#: The comparison: non-IID digits, the held-out 30% as public data, a small CNN.
COMPARE = {
    "clients": 5,
    "alpha": 0.5,
    "batch_size": 32,
    "seed": 0,
    "val_fraction": 0.3,
    "model": "small-cnn",
    "rounds": 5,
    "standalone": {"rounds": 10},  # as many private epochs as FedMD's 5 set-up + 5 revisit epochs
    "fedmd": {"transfer_epochs": 5, "private_epochs": 5},
    "fedkd": {"rounds": 10, "teacher_epochs": 10},
}
#: The smallest runs that exercise every message type, for resume and invalid replies.
TINY = {
    "clients": 3,
    "alpha": 1.0,
    "batch_size": 32,
    "seed": 0,
    "val_fraction": 0.2,
    "model": "mlp",
    "rounds": 3,
    "fedmd": {"models": "mlp,small-cnn", "transfer_epochs": 1, "private_epochs": 1, "alignment_size": 100},
    "fedkd": {
        "teacher_epochs": 2,
        "output": "probs",
        "bits": 3,
        "client_noise": 0.05,
        "pate_epsilon": 8.0,
        "public_size": 150,
    },
}


def _config(base: dict, **changes) -> RunConfig:
    return build_config(RunConfig(), base, changes)


# --- the defining steps, by hand --------------------------------------------------------------------
def test_fedmd_consensus_is_the_mean_of_the_scores_and_the_digest_loss_its_distance():
    a = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    b = torch.tensor([[3.0, 0.0, -1.0], [2.0, -2.0, 4.0]])
    target = consensus([a, b])
    assert torch.equal(target, torch.tensor([[2.0, 1.0, 1.0], [1.0, -1.0, 2.0]]))

    scores = torch.tensor([[1.0, 1.0, 4.0], [1.0, -1.0, 2.0]])  # differs from the target by (-1, 0, 3), 0
    assert digest_loss(scores, target, "l1").item() == pytest.approx(4 / 6)
    assert digest_loss(scores, target, "mse").item() == pytest.approx(10 / 6)
    p = [math.exp(v) / sum(math.exp(u) for u in (2, 1, 1)) for v in (2, 1, 1)]
    q = [math.exp(v) / sum(math.exp(u) for u in (1, 1, 4)) for v in (1, 1, 4)]
    by_hand = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True)) / 2  # second row: 0
    assert digest_loss(scores, target, "kl").item() == pytest.approx(by_hand, rel=1e-5)


def test_fedkd_quantises_to_votes_and_levels_that_sum_exactly():
    probs = torch.tensor([[0.2, 0.5, 0.3], [0.5, 0.5, 0.0]])
    assert quantise(probs, "one-hot", 8).tolist() == [[0, 1, 0], [1, 0, 0]]  # ties: the lower class
    # 2 bits: 3 levels. 0.5/0.3/0.2 -> 1.5/0.9/0.6: floors 1/0/0, the two units left go to the largest
    # remainders (0.9, 0.6); 0.1/0.7/0.2 -> 0.3/2.1/0.6: floors 0/2/0, one unit left, to 0.6.
    got = quantise(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.7, 0.2]]), "probs", 2)
    assert got.dtype == torch.uint8 and got.tolist() == [[1, 1, 1], [0, 2, 1]]
    many = torch.softmax(torch.randn(200, 10, generator=torch.Generator().manual_seed(0)) * 3, 1)
    assert (quantise(many, "probs", 4).sum(1) == 15).all()


def test_fedkd_quantises_probabilities_on_the_device_they_are_on():
    """A client's probabilities stay on the run's device, and quantising them there must not mix in a CPU
    tensor, which CUDA refuses (`output = "probs"` failed on a GPU). Meta tensors stand in for an
    accelerator's; they do not refuse a mix themselves, so every operation's tensors are checked here."""
    from torch.utils._python_dispatch import TorchDispatchMode

    mixed: list[str] = []

    class SameDevice(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            flat = [*args, *(kwargs or {}).values()]
            devices = {a.device.type for a in flat if isinstance(a, torch.Tensor) and a.dim() > 0}
            if len(devices) > 1:
                mixed.append(f"{func}: {sorted(devices)}")
            return func(*args, **(kwargs or {}))

    with SameDevice():
        votes = quantise(torch.full((4, 3), 1 / 3, device="meta"), "probs", 3)
    assert not mixed and votes.device.type == "meta" and votes.dtype == torch.uint8


def test_fedkd_aggregates_votes_into_the_plurality_without_noise():
    one_hot = lambda classes: torch.eye(3, dtype=torch.uint8)[classes]  # noqa: E731
    votes = [one_hot([2, 0]), one_hot([2, 1]), one_hot([0, 2])]  # image 0: 2, 2, 0; image 1: 0, 1, 2
    counts, labels = aggregate(votes, 1, 0.0, np.random.default_rng(0))
    assert counts.tolist() == [[1, 0, 2], [1, 1, 1]] and labels.tolist() == [2, 0]  # a tie: the lower class
    levels = [torch.tensor([[1, 1, 1]], dtype=torch.uint8), torch.tensor([[0, 2, 1]], dtype=torch.uint8)]
    counts, labels = aggregate(levels, 3, 0.0, np.random.default_rng(0))
    assert counts[0].tolist() == pytest.approx([1 / 3, 1, 2 / 3]) and labels.tolist() == [1]

    rng = np.random.default_rng(1)
    many = [torch.eye(10, dtype=torch.uint8)[torch.from_numpy(rng.integers(0, 10, 50))] for _ in range(7)]
    counts, labels = aggregate(many, 1, 0.0, np.random.default_rng(2))
    assert np.array_equal(labels, counts.argmax(1)) and counts.sum(1).tolist() == [7.0] * 50


def test_fedkd_calibrates_gnmax_to_its_budget_with_the_pate_analysis():
    sigma = calibrate(FedKDOptions(pate_epsilon=5.0), 100)
    epsilon = lambda s: pate.rdp_to_epsilon(100 * pate.rdp_gnmax_data_independent(s), 1e-5)[0]  # noqa: E731
    assert epsilon(sigma) <= 5.0 < epsilon(0.99 * sigma)
    assert calibrate(FedKDOptions(pate_sigma=3.0), 100) == 3.0


def test_fedkd_refuses_votes_that_are_not_votes():
    spec = VotesSpec({"votes": {"votes": ArraySpec("uint8", (2, 3))}}, levels=1)
    good = Message.build(
        "query.votes", arrays={"votes": {"votes": np.array([[0, 1, 0], [1, 0, 0]], np.uint8)}}
    )
    spec.check(good)
    for bad in ([[1, 1, 0], [1, 0, 0]], [[0, 0, 0], [1, 0, 0]], [[0, 2, 0], [1, 0, 0]]):
        message = Message.build("query.votes", arrays={"votes": {"votes": np.array(bad, np.uint8)}})
        with pytest.raises(FederationError, match="sum to 1"):
            spec.check(message)


# --- clear errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "match"),
    [
        (FedMDOptions(public="noise"), "no labels"),
        (FedMDOptions(public="generator:g.safetensors"), "no labels"),
        (FedMDOptions(public="mnist"), "fedmd.public must be 'holdout'"),
        (FedMDOptions(digest_loss="l2"), "fedmd.digest_loss"),
        (FedMDOptions(alignment_size=0), "fedmd.alignment_size"),
        (FedKDOptions(bits=9), "fedkd.bits"),
        # bits sizes the levels of quantised probabilities; a one-hot vote has none to size
        (FedKDOptions(bits=2), r"fedkd.bits = 2 sets the levels of output = 'probs'"),
        (FedKDOptions(pate_sigma=1.0, pate_epsilon=1.0), "not both"),
        (FedKDOptions(output="soft"), "fedkd.output"),
        (FedKDOptions(public="dataset:"), "fedkd.public must be"),
        # a text dataset's token ids are no images: refused before a tokenizer or its files are asked for
        (FedKDOptions(public="dataset:sst-2"), r"fedkd.public = 'dataset:sst-2' is a text dataset"),
        (FedMDOptions(public="dataset:ag-news"), r"fedmd.public = 'dataset:ag-news' is a text dataset"),
        # a misspelt model is refused with the options, before the run directory is created
        (
            FedMDOptions(models="mlp, small_cnn"),
            r"fedmd.models names an unknown model 'small_cnn'.*'small-cnn'",
        ),
        (FedKDOptions(teachers="resnet8,lenet"), r"fedkd.teachers names an unknown model 'lenet'"),
        (FedKDOptions(student="resnet-8"), r"fedkd.student names an unknown model 'resnet-8'"),
        # an unknown name is refused with the options, under the option's own name, not once the run began
        (FedKDOptions(public="dataset:mnsit"), r"fedkd.public = 'dataset:mnsit': unknown dataset.*'mnist'"),
    ],
)
def test_bad_options_are_refused_by_name(options, match):
    with pytest.raises(ConfigError, match=match):
        options.validate()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        # drawn public images need a number to draw: refused with the options, not once the run folder exists
        (FedKDOptions(public="noise"), r"fedkd.public = 'noise' draws its images: set public_size > 0"),
        (FedKDOptions(public="generator:g.safetensors"), r"draws its images: set public_size > 0"),
        # one image: both methods train on it, which takes two
        (FedKDOptions(public="noise", public_size=1), r"fedkd.public_size = 1; a public set needs at least"),
        (FedMDOptions(public_size=1), r"fedmd.public_size = 1; a public set needs at least 2"),
    ],
)
def test_a_public_size_the_source_cannot_serve_is_refused_with_the_options(options, match):
    with pytest.raises(ConfigError, match=match):
        options.validate()


def test_a_misspelt_public_source_is_answered_with_the_sources_the_method_takes():
    with pytest.raises(ConfigError) as fedmd:
        FedMDOptions(public="hold-out").validate()
    assert str(fedmd.value) == (
        "fedmd.public must be 'holdout' (the federation's held-out split) or 'dataset:<name>' (a labelled "
        "dataset, e.g. dataset:mnist); got 'hold-out'"
    )
    with pytest.raises(ConfigError, match=r"fedkd.public must be .*'noise' or 'generator:"):
        FedKDOptions(public="hold-out").validate()


def test_a_drawn_public_set_without_a_size_is_refused_before_the_run_folder(tmp_path, capsys):
    argv = ["run", "--algorithm", "fedkd", "--clients", "2", "--rounds", "1", "--quiet"]
    assert main([*argv, "--set", "fedkd.public=noise", "--out", str(tmp_path), "--name", "a"]) == 2
    assert "fedkd.public = 'noise' draws its images" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def _server_context(config: RunConfig, validation: bool = True) -> ServerContext:
    data = prepare_data(config)
    held = data.dataset.train.subset(data.split.server_val) if validation else None
    return ServerContext(data.dataset.info, config, None, config.clients, lambda m: {}, validation=held)


def test_public_data_is_never_the_clients_own_and_holdout_needs_one():
    config = _config(TINY)
    with pytest.raises(ConfigError, match="clients' private data"):
        build_public("dataset:digits", _server_context(config), size=0, key="fedmd.public", labelled=True)
    fashion = _server_context(config)
    fashion.config = config.replace(dataset="fashion-mnist")  # its alias loads the same training images
    with pytest.raises(ConfigError, match="clients' private data"):
        build_public("dataset:fmnist", fashion, size=0, key="fedmd.public", labelled=True)
    letters = _server_context(config)
    letters.config = config.replace(dataset="emnist-letters")  # byclass holds every letter of it
    with pytest.raises(ConfigError, match=r"shares images with\) the federation's own dataset"):
        build_public("dataset:emnist_byclass", letters, size=0, key="fedmd.public", labelled=True)
    with pytest.raises(ConfigError, match="val_fraction > 0"):
        build_public("holdout", _server_context(config, False), size=0, key="fedkd.public", labelled=False)
    with pytest.raises(ConfigError, match="public_size > 0"):
        build_public("noise", _server_context(config), size=0, key="fedkd.public", labelled=False)
    public = build_public("holdout", _server_context(config), size=50, key="fedmd.public", labelled=True)
    assert len(public) == 50 and public.labels is not None and public.images.dtype == torch.uint8
    for spec in ("holdout", "noise"):  # one image: both methods train on it, which takes two
        with pytest.raises(ConfigError, match="public_size = 1; a public set needs at least 2 images"):
            build_public(spec, _server_context(config), size=1, key="fedkd.public", labelled=False)
    two = build_public("noise", _server_context(config), size=2, key="fedkd.public", labelled=False)
    assert len(two) == 2


def test_a_missing_public_generator_file_is_named_under_the_methods_own_key(tmp_path):
    """The error named `feddf.source`, an option a FedKD run does not have."""
    missing = tmp_path / "g.safetensors"
    with pytest.raises(ConfigError, match=r"^fedkd\.public: generator file .*g\.safetensors does not exist"):
        build_public(
            f"generator:{missing}",
            _server_context(_config(TINY)),
            size=10,
            key="fedkd.public",
            labelled=False,
        )


def test_public_labels_must_name_the_federations_classes(monkeypatch):
    """Fashion-MNIST's labels 0..9 fit a digits model's outputs but name clothes: FedMD's transfer learning
    would teach a trouser as a 1, so it is refused; FedKD keeps the images and drops those labels, which
    would only score its own labels against another label space (`public_label_accuracy`)."""
    import fedistill.algorithms.fedmd.public_data as public_data
    from fedistill.data.base import DatasetInfo, ImageSet, LoadedDataset
    from fedistill.data.mnist_like import FASHION_MNIST_CLASSES

    def fake(names: tuple[str, ...]) -> LoadedDataset:
        info = DatasetInfo("other", 1, 8, len(names), (0.5,), (0.5,), class_names=names)
        x = torch.zeros(20, 1, 8, 8, dtype=torch.uint8)
        return LoadedDataset(info, ImageSet(x, torch.arange(20) % 10), ImageSet(x, torch.arange(20) % 10))

    ctx = _server_context(_config(TINY))
    monkeypatch.setattr(public_data, "load_dataset", lambda *a, **k: fake(FASHION_MNIST_CLASSES))
    with pytest.raises(ConfigError, match=r"fashion-mnist's classes .*not the federation's"):
        build_public("dataset:fashion-mnist", ctx, size=0, key="fedmd.public", labelled=True)
    unlabelled = build_public("dataset:fashion-mnist", ctx, size=0, key="fedkd.public", labelled=False)
    assert len(unlabelled) == 20 and unlabelled.labels is None

    monkeypatch.setattr(public_data, "load_dataset", lambda *a, **k: fake(tuple("0123456789")))
    digits = build_public("dataset:mnist", ctx, size=0, key="fedmd.public", labelled=True)
    assert digits.labels is not None and digits.labels.tolist() == (torch.arange(20) % 10).tolist()


def test_drawn_public_images_stay_on_the_cpu_whatever_the_runs_device():
    """`noise` (and `generator:`) public images are drawn once at the server and sent in messages: they are
    made in [0, 1] on the CPU, as data sets stay, not normalised on the run's device and mapped back with
    CPU statistics (a CUDA run failed there). `meta` stands in for an accelerator."""
    from fedistill import devices

    ctx = _server_context(_config(TINY))
    on_cpu = build_public("noise", ctx, size=30, key="fedkd.public", labelled=False)
    devices.use(torch.device("meta"))
    try:
        elsewhere = build_public("noise", ctx, size=30, key="fedkd.public", labelled=False)
    finally:
        devices.use(torch.device("cpu"))
    assert elsewhere.images.device.type == "cpu" and torch.equal(elsewhere.images, on_cpu.images)
    assert on_cpu.images.dtype == torch.float32 and on_cpu.images.min() == 0 and on_cpu.images.max() == 1


def test_fedkd_distils_the_same_stage1_models_as_fediod():
    config = _config(TINY, fediod={"teacher_epochs": 2})
    kd, iod = make_client(config, "fedkd", 1), make_client(config, "fediod", 1)
    kd.handle(Message.build("train"))
    iod.handle(Message.build("train"))
    assert kd.teacher.state_dict().keys() == iod.teacher.state_dict().keys()
    assert all(torch.equal(v, iod.teacher.state_dict()[k]) for k, v in kd.teacher.state_dict().items())


# --- end to end: what crosses, and better than alone -------------------------------------------------
@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> tuple[dict[str, dict], dict[str, list[Sent]]]:
    out = tmp_path_factory.mktemp("fedmd-fedkd") / "suite"
    return run_recording(_config(COMPARE, algorithm="standalone,fedmd,fedkd"), out)


@pytest.mark.parametrize(
    ("algorithm", "kinds"), [("fedmd", {"logits", "metrics"}), ("fedkd", {"votes", "metrics"})]
)
def test_no_parameters_cross_the_boundary(compared, algorithm, kinds):
    runs, seen = compared
    communication = runs[algorithm]["communication"]
    assert set(communication[UP]["per_kind"]) == kinds
    assert "parameters" not in communication[DOWN]["per_kind"]
    assert all("parameters" not in sent.arrays for sent in seen[algorithm])
    up = {sent.type for sent in seen[algorithm] if sent.direction == UP and sent.arrays}
    assert up == ({"query.scores"} if algorithm == "fedmd" else {"query.votes"})


def test_fedmd_beats_standalone_and_its_own_start(compared):
    runs, _ = compared
    fedmd, alone = runs["fedmd"]["final"], runs["standalone"]["final"]
    assert fedmd["test_accuracy"] > alone["test_accuracy"] + 0.2, (fedmd, alone)
    assert fedmd["test_accuracy"] > fedmd["start_test_accuracy"], fedmd
    assert fedmd["local_accuracy"] > alone["local_accuracy"]


def test_fedkd_student_beats_the_local_models_it_distils(compared):
    runs, _ = compared
    fedkd = runs["fedkd"]["final"]
    assert fedkd["test_accuracy"] > fedkd["teacher_mean_accuracy"] + 0.2, fedkd
    assert fedkd["test_accuracy"] > runs["standalone"]["final"]["test_accuracy"]
    assert fedkd["public_label_accuracy"] > 0.8 and fedkd["plurality_agreement"] == 1.0
    assert "pate_sigma" not in fedkd  # no noise, no privacy claim


# --- invalid replies and resume ----------------------------------------------------------------------
def test_invalid_scores_and_votes_drop_the_client_and_the_run_goes_on(tmp_path, monkeypatch):
    scores, votes = FedMDClient.scores, FedKDClient.votes

    def bad_scores(self, message):
        reply = scores(self, message)
        if self.ctx.client_id != 1:
            return reply
        return Message.build(
            "query.scores", arrays={"logits": {"scores": reply.tensor("logits", "scores")[:5]}}
        )

    def bad_votes(self, message):
        reply = votes(self, message)
        if self.ctx.client_id != 0:
            return reply
        return Message.build("query.votes", arrays={"votes": {"votes": 2 * reply.tensor("votes", "votes")}})

    monkeypatch.setattr(FedMDClient, "scores", bad_scores)
    monkeypatch.setattr(FedKDClient, "votes", bad_votes)
    runs = {s["algorithm"]: s for s in run_suite(_config(TINY, algorithm="fedmd,fedkd", rounds=1), tmp_path)}
    assert set(runs["fedmd"]["dropped_clients"]) == {"1"} and set(runs["fedkd"]["dropped_clients"]) == {"0"}
    for name in ("fedmd", "fedkd"):
        (failure,) = runs[name]["communication"]["failures"]
        assert failure["status"] == "invalid"
    assert runs["fedkd"]["final"]["voters"] == 2.0


def test_fedmd_resumes_exactly(tmp_path):
    run = check_resume_after_crash(_config(TINY, algorithm="fedmd"), FedMDServer, tmp_path, crash_round=2)
    final = (run / "summary.md").read_text()
    assert "test_accuracy_small-cnn" in final and "start_test_accuracy" in final


def test_fedkd_resumes_exactly_and_reports_its_pate_epsilon(tmp_path):
    config = _config(TINY, algorithm="fedkd", **{"fedkd.pate_noise_seed": "run"})  # exact: the run's noise
    run = check_resume_after_crash(config, FedKDServer, tmp_path, crash_round=2)
    final = run_final(run)
    sigma, queries = final["pate_sigma"], int(final["pate_queries"])
    assert queries == 150 and sigma > 0
    independent = pate.rdp_to_epsilon(queries * pate.rdp_gnmax_data_independent(sigma), 1e-5)[0]
    assert final["pate_epsilon_data_independent"] == pytest.approx(independent) and independent <= 8.0
    assert final["pate_epsilon_data_dependent"] <= independent + 1e-9


def run_final(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())["final"]


def test_gnmax_noise_comes_from_a_secret_unless_the_run_seed_is_asked_for():
    """Noise regenerated from the run's seed (0 by default, and named in the run's records) turns each
    released label into a function of the votes: the default draws it from a seed only the aggregator
    holds."""
    from types import SimpleNamespace

    from fedistill.seeding import numpy_generator

    def noise(mode: str) -> np.ndarray:
        server = SimpleNamespace(
            options=FedKDOptions(pate_noise_seed=mode), ctx=SimpleNamespace(config=RunConfig())
        )
        return FedKDServer._gnmax_noise(server).standard_normal(8)

    public = numpy_generator(0, "fedkd-gnmax").standard_normal(8)
    assert np.array_equal(noise("run"), public)
    first, second = noise("secret"), noise("secret")
    assert not np.array_equal(first, public) and not np.array_equal(first, second)
    with pytest.raises(ConfigError, match="pate_noise_seed must be secret or run"):
        FedKDOptions(pate_noise_seed="seed").validate()


def test_fedmd_digest_draws_its_dropout_masks_from_the_run_seed():
    """A model with dropout digests the consensus to the same weights whatever torch's global RNG held
    before (a resumed run, or another method run first in the process)."""
    client = make_client(_config(TINY, algorithm="fedmd"), "fedmd")
    start = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.Dropout(0.5), torch.nn.Linear(32, 10)
    )
    x = torch.rand(20, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    target = torch.randn(20, 10, generator=torch.Generator().manual_seed(1))
    weights = []
    for global_seed in (1, 2):
        client.model = copy.deepcopy(start)
        torch.manual_seed(global_seed)
        client._digest(x, target, round=1)
        weights.append(torch.cat([p.detach().flatten() for p in client.model.parameters()]))
    torch.testing.assert_close(weights[0], weights[1])
