"""FedDF's tables and the PATE comparison (fedistill.reproduce.feddf_tables and pate_comparison, driven by
benchmarks/feddf_tables.py and benchmarks/pate_fedkd_fediod.py): every row is a valid run, and the PATE
comparison gives both methods the same noise for the same queries and epsilon."""

from pathlib import Path

import numpy as np
import pytest
import torch

from fedistill.config import RunConfig, build_config, parse_assignment
from fedistill.engine.setup import validate_setup
from fedistill.reproduce import feddf_tables, pate_comparison
from fedistill.reproduce.pate_teachers import Queries


@pytest.mark.parametrize("table", sorted(feddf_tables.TABLES))
def test_every_row_names_options_the_run_accepts(table):
    """The checks a run makes before it writes anything, on each row's options: a typo fails here."""
    for _, _label, algorithm, model, sets in feddf_tables.TABLES[table]:
        layer = {"algorithm": algorithm, "model": model, "clients": 20, "feddf.fuse_precision": "model"}
        if algorithm != "feddf":
            layer.pop("feddf.fuse_precision")
        validate_setup(build_config(RunConfig(), layer, dict(parse_assignment(s) for s in sets)))
    labels = [spec[1] for t in feddf_tables.TABLES.values() for spec in t]
    assert len(labels) == len(set(labels)) and set(feddf_tables.PAPER) == set(labels)


def test_pate_rows_give_both_methods_the_same_sigma_and_score_the_released_labels():
    """Sigma is calibrated on the data-independent bound: two vote matrices with the same number of
    queries get the same sigma, and votes that agree cost less on the data-dependent bound."""
    unanimous = np.zeros((50, 10))
    unanimous[np.arange(50), np.arange(50) % 10] = 100  # 100 teachers
    split = np.zeros((50, 10))
    split[:, 0], split[:, 1] = 50, 50
    seen = []

    def accuracy(x, labels, soft=False):
        seen.append(labels)
        return 0.5

    rows = [
        pate_comparison.gnmax_row(
            name, Queries(torch.zeros(50, 1), votes, torch.zeros(50, 10)), 10.0, 1e-5,
            np.random.default_rng(0), accuracy,
        )
        for name, votes in (("a", unanimous), ("b", split))
    ]  # fmt: skip
    assert rows[0]["sigma"] == rows[1]["sigma"] > 0
    assert rows[0]["epsilon_data_dependent"] < rows[1]["epsilon_data_dependent"]  # agreement is cheaper
    assert len(seen) == 2 and all(len(labels) == 50 for labels in seen)


def test_pate_public_inputs_are_never_the_clients_training_images():
    """FedKD's public set must be data no client trains on: the federation's own dataset (by any spelling)
    is refused, whose training images are the clients' shards; its held-out split is public."""
    from fedistill.engine.setup import prepare_data

    config = build_config(RunConfig(), {"clients": 3, "seed": 0, "val_fraction": 0.2}, {})
    data = prepare_data(config)
    for spec in ("dataset:digits", "dataset:DIGITS"):
        with pytest.raises(SystemExit, match="clients' private data"):
            pate_comparison.public_inputs(spec, data, config, 20, 0)
    x, line = pate_comparison.public_inputs("holdout", data, config, 20, 0)
    assert x.shape[0] == 20 and "held-out split" in line


def test_the_paper_scale_configs_parse_and_state_the_papers_number():
    import tomllib

    from fedistill.algorithms.registry import get_algorithm
    from fedistill.config import load_toml, options_for
    from fedistill.models import model_names

    root = Path(__file__).resolve().parents[1] / "configs"
    expected = tomllib.loads((root / "expected.toml").read_text(encoding="utf-8"))
    paths = [p for folder in ("feddf", "fediod-table1") for p in sorted((root / folder).glob("*.toml"))]
    assert len(paths) == 24 + 8
    for path in paths:
        config = build_config(RunConfig(), load_toml(path))
        (name,) = config.algorithms
        options_for(config, name, get_algorithm(name).options)
        assert config.model in model_names() and config.dataset in ("cifar10", "cifar100")
        entry = expected[f"{path.parent.name}/{path.name}"]
        text = path.read_text(encoding="utf-8")
        if "paper_test_accuracy" in entry:
            assert f"test_accuracy {entry['paper_test_accuracy']}" in text
        else:  # a figure without a table (FedDF's Figure 4): its claim, stated in the header
            assert entry["paper_claim"] and "paper: a figure, no table" in text


def test_the_text_configs_are_figure_3s_protocol():
    """configs/feddf-text/: FedDF's Figure 3 (DistilBERT on AG News and SST-2) as runs that parse, with the
    paper's setting (10 clients, alpha 1, lr 1e-5, half the training set held out for distillation) and
    the figure's claim in expected.toml and in each header."""
    import tomllib

    from fedistill.algorithms.registry import get_algorithm
    from fedistill.config import load_toml, options_for

    root = Path(__file__).resolve().parents[1] / "configs"
    expected = tomllib.loads((root / "expected.toml").read_text(encoding="utf-8"))
    paths = sorted((root / "feddf-text").glob("*.toml"))
    assert [p.stem for p in paths] == [
        f"figure3-{d}-{a}" for d in ("ag-news", "sst2") for a in ("fedavg", "feddf")
    ]
    for path in paths:
        config = build_config(RunConfig(), load_toml(path))
        (name,) = config.algorithms
        options = options_for(config, name, get_algorithm(name).options)
        setting = (config.model, config.clients, config.alpha, config.rounds, config.lr, config.val_fraction)
        assert setting == ("distilbert", 10, 1.0, 10, 1e-5, 0.5)
        assert config.local_epochs == (10 if config.dataset == "ag-news" else 1)
        assert config.options[config.dataset]["model_dir"]
        if name == "feddf":
            assert options.source == "holdout"
        entry = expected[f"feddf-text/{path.name}"]
        assert entry["paper_claim"] in path.read_text(encoding="utf-8")


def test_the_one_shot_configs_are_the_benchmarks_runs():
    """configs/one-shot/*.toml hold what the one-shot table gives each run (benchmarks/one_shot_table.py's
    defaults)."""
    import tomllib
    from types import SimpleNamespace

    from fedistill.config import load_toml, parse_value
    from fedistill.reproduce import one_shot_table

    root = Path(__file__).resolve().parents[1] / "configs"
    expected = tomllib.loads((root / "expected.toml").read_text(encoding="utf-8"))
    args = SimpleNamespace(teacher_epochs=10, iters=60, feddf_steps=500)
    # every method's row, and DENSE's and Co-Boosting's `--kd-steps 200` rows
    rows = [(method, method, 0) for method in one_shot_table.METHODS]
    rows += [(f"{method}-kd200", method, 200) for method in ("dense", "coboosting")]
    for dataset in ("mnist", "fashion-mnist"):
        for alpha in ("0.1", "0.5", "1"):
            for stem, method, kd_steps in rows:
                path = root / "one-shot" / f"{stem}-{dataset}-alpha{alpha}.toml"
                config = build_config(RunConfig(), load_toml(path))
                assert (list(config.algorithms), config.dataset, config.alpha) == (
                    [one_shot_table.algorithm_of(method)],
                    dataset,
                    float(alpha),
                )
                for assignment in one_shot_table.method_sets(method, args, dataset, kd_steps):
                    key, _, value = assignment.partition("=")
                    section, _, sub = key.partition(".")
                    assert config.options[section][sub] == parse_value(value)
    assert expected["one-shot/dense-mnist-alpha0.1.toml"]["paper_fraction_of_ensemble"] == 0.77


def test_the_vgg_configs_train_locally_at_the_papers_vgg_lr():
    """FedDF's section 4.1 and appendix C.2 set the local SGD learning rate to 0.05 for VGG (0.1 for the
    ResNets): the Table 3 configs train at it, and their comment says so."""
    from fedistill.config import load_toml

    paths = sorted((Path(__file__).resolve().parents[1] / "configs" / "feddf").glob("table3-vgg9-*.toml"))
    assert len(paths) == 3
    for path in paths:
        config = build_config(RunConfig(), load_toml(path))
        assert (config.model, config.optimizer, config.lr) == ("vgg9", "sgd", 0.05)
        assert "not given in the paper" not in path.read_text(encoding="utf-8")
