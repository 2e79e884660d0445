"""FedGen and FedCG on digits: the ledger shows exactly what each uploads (FedGen: its model and label
counts; FedCG: classifier and generator, never an extractor), their generators learn on tiny cases,
a crashed run resumes to the same result, and both beat training alone on the clients' test shards."""

from pathlib import Path

import pytest
import torch

from algorithm_helpers import SMALL_NON_IID, Sent, check_resume_after_crash, make_client, run_recording
from fedistill import devices
from fedistill.algorithms.fedmdcg import fedgen_client
from fedistill.algorithms.fedmdcg.fedcg_gan import FeatureDiscriminator, train_gan
from fedistill.algorithms.fedmdcg.fedcg_server import FedCGServer
from fedistill.algorithms.fedmdcg.fedgen_options import FedGenOptions
from fedistill.algorithms.fedmdcg.fedgen_server import FedGenServer, ensemble_teacher, train_generator
from fedistill.algorithms.fedmdcg.label_statistics import label_weights
from fedistill.algorithms.fedmdcg.personalized import GENERATOR_PREFIX, part_of, prefixed
from fedistill.algorithms.registry import get_algorithm
from fedistill.algorithms.shared.training import new_model
from fedistill.config import RunConfig, build_config, options_for
from fedistill.engine.launch import run_suite
from fedistill.engine.setup import prepare_data
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.ledger import UP, read_ledger
from fedistill.federation.messages import Message
from fedistill.models.base import CLASSIFIER_PREFIX, EXTRACTOR_PREFIX
from fedistill.models.feature_generator import FeatureGenerator

SMALL = {**SMALL_NON_IID, "rounds": 10, "model": "mlp", "lr": 0.05}


def _config(**changes) -> RunConfig:
    return build_config(RunConfig(), SMALL, changes)


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> tuple[Path, dict[str, dict], dict[str, list[Sent]]]:
    out = tmp_path_factory.mktemp("fedgen_fedcg") / "suite"
    runs, seen = run_recording(_config(algorithm="fedgen,fedcg,standalone"), out)
    return out, runs, seen


def _names(prefix: str) -> set[str]:
    config = _config()
    return set(part_of(new_model(config, prepare_data(config).dataset.info).state_dict(), prefix))


def _generator_names(algorithm: str) -> set[str]:
    generator = make_client(_config(algorithm=algorithm), algorithm).generator
    return {GENERATOR_PREFIX + name for name in generator.state_dict()}


def test_fedgen_uploads_its_model_and_label_counts(suite):
    out, runs, seen = suite
    model, generator = _names(""), _generator_names("fedgen")
    messages = seen["fedgen"]
    assert len(messages) == 2 * 5 * 10
    for sent in messages:
        if sent.direction == UP:  # the trained model and the class counts, nothing else
            assert sent.arrays == {"parameters": model, "label-statistics": {"class_counts"}}, sent.round
        elif sent.round == 1:  # no trained generator yet: the initial model only
            assert sent.arrays == {"parameters": model}
        else:  # the averaged model, the generator and the global label counts to draw ŷ from
            assert sent.arrays == {"parameters": model | generator, "label-statistics": {"global_counts"}}
    records = read_ledger(out / "fedgen" / "ledger.jsonl")
    assert {r["kinds"]["label-statistics"] for r in records if r["direction"] == UP} == {10 * 8}
    assert "test_accuracy" in runs["fedgen"]["final"]  # whole models are averaged: a global model exists


def test_fedcg_never_uploads_an_extractor(suite):
    out, runs, seen = suite
    shared = _names(CLASSIFIER_PREFIX) | _generator_names("fedcg")
    assert _names(EXTRACTOR_PREFIX) and not shared & _names(EXTRACTOR_PREFIX)
    messages = seen["fedcg"]
    assert len(messages) == 2 * 5 * 10
    for sent in messages:  # both directions: classifier + generator; no label counts when averaging
        assert sent.arrays == {"parameters": shared}
    records = read_ledger(out / "fedcg" / "ledger.jsonl")
    assert all("label-statistics" not in r["kinds"] for r in records)
    assert "test_accuracy" not in runs["fedcg"]["final"]  # no global model: the extractors stay private


def test_local_accuracy_on_non_iid_digits(suite):
    """Each client's model on its own IID test shard, sample-weighted. FedGen (whole models averaged, plus
    the generator's regulariser) is far above Standalone (0.94 vs 0.42 here). FedCG (private extractors)
    is above it by a few points only (0.44, LG-FedAvg's level: 0.45), as on seeds 1 and 2."""
    _, runs, _ = suite
    local = {name: run["final"]["local_accuracy"] for name, run in runs.items()}
    assert local["fedgen"] > local["standalone"] + 0.3, local
    assert local["fedcg"] > local["standalone"] + 0.01, local
    assert local["fedcg"] > 0.2, local  # 10 classes: chance is 0.1
    assert runs["fedgen"]["final"]["test_accuracy"] > 0.85, runs["fedgen"]["final"]


def test_fedgen_sharing_only_classifiers_keeps_extractors_home(tmp_path):
    """The FedMD-CG paper's variant: only classifier.* (and label counts) leave a client."""
    config = _config(algorithm="fedgen", rounds=2, **{"fedgen.share": "classifier"})
    runs, seen = run_recording(config, tmp_path / "suite")
    head = _names(CLASSIFIER_PREFIX)
    uploads = [sent.arrays for sent in seen["fedgen"] if sent.direction == UP]
    assert len(uploads) == 10
    assert all(names == {"parameters": head, "label-statistics": {"class_counts"}} for names in uploads)
    assert "test_accuracy" not in runs["fedgen"]["final"]


def test_fedcg_distillation_asks_for_label_counts(tmp_path):
    config = _config(
        algorithm="fedcg", rounds=2, **{"fedcg.aggregation": "distill", "fedcg.distill_steps": 2}
    )
    runs, seen = run_recording(config, tmp_path / "suite")
    uploads = [sent.arrays for sent in seen["fedcg"] if sent.direction == UP]
    assert all(names["label-statistics"] == {"class_counts"} for names in uploads)
    assert all(not set(names["parameters"]) & _names(EXTRACTOR_PREFIX) for names in uploads)
    assert runs["fedcg"]["final"]["local_accuracy"] > 0


def test_fedgen_generator_learns_the_heads():
    """On three fixed heads with non-IID label counts, FedGen's server steps lower the label-weighted
    teacher loss of G's features (the term the clients' regulariser relies on)."""
    torch.manual_seed(0)
    classes, features = 4, 8
    head = torch.nn.Linear(features, classes).eval()
    heads = [{k: torch.randn_like(v) for k, v in head.state_dict().items()} for _ in range(3)]
    counts = torch.tensor([[30.0, 5, 0, 1], [0, 20, 10, 2], [3, 0, 25, 40]])
    generator = FeatureGenerator(classes, features, noise_dim=8, hidden_dims=(32,), noise="uniform")
    optimizer = torch.optim.Adam(generator.parameters(), lr=3e-3)
    labels = torch.arange(classes).repeat(16)
    noise = generator.sample_noise(len(labels), torch.Generator().manual_seed(1))

    def teacher_loss() -> float:
        generator.eval()
        with torch.no_grad():
            return ensemble_teacher(head, heads, label_weights(counts), generator(labels, noise), labels)[
                0
            ].item()

    before = teacher_loss()
    options = FedGenOptions(generator_steps=100, generator_lr=3e-3)
    metrics = train_generator(
        generator, optimizer, head, heads, counts, options, torch.Generator().manual_seed(2)
    )
    assert teacher_loss() < 0.1 * before
    assert 0 < metrics["generator_diversity_loss"] <= 1


def test_fedcg_gan_moves_generated_features_to_real_ones():
    """The feature cGAN on a fixed extractor: G's outputs, far from the real features at first, move
    towards them (the distance of the means shrinks) as G and D take turns."""
    torch.manual_seed(0)
    classes, features = 4, 8
    rng = torch.Generator().manual_seed(3)
    centers = 2.0 + torch.randn(classes, features, generator=rng)
    cache = []
    for _ in range(10):
        y = torch.randint(classes, (32,), generator=rng)
        cache.append((centers[y] + 0.3 * torch.randn(32, features, generator=rng), y))
    real = torch.cat([x for x, _ in cache])
    labels = torch.cat([y for _, y in cache])
    generator = FeatureGenerator(classes, features, noise_dim=8, hidden_dims=(32,), noise="uniform")
    discriminator = FeatureDiscriminator(features, 16)
    g_opt = torch.optim.Adam(generator.parameters(), lr=1e-3, weight_decay=1e-4)
    d_opt = torch.optim.Adam(discriminator.parameters(), lr=1e-3, weight_decay=1e-4)

    def gap() -> float:
        generator.eval()
        with torch.no_grad():
            fake = generator(labels, generator=torch.Generator().manual_seed(5))
        return float((fake.mean(0) - real.mean(0)).norm())

    before = gap()
    metrics = train_gan(torch.nn.Identity(), generator, discriminator, g_opt, d_opt, cache, rng, passes=30)
    assert gap() < 0.75 * before
    assert metrics["discriminator_loss"] > 0 and metrics["generator_loss"] > 0


@pytest.mark.parametrize(
    ("algorithm", "server", "options"),
    [
        ("fedgen", FedGenServer, {"fedgen.share": "classifier"}),
        ("fedcg", FedCGServer, {"fedcg.gamma_schedule": "constant"}),
    ],
)
def test_a_crashed_run_resumes_to_the_same_result(tmp_path, algorithm, server, options):
    """Crash in round 3, resume from the round-2 checkpoint: private extractors, FedCG's discriminators and
    Adam states, FedGen's generator optimiser and label counts all come back, so the metrics match."""
    check_resume_after_crash(_config(algorithm=algorithm, rounds=4, **options), server, tmp_path)


def test_a_fedcg_client_refuses_to_receive_an_extractor():
    client = make_client(_config(algorithm="fedcg", rounds=1), "fedcg")
    whole = dict(client.model.state_dict()) | {
        GENERATOR_PREFIX + k: v for k, v in client.generator.state_dict().items()
    }
    message = Message.build("train", arrays={"parameters": whole}, scalars={"config": {"round": 1}})
    with pytest.raises(FederationError, match="unexpected parameters arrays"):
        client.handle(message)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("fedgen.share", "extractor"),
        ("fedgen.decay", 1.5),
        ("fedcg.aggregation", "kd"),
        ("fedcg.gan_passes", 0),
    ],
)
def test_bad_options_name_the_key(key, value):
    section, _, name = key.partition(".")
    config = _config(algorithm=section, **{key: value})
    with pytest.raises(ConfigError, match=name):
        options_for(config, section, get_algorithm(section).options)


@pytest.mark.parametrize("key", ["fedgen.generator_batch_size", "fedcg.distill_batch_size"])
def test_a_server_generator_batch_of_one_is_refused_before_the_run(key):
    """The server trains its generator in train mode, and BatchNorm cannot normalise one sample."""
    section = key.partition(".")[0]
    options = get_algorithm(section).options
    with pytest.raises(ConfigError, match=rf"{key} must be >= 2 .*BatchNorm.*got 1"):
        options_for(_config(algorithm=section, **{key: 1}), section, options)
    options_for(_config(algorithm=section, **{key: 2}), section, options)


def test_over_a_flower_grid_both_give_the_in_process_results(tmp_path):
    """Client state kept on the node between rounds (FedCG's private extractor, discriminator and Adam
    states) and the generator in the messages give the in-process results and traffic on Flower."""
    pytest.importorskip("flwr")
    from fedistill.engine.flower.apps import make_client_app
    from flower_local_grid import LocalGrid, run_on_grid

    config = _config(algorithm="fedgen,fedcg", rounds=2, clients=3, model="lenet-fedmdcg")
    here = run_suite(config, tmp_path / "inprocess", progress=False)
    grid = LocalGrid(make_client_app(config, state_root=tmp_path / "nodes"), config.clients)
    there = run_on_grid(config, tmp_path / "flower", grid)
    for a, b in zip(here, there, strict=True):
        for key, value in a["final"].items():
            assert b["final"][key] == pytest.approx(value, abs=1e-6), (a["algorithm"], key)
        assert _traffic(tmp_path / "flower", a) == _traffic(tmp_path / "inprocess", a), a["algorithm"]


def _traffic(suite_dir: Path, summary: dict) -> dict:
    """Bytes per (direction, client, kind, type) from the ledger, without the transport's hello."""
    totals: dict = {}
    for record in read_ledger(suite_dir / summary["algorithm"] / "ledger.jsonl"):
        if record["type"] != "query.hello":
            for kind, size in record["kinds"].items():
                key = (record["direction"], record["client"], kind, record["type"])
                totals[key] = totals.get(key, 0) + size
    return totals


def test_fedgen_teacher_loss_and_fedcg_gan_losses_by_hand():
    """FedGen's server term Σ_k mean_b w_{k,y_b}·CE(head_k(h_b), y_b) with w_{k,c} = n_{k,c} / Σ_j n_{j,c},
    its client weights max(1e-4, 10·0.98^t), and FedCG's GAN losses and γ ramps, on a tiny case."""
    import math

    from torch import nn

    from fedistill.algorithms.fedmdcg.fedcg_gan import discriminator_loss, generator_loss
    from fedistill.algorithms.fedmdcg.fedcg_options import FedCGOptions
    from fedistill.algorithms.fedmdcg.fedcg_server import gamma_at
    from fedistill.algorithms.fedmdcg.fedgen_server import regularizer_weight

    heads = [
        {"weight": torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), "bias": torch.zeros(3)},
        {"weight": torch.tensor([[0.0, 2.0], [1.0, 0.0], [0.0, 0.0]]), "bias": torch.tensor([0.0, 0.0, 1.0])},
    ]
    # w = (0.75, 0.5, 0) for client 0 and (0.25, 0.5, 1) for client 1
    weights = label_weights(torch.tensor([[3.0, 1.0, 0.0], [1.0, 1.0, 2.0]]))
    h, y = torch.tensor([[1.0, 2.0], [0.5, -1.0]]), torch.tensor([0, 2])
    loss, _ = ensemble_teacher(nn.Linear(2, 3), heads, weights, h, y)

    def ce(z: list[float], t: int) -> float:
        return -z[t] + math.log(sum(math.exp(v) for v in z))

    # head 0: logits (1, 2, 3) and (0.5, -1, -0.5); head 1: (4, 1, 1) and (-2, 0.5, 1)
    hand = (0.75 * ce([1, 2, 3], 0) + 0.0 * ce([0.5, -1, -0.5], 2)) / 2
    hand += (0.25 * ce([4, 1, 1], 0) + 1.0 * ce([-2, 0.5, 1], 2)) / 2
    assert float(loss) == pytest.approx(hand, rel=1e-6)
    assert [regularizer_weight(10.0, t, 0.98, 1e-4) for t in (0, 1, 2)] == pytest.approx([10.0, 9.8, 9.604])
    assert regularizer_weight(10.0, 10_000, 0.98, 1e-4) == 1e-4

    real, fake = torch.tensor([0.5, -1.0]), torch.tensor([2.0, 0.0])
    sigmoid = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    d_hand = -(math.log(sigmoid(0.5)) + math.log(sigmoid(-1.0))) / 2
    d_hand -= (math.log(1 - sigmoid(2.0)) + math.log(1 - sigmoid(0.0))) / 2
    assert float(discriminator_loss(real, fake)) == pytest.approx(d_hand, rel=1e-6)
    assert float(generator_loss(fake)) == pytest.approx(-(math.log(sigmoid(2.0)) + math.log(0.5)) / 2)
    assert [gamma_at(FedCGOptions(), t, 5) for t in range(5)] == pytest.approx([0, 1 / 64, 1 / 8, 27 / 64, 1])
    sigmoid_ramp = FedCGOptions(gamma_schedule="sigmoid", gamma=2.0)
    assert gamma_at(sigmoid_ramp, 5, 100) == pytest.approx(2.0 * (2 / (1 + math.exp(-1.0)) - 1))


def test_fedgen_uniform_label_sampling_draws_the_labels_on_the_run_device(monkeypatch):
    """Under `label_sampling = "uniform"` the labels ŷ a client draws live on the run's device, as under
    "counts" (whose distribution comes in on it): the head's logits on a GPU meet them in the CE.
    `meta` stands in for the card."""
    client = make_client(_config(algorithm="fedgen", **{"fedgen.label_sampling": "uniform"}), "fedgen")
    parameters = part_of(client.model.state_dict(), "") | prefixed(
        client.generator.state_dict(), GENERATOR_PREFIX
    )
    config = {"round": 2, "regularize": True, "generative_alpha": 1.0, "generative_beta": 1.0}
    message = Message.build("train", arrays={"parameters": parameters}, scalars={"config": config})
    monkeypatch.setattr(devices, "_current", torch.device("meta"))
    client.model.to("meta")
    client.generator.to("meta")
    seen = {}

    class Stop(Exception):
        pass

    def train(*args, label_probs, **kwargs):
        seen["device"] = label_probs.device
        raise Stop

    monkeypatch.setattr(fedgen_client, "train_regularized", train)
    with pytest.raises(Stop):
        client.train(message)
    assert seen["device"].type == "meta"


def test_fedcg_gamma_refuses_an_unknown_schedule_instead_of_holding_gamma_constant():
    """gamma_at took any schedule but cubic and sigmoid for `constant`, silently."""
    from fedistill.algorithms.fedmdcg.fedcg_options import FedCGOptions
    from fedistill.algorithms.fedmdcg.fedcg_server import gamma_at

    assert gamma_at(FedCGOptions(gamma_schedule="constant", gamma=0.5), 0, 5) == 0.5
    with pytest.raises(ConfigError, match=r"'cubc'.*valid: cubic, sigmoid, constant"):
        gamma_at(FedCGOptions(gamma_schedule="cubc"), 1, 5)


def test_fedgen_server_labels_refuse_an_unknown_sampling_instead_of_drawing_uniformly():
    """server_labels took any sampling but `counts` for `uniform`, silently."""
    from fedistill.algorithms.fedmdcg.fedgen_server import server_labels

    counts = torch.tensor([[0.0, 5.0, 3.0], [2.0, 0.0, 1.0]])
    drawn = server_labels(counts, 64, "uniform", torch.Generator().manual_seed(0))
    assert set(drawn.tolist()) == {0, 1, 2}
    with pytest.raises(ConfigError, match=r"'uniformly'.*valid: counts, uniform"):
        server_labels(counts, 4, "uniformly", torch.Generator().manual_seed(0))


def test_fedcg_server_distillation_objective_by_hand():
    """FedCG's `aggregation = "distill"` term: KL(softmax(Σ_k π_k·C_k(G_k(y))/T) ‖ softmax(C(G(y))/T))
    averaged over samples and classes (KL/C per sample, no T²), y drawn ∝ the label counts."""
    import math

    from torch import nn

    from fedistill.algorithms.fedmdcg.fedcg_server import distill_pair

    class Table(nn.Module):
        """G(y) = rows[y]: a generator whose features are written down."""

        def __init__(self, rows: list[list[float]]) -> None:
            super().__init__()
            self.rows = nn.Parameter(torch.tensor(rows))

        def forward(self, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
            return self.rows[labels]

    def linear(weight: list[list[float]], bias: list[float]) -> dict[str, torch.Tensor]:
        return {
            "weight": torch.tensor(weight, dtype=torch.float32),
            "bias": torch.tensor(bias, dtype=torch.float32),
        }

    generator, classifier = Table([[9.0, 9.0], [1.0, 0.0]]), nn.Linear(2, 3)
    classifier.load_state_dict(linear([[1, 0], [0, 1], [0, 0]], [0, 0, 0]))  # C(G(1)) = (1, 0, 0)
    teachers = [
        ({"rows": torch.tensor([[9.0, 9.0], [0.0, 1.0]])}, linear([[1, 0], [0, 1], [1, 1]], [0, 0, 0])),
        ({"rows": torch.tensor([[9.0, 9.0], [2.0, 0.0]])}, linear([[0, 0], [1, 0], [0, 0]], [0, 0, 1])),
    ]  # C_0(G_0(1)) = (0, 1, 1), C_1(G_1(1)) = (0, 2, 1)
    optimizer = torch.optim.SGD([*generator.parameters(), *classifier.parameters()], lr=0.0)
    counts = torch.tensor([[0.0, 3.0, 0.0], [0.0, 1.0, 0.0]])  # only class 1 is ever drawn
    loss = distill_pair(
        generator, classifier, optimizer, Table([[0.0, 0.0]] * 2), nn.Linear(2, 3), teachers,
        [0.25, 0.75], counts, torch.Generator().manual_seed(0), steps=1, batch_size=4, temperature=2.0,
    )  # fmt: skip

    def softmax(z: list[float]) -> list[float]:
        e = [math.exp(v) for v in z]
        return [v / sum(e) for v in e]

    p = softmax([0.0, 1.75 / 2, 1.0 / 2])  # the ensemble 0.25·(0, 1, 1) + 0.75·(0, 2, 1), at T = 2
    q = softmax([1.0 / 2, 0.0, 0.0])
    assert loss == pytest.approx(sum(a * math.log(a / b) for a, b in zip(p, q, strict=True)) / 3, rel=1e-6)


class _LabelTable(torch.nn.Module):
    """A generator G(y) = rows[y], whatever the noise: the client objectives' hand-computed cases."""

    def __init__(self, rows: list[list[float]]) -> None:
        super().__init__()
        self.rows = torch.tensor(rows)

    def forward(self, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.rows[labels]


def test_fedgen_client_objective_by_hand(monkeypatch):
    """A FedGen client's loss: CE(f(x), y) + (B_g/B)·α·CE(head(G(ŷ)), ŷ) + β·KL(softmax(head(G(y))) ‖
    softmax(f(x))), batch means, read at the first step on a model and a generator written down."""
    import math

    from torch import nn

    from fedistill.algorithms.fedmdcg.fedgen_client import train_regularized
    from fedistill.algorithms.shared.training import LocalTraining
    from fedistill.data.base import DatasetInfo, ImageSet

    class Constant(nn.Module):
        """The extractor: feature (1, 0) for every input."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tensor([[1.0, 0.0]]).expand(len(x), 2)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.extractor, self.classifier = Constant(), nn.Linear(2, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.classifier(self.extractor(x))

    model = Model()
    weight, bias = [[1.0, 0.0], [0.0, 2.0], [-1.0, 1.0]], [0.0, 0.5, 0.0]
    model.classifier.load_state_dict({"weight": torch.tensor(weight), "bias": torch.tensor(bias)})
    info = DatasetInfo("tiny", 1, 4, 3, (0.5,), (0.25,))
    data = ImageSet(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.tensor([0, 2]))
    spec = LocalTraining(epochs=1, steps=1, batch_size=2, optimizer="sgd", lr=0.0, momentum=0.0,
                         weight_decay=0.0, augment=False)  # fmt: skip
    seen = []
    monkeypatch.setattr(fedgen_client, "check_finite", lambda loss, *_: seen.append(loss.item()))
    table = _LabelTable([[0.0, 1.0], [2.0, 0.0], [1.0, 1.0]])  # G(y) = rows[y]
    train_regularized(
        model, table, data, info, spec, torch.Generator().manual_seed(0), torch.Generator(),
        alpha=0.5, beta=3.0, label_probs=torch.tensor([0.0, 1.0, 0.0]), generator_batch_size=4,
    )  # fmt: skip

    def head(h: list[float]) -> list[float]:
        return [
            sum(w * v for w, v in zip(row, h, strict=True)) + b for row, b in zip(weight, bias, strict=True)
        ]

    def log_softmax(z: list[float]) -> list[float]:
        norm = math.log(sum(math.exp(v) for v in z))
        return [v - norm for v in z]

    local = log_softmax(head([1.0, 0.0]))  # the same for both samples
    ce = -(local[0] + local[2]) / 2
    teacher = -log_softmax(head([2.0, 0.0]))[1]  # every ŷ is class 1
    targets = [[math.exp(v) for v in log_softmax(head(h))] for h in ([0.0, 1.0], [1.0, 1.0])]  # G(0), G(2)
    latent = sum(sum(p * (math.log(p) - q) for p, q in zip(t, local, strict=True)) for t in targets) / 2
    assert seen[0] == pytest.approx(ce + (4 / 2) * 0.5 * teacher + 3.0 * latent, rel=1e-6)


def test_fedcg_client_objective_by_hand(monkeypatch):
    """A FedCG client's loss: CE(C(F(x)), y) + γ·MSE(F(x), Ĝ(y, ε)), the MSE averaged over the batch and
    the feature dimensions with Ĝ held fixed, read at the first step on a model and a generator written
    down; the batches it trained on are the GAN stage's cache."""
    import math

    from torch import nn

    from fedistill.algorithms.fedmdcg import fedcg_client
    from fedistill.algorithms.shared.training import LocalTraining
    from fedistill.data.base import DatasetInfo, ImageSet

    class Extractor(nn.Module):
        """F(x) = (1, 2) for every input, with a parameter so the optimiser has something to hold."""

        def __init__(self) -> None:
            super().__init__()
            self.h = nn.Parameter(torch.tensor([1.0, 2.0]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.h.expand(len(x), 2)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.extractor, self.classifier = Extractor(), nn.Linear(2, 3)

    model = Model()
    weight, bias = [[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]], [0.0, 0.5, 0.0]
    model.classifier.load_state_dict({"weight": torch.tensor(weight), "bias": torch.tensor(bias)})
    info = DatasetInfo("tiny", 1, 4, 3, (0.5,), (0.25,))
    data = ImageSet(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.tensor([1, 2]))
    spec = LocalTraining(epochs=1, steps=1, batch_size=2, optimizer="sgd", lr=0.0, momentum=0.0,
                         weight_decay=0.0, augment=False)  # fmt: skip
    seen = []
    monkeypatch.setattr(fedcg_client, "check_finite", lambda loss, *_: seen.append(loss.item()))
    metrics, cache = fedcg_client.train_toward_generator(
        model,
        _LabelTable([[0.0, 2.0], [3.0, 1.0], [1.0, -1.0]]),
        data,
        info,
        spec,
        torch.Generator().manual_seed(0),
        torch.Generator(),
        gamma=0.25,
    )

    logits = [
        sum(w * v for w, v in zip(row, (1.0, 2.0), strict=True)) + b
        for row, b in zip(weight, bias, strict=True)
    ]
    log_norm = math.log(sum(math.exp(v) for v in logits))
    ce = -((logits[1] - log_norm) + (logits[2] - log_norm)) / 2  # labels 1 and 2
    mse = (((1 - 3) ** 2 + (2 - 1) ** 2) + ((1 - 1) ** 2 + (2 + 1) ** 2)) / 4  # F(x) against Ĝ(1), Ĝ(2)
    assert seen[0] == pytest.approx(ce + 0.25 * mse, rel=1e-6)
    assert metrics["train_loss"] == pytest.approx(ce, rel=1e-6)
    assert metrics["feature_mse"] == pytest.approx(mse, rel=1e-6)
    assert len(cache) == 1 and sorted(cache[0][1].tolist()) == [1, 2]


def test_fedgen_adversarial_generator_term_by_hand(monkeypatch):
    """With `adversarial_weight` > 0 FedGen's server also maximises the gap between the global head and
    the label-weighted ensemble of the clients' heads on G(y): KL(softmax(Σ_k w_{k,y}·head_k(h)) ‖
    softmax(head(h))) averaged over samples and classes (the code's KLDivLoss "mean"); the loss is
    teacher + diversity − weight·gap, read at the first step."""
    import math

    from torch import nn

    from fedistill.algorithms.fedmdcg import fedgen_server

    class Table(nn.Module):
        """G(y) = rows[y] with zero noise (so the diversity term is exp(0) = 1)."""

        def __init__(self) -> None:
            super().__init__()
            self.rows = nn.Parameter(torch.tensor([[0.0, 0.0], [1.0, 2.0]]))

        def forward(self, labels, generator=None, return_noise=False):
            out = self.rows[labels]
            return (out, torch.zeros(len(labels), 3)) if return_noise else out

    def linear(weight: list[list[float]], bias: list[float]) -> dict[str, torch.Tensor]:
        return {
            "weight": torch.tensor(weight, dtype=torch.float32),
            "bias": torch.tensor(bias, dtype=torch.float32),
        }

    heads = [linear([[1, 0], [0, 1], [0, 0]], [0, 0, 0]), linear([[0, 0], [1, 0], [0, 1]], [0, 1, 0])]
    student = linear([[0, 1], [0, 0], [1, 0]], [0, 0, 0])
    counts = torch.tensor([[0.0, 3.0, 0.0], [0.0, 1.0, 0.0]])  # only class 1: w = (0.75, 0.25)
    generator = Table()
    options = FedGenOptions(generator_steps=1, generator_batch_size=2, adversarial_weight=0.5)
    seen = []
    monkeypatch.setattr(fedgen_server, "check_finite", lambda loss, *_: seen.append(loss.item()))
    metrics = fedgen_server.train_generator(
        generator, torch.optim.SGD(generator.parameters(), lr=0.0), nn.Linear(2, 3), heads, counts,
        options, torch.Generator().manual_seed(0), student,
    )  # fmt: skip

    def log_softmax(z: list[float]) -> list[float]:
        norm = math.log(sum(math.exp(v) for v in z))
        return [v - norm for v in z]

    # h = (1, 2): head 0 gives (1, 2, 0), head 1 gives (0, 2, 2), the student (2, 0, 1)
    teacher = 0.75 * -log_softmax([1, 2, 0])[1] + 0.25 * -log_softmax([0, 2, 2])[1]
    p = [math.exp(v) for v in log_softmax([0.75, 2.0, 0.5])]  # 0.75·(1, 2, 0) + 0.25·(0, 2, 2)
    gap = sum(a * (math.log(a) - q) for a, q in zip(p, log_softmax([2, 0, 1]), strict=True)) / 3
    assert metrics["generator_adversarial_loss"] == pytest.approx(gap, rel=1e-6)
    assert metrics["generator_teacher_loss"] == pytest.approx(teacher, rel=1e-6)
    assert seen[0] == pytest.approx(teacher + 1.0 - 0.5 * gap, rel=1e-6)
