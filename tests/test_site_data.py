"""Sites that hold only their own records (`site_data_dir`): each site reads its own folder, the server only
its test and validation data; in-process and over Flower alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from algorithm_helpers import SMALL_FEDIOD
from fedistill.cli import main
from fedistill.config import RunConfig, build_config
from fedistill.data.base import DatasetInfo
from fedistill.engine.launch import run_suite
from fedistill.engine.setup import validate_setup
from fedistill.engine.site_data import agreed_info, load_site
from fedistill.errors import ConfigError, DataError, FederationError
from fedistill.federation.ledger import read_ledger

#: Which digit classes each of the three sites holds: skewed, and site 2 has no case of 0-4.
SITE_CLASSES = ((0, 1, 2, 3, 4, 5, 6), (0, 1, 2, 3, 7, 8, 9), (5, 6, 7, 8, 9))


def _write(folder: Path, images: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> None:
    for i in ids:
        (folder / str(labels[i])).mkdir(parents=True, exist_ok=True)
        Image.fromarray(images[i]).save(folder / str(labels[i]) / f"{i:04d}.png")


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> Path:
    """The digits as image folders: `server/` (a validation and a test set of every class) and `site-0/`,
    `site-1/`, `site-2/`, each with its own classes (`SITE_CLASSES`) and its own records."""
    root = tmp_path_factory.mktemp("sites")
    digits = load_digits()
    images, labels = np.clip(digits.images * 16, 0, 255).astype(np.uint8), digits.target
    order = np.random.default_rng(0).permutation(len(labels))
    _write(root / "server" / "test", images, labels, order[:300])
    _write(root / "server" / "train", images, labels, order[300:400])
    rest = order[400:]
    for k, classes in enumerate(SITE_CLASSES):
        mine = [i for i in rest[k::3] if labels[i] in classes][:150]
        _write(root / f"site-{k}" / "train", images, labels, np.asarray(mine[:120]))
        _write(root / f"site-{k}" / "test", images, labels, np.asarray(mine[120:]))
    return root


def _config(root: Path, **keys) -> RunConfig:
    base = {
        "algorithm": "fedavg",
        "dataset": "image-folder",
        "data_dir": str(root / "server"),
        "site_data_dir": str(root / "site-{site}"),
        "clients": 3,
        "rounds": 2,
        "model": "small-cnn",
        "threads": 1,
        "image-folder": {"channels": 1, "image_size": 8},
        "fediod": SMALL_FEDIOD,
    }
    if keys.get("dataset", "image-folder") != "image-folder":
        del base["image-folder"]
    return build_config(RunConfig(), {**base, **keys})


def test_a_site_reads_only_its_own_folder_with_the_servers_labels_and_normalisation(sites) -> None:
    """Site 2 has no case of digits 0-4, yet its '7' is label 7 (the server's class order), and it
    normalises with the server's statistics, so every model sees inputs scaled alike."""
    config = _config(sites)
    server = validate_setup(config)  # the in-process setup, sites loaded
    assert server.own_data and server.client_sizes() == [108, 108, 108]
    site = server.sites[2]
    assert site.dataset.info == server.dataset.info
    held = site.dataset.train.y[site.split.client_train[0]]
    assert sorted(set(held.tolist())) == [5, 6, 7, 8, 9]
    # the site's own files, read again: the same records, nothing of the other sites
    again = load_site(config, 2, server.dataset.info)
    assert again.dataset.train.x.equal(site.dataset.train.x)
    assert len(site.dataset.train) == 120 and len(site.dataset.test) == 30
    # the server's data: its test set, its validation holdout of its own training part, no site's record
    assert len(server.dataset.test) == 300 and len(server.split.server_val) == 10
    counts = server.train_counts()
    assert counts.shape == (3, 10) and counts[2, :5].sum() == 0 and counts[0, 7:].sum() == 0


def test_fedavg_over_own_folders_beats_each_site_alone(sites, tmp_path) -> None:
    config = _config(sites, algorithm="fedavg,standalone", rounds=4, fedavg={"local_epochs": 3})
    fedavg, standalone = run_suite(config, tmp_path / "run", progress=False)
    assert fedavg["partition"]["method"] == "own-data" and fedavg["partition"]["sizes"] == [108, 108, 108]
    # each site alone knows at most 7 of the 10 digits: about 60% of the test set at best
    assert standalone["final"]["test_accuracy"] < 0.7
    assert fedavg["final"]["test_accuracy"] > standalone["final"]["test_accuracy"] + 0.15
    assert (tmp_path / "run" / "fedavg" / "plots" / "partition.png").exists()


def test_centralized_pools_the_sites_own_records_in_process(sites, tmp_path) -> None:
    summary = run_suite(_config(sites, algorithm="centralized", rounds=2), tmp_path / "run", progress=False)[
        0
    ]
    assert summary["partition"]["sizes"] == [108, 108, 108]
    assert summary["final"]["test_accuracy"] > 0.6


@pytest.mark.parametrize(
    ("keys", "error", "named"),
    [
        ({"dataset": "digits"}, ConfigError, "reads no files, so every site would hold the same records"),
        ({"site_data_dir": "shared"}, ConfigError, "has no {site}, so every site would read the same folder"),
        ({"clients": 4}, DataError, "site 3's folder .*site-3 does not exist"),
        ({"partition": "iid"}, ConfigError, "partition = 'iid' does not apply with site_data_dir"),
        ({"alpha": 0.1}, ConfigError, "alpha = 0.1 does not apply with site_data_dir"),
        ({"partition_options": {"min_size": 5}}, ConfigError, r"\[partition_options\] does not apply"),
    ],
)
def test_a_setting_sites_with_their_own_data_rule_out_is_named_before_any_folder(
    sites, tmp_path, keys, error, named
) -> None:
    if keys.get("site_data_dir") == "shared":
        keys = {"site_data_dir": str(sites / "site-0")}
    with pytest.raises(error, match=named):
        run_suite(_config(sites, **keys), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_a_site_whose_classes_the_server_does_not_know_is_refused_naming_them(sites, tmp_path) -> None:
    odd = tmp_path / "odd"
    for part in ("train", "test"):
        for label in ("1", "x"):
            (odd / part / label).mkdir(parents=True)
            Image.fromarray(np.full((8, 8), 40, np.uint8)).save(odd / part / label / "a.png")
    info = validate_setup(_config(sites)).dataset.info
    # the site's classes are the server's unless the config names them: the line says which, and how to
    # name a class the server's data lack
    with pytest.raises(DataError, match=r"class folder\(s\) \['x'\] .* are not among the server's classes"):
        load_site(_config(sites), 0, info, odd)
    with pytest.raises(DataError, match=r"data_dir's train/ folders.*set image-folder.classes"):
        load_site(_config(sites), 0, info, odd)
    named = _config(
        sites, **{"image-folder": {"channels": 1, "image_size": 8, "classes": list("0123456789")}}
    )
    with pytest.raises(DataError, match=r"are not in the option classes \(0, 1"):
        load_site(named, 0, info, odd)
    # the line also says where a server holding a test set alone (val_fraction = 0) reads its classes: its
    # test/ folders (it named only train/ folders, which such a server does not have)
    with pytest.raises(DataError, match=r"train/ folders \(its test/ folders where it has no train/\)"):
        load_site(_config(sites), 0, info, odd)


def test_site_data_unlike_the_servers_is_refused_naming_the_difference() -> None:
    server = DatasetInfo("image-folder", 1, 8, 2, (0.5,), (0.2,), class_names=("a", "b"))
    same_but_scaled = DatasetInfo("image-folder", 1, 8, 2, (0.3,), (0.1,), class_names=("a", "b"))
    assert agreed_info(same_but_scaled, server, "site 0") is server  # the server's statistics win
    bigger = DatasetInfo("image-folder", 1, 16, 2, (0.5,), (0.2,), class_names=("a", "b"))
    with pytest.raises(DataError, match=r"site 0 holds data unlike the server's: image_size 16 against .* 8"):
        agreed_info(bigger, server, "site 0")


def test_the_dry_run_lists_each_sites_own_sample_count(sites, tmp_path, capsys) -> None:
    argv = ["run", "--dry-run", "--quiet", "--algorithm", "fedavg", "--dataset", "image-folder"]
    argv += ["--data-dir", str(sites / "server"), "--clients", "3", "--model", "small-cnn"]
    argv += ["--site-data-dir", str(sites / "site-{site}"), "--set", "image-folder.channels=1"]
    argv += ["--set", "image-folder.image_size=8", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    plan = capsys.readouterr().out
    assert "partition: 3 clients, each site's own data" in plan
    assert "training samples per client: 108 108 108" in plan
    assert "(the server's: train 100, test 300)" in plan


def _grid(config: RunConfig, tmp_path: Path, folders: dict[int, Path] | None = None):
    """A single-process Flower grid of the run's sites; `folders`: a node config data-dir per partition."""
    pytest.importorskip("flwr")
    from fedistill.engine.flower.apps import make_client_app
    from flower_local_grid import LocalGrid

    grid = LocalGrid(make_client_app(config, state_root=tmp_path / "nodes"), config.clients)
    for context in grid.contexts.values():
        pid = context.node_config["partition-id"]
        if folders is not None:
            context.node_config["data-dir"] = str(folders[pid])
    return grid


def test_each_flower_node_reads_its_own_folder_and_gives_the_in_process_results(sites, tmp_path) -> None:
    """Nodes given their folders in their node configs (a deployment; the run's site_data_dir names no
    folder that exists) train FedAvg and FedIOD to the in-process metrics with the same bytes; the HELLO
    carried the server's dataset facts and test set out and each site's count and fingerprint back."""
    from flower_local_grid import run_on_grid, traffic

    config = _config(sites, algorithm="fedavg,fediod")
    here = run_suite(config, tmp_path / "inprocess", progress=False)
    deployed = config.replace(site_data_dir=str(tmp_path / "not-on-the-server"))
    folders = {k: sites / f"site-{k}" for k in range(3)}
    there = run_on_grid(deployed, tmp_path / "flower", _grid(deployed, tmp_path, folders))
    for a, b in zip(here, there, strict=True):
        assert b["transport"] == "flower" and b["partition"]["sizes"] == [108, 108, 108]
        assert b["final"]["test_accuracy"] == pytest.approx(a["final"]["test_accuracy"], abs=1e-6)
        name = a["algorithm"]
        assert traffic(tmp_path / "flower" / name) == traffic(tmp_path / "inprocess" / name)
    hello = [
        r for r in read_ledger(tmp_path / "flower" / "fediod" / "ledger.jsonl") if r["type"] == "query.hello"
    ]
    out = [r for r in hello if r["direction"] == "server->client"]
    back = [r for r in hello if r["direction"] == "client->server"]
    assert len(out) == len(back) == 3
    # the server's facts and its test set (300 images of 8 x 8 uint8, their int64 labels), once per site
    assert all(set(r["kinds"]) == {"config", "evaluation-set"} for r in out)
    assert all(r["kinds"]["evaluation-set"] == 300 * 64 + 300 * 8 for r in out)
    assert all(set(r["kinds"]) <= {"metrics", "config"} and sum(r["kinds"].values()) < 200 for r in back)


def test_two_flower_nodes_reading_one_folder_stop_the_run(sites, tmp_path) -> None:
    from flower_local_grid import run_on_grid

    config = _config(sites, rounds=1)
    folders = {0: sites / "site-0", 1: sites / "site-1", 2: sites / "site-0"}
    with pytest.raises(FederationError, match="partitions 0 and 2 hold the same training records"):
        run_on_grid(config, tmp_path / "run", _grid(config, tmp_path, folders))


def test_a_pooled_baseline_is_refused_on_flower_where_the_records_stay_at_the_sites(sites, tmp_path) -> None:
    from flower_local_grid import run_on_grid

    config = _config(sites, algorithm="fedavg,centralized")
    with pytest.raises(ConfigError, match="centralized pools every site's records"):
        run_on_grid(config, tmp_path / "run", _grid(config, tmp_path))
    assert not (tmp_path / "run").exists()


def test_a_resume_continues_to_the_uninterrupted_result_and_refuses_a_site_whose_records_changed(
    sites, tmp_path
) -> None:
    import shutil

    from algorithm_helpers import check_resume_after_crash, run_until_crash
    from fedistill.algorithms.classic.fedavg import FedAvgServer
    from fedistill.engine.launch import resume_suite

    copy = tmp_path / "data"
    shutil.copytree(sites, copy)
    config = _config(copy, rounds=4)
    check_resume_after_crash(config, FedAvgServer, tmp_path / "same", crash_round=3)
    run_until_crash(config, FedAvgServer, tmp_path / "edited", crash_round=3)
    extra = copy / "site-1" / "train" / "7" / "extra.png"
    Image.fromarray(np.full((8, 8), 90, np.uint8)).save(extra)
    with pytest.raises(ConfigError, match="site 1's records differ from those the run began with") as e:
        resume_suite(tmp_path / "edited", progress=False)
    # what to do about it: the resume cannot know which of the site's files changed, only that they did
    assert "Put site 1's folder back as it was, or start a new run" in str(e.value)
    extra.unlink()
    # the sites' folders moved: the resume reads them at their new place, their records unchanged
    moved = tmp_path / "moved"
    copy.rename(moved)
    path = tmp_path / "edited" / "config.toml"
    path.write_text(path.read_text().replace(str(copy), str(moved)))
    assert resume_suite(tmp_path / "edited", progress=False)[0]["rounds_done"] == 4


def test_a_flower_resume_refuses_a_node_whose_records_changed_as_the_in_process_resume_does(
    sites, tmp_path
) -> None:
    """The nodes' HELLO answers (each site's record count and fingerprint) are kept in sites.json when a
    Flower run begins, and a resume refuses a node whose records changed since, naming its site; before,
    only an in-process run kept them, and a Flower resume went on over the changed records."""
    import json
    import shutil

    from fedistill.algorithms.classic.fedavg import FedAvgServer
    from flower_local_grid import run_on_grid

    copy = tmp_path / "data"
    shutil.copytree(sites, copy)
    config = _config(copy, rounds=3)
    run_round = FedAvgServer.run_round

    def crash(self, fleet, round):
        if round == 2:
            raise RuntimeError("simulated crash")
        return run_round(self, fleet, round)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FedAvgServer, "run_round", crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_on_grid(config, tmp_path / "run", _grid(config, tmp_path))
    assert len(json.loads((tmp_path / "run" / "fedavg" / "sites.json").read_text())) == 3
    extra = copy / "site-1" / "train" / "7" / "extra.png"
    Image.fromarray(np.full((8, 8), 90, np.uint8)).save(extra)
    with pytest.raises(ConfigError, match=r"site 1's records differ from those the run began with"):
        run_on_grid(config, tmp_path / "run", _grid(config, tmp_path), resume=True)
    extra.unlink()
    (summary,) = run_on_grid(config, tmp_path / "run", _grid(config, tmp_path), resume=True)
    assert summary["rounds_done"] == 3


def test_partition_json_describes_each_sites_own_records_in_process_and_on_flower(sites, tmp_path) -> None:
    """An own-data run's partition.json says what each site holds (its training, validation and local test
    counts, its class counts where this process read them) and the server's validation and test counts,
    under the method own-data; before, it described the server's one-part split alone. A resume still reads
    the server's split from it."""
    import json

    from fedistill.data.partition import load_split
    from flower_local_grid import run_on_grid

    config = _config(sites, rounds=1)
    here = run_suite(config, tmp_path / "here", progress=False)
    meta = json.loads((tmp_path / "here" / "fedavg" / "partition.json").read_text())
    assert meta["method"] == "own-data" and meta["num_clients"] == 3 and meta["alpha"] is None
    assert meta["client_train_sizes"] == [108, 108, 108] and meta["client_val_sizes"] == [12, 12, 12]
    assert meta["client_test_sizes"] == [30, 30, 30]
    assert meta["server_val_size"] == 10 and meta["server_test_size"] == 300
    counts = np.array(meta["train_counts"])
    assert counts.shape == (3, 10) and counts.sum(axis=1).tolist() == [108, 108, 108]
    assert counts[2, :5].sum() == 0  # site 2 holds no case of 0-4
    assert meta["hash"] == here[0]["partition"]["hash"] == load_split(tmp_path / "here" / "fedavg").hash()
    run_on_grid(config, tmp_path / "there", _grid(config, tmp_path))
    meta = json.loads((tmp_path / "there" / "fedavg" / "partition.json").read_text())
    assert meta["method"] == "own-data" and meta["client_train_sizes"] == [108, 108, 108]
    assert meta["train_counts"] is None and meta["client_test_sizes"] is None  # the nodes counted only those
    assert meta["server_val_size"] == 10 and meta["server_test_size"] == 300


def test_a_server_holding_only_a_test_set_serves_when_it_holds_out_no_validation_split(
    sites, tmp_path
) -> None:
    """With val_fraction = 0 nothing of the server's training part is used, so a server folder of test/ alone
    serves (its classes its test folders', its normalisation measured on its test images); with
    val_fraction > 0 the line says its validation split is cut from its train/ folder. Before, both stopped
    on the loader's missing train/ folder."""
    import shutil

    server = tmp_path / "server"
    shutil.copytree(sites / "server" / "test", server / "test")
    config = _config(sites, data_dir=str(server), rounds=1)
    with pytest.raises(DataError, match=r"split \(val_fraction = 0.1\) is cut from its train/ folder"):
        validate_setup(config)
    data = validate_setup(config.replace(val_fraction=0.0))
    assert len(data.dataset.train) == 0 and data.dataset.info.class_names == tuple(str(d) for d in range(10))
    (summary,) = run_suite(config.replace(val_fraction=0.0), tmp_path / "run", progress=False)
    assert summary["partition"]["sizes"] == [120, 120, 120] and summary["rounds_done"] == 1
    with pytest.raises(ConfigError, match=r"drop_worst needs the server's validation split"):
        options = {**config.options, "fedavg": {"drop_worst": True}}
        validate_setup(config.replace(val_fraction=0.0, options=options))


def test_an_image_folders_classes_option_fixes_the_label_order_and_allows_missing_folders(sites) -> None:
    from fedistill.data.registry import load_dataset

    names = [str(d) for d in range(9, -1, -1)]  # reversed: '9' is label 0
    site = load_dataset("image-folder", sites / "site-2", classes=names, channels=1, image_size=8)
    assert site.info.class_names == tuple(names) and site.info.num_classes == 10
    assert sorted(set(site.train.y.tolist())) == [0, 1, 2, 3, 4]  # digits 9..5
    with pytest.raises(ConfigError, match="classes must list two or more distinct class names"):
        load_dataset("image-folder", sites / "site-2", classes=["7", "7"], channels=1, image_size=8)


def test_site_folders_write_a_partition_as_the_folders_a_consortium_holds_and_its_command_runs(
    tmp_path, capsys
) -> None:
    """`fedistill deploy site-folders` writes the run's partition, pixel for pixel, as a server folder and one
    folder per site holding that site's training records; the command it prints trains on them."""
    import shlex

    from fedistill.data.registry import load_dataset
    from fedistill.engine.setup import prepare_data

    out = tmp_path / "consortium"
    assert main(["deploy", "site-folders", "--out", str(out), "--clients", "3", "--alpha", "0.3"]) == 0
    printed = capsys.readouterr().out
    shared = prepare_data(build_config(RunConfig(), {"clients": 3, "alpha": 0.3}))
    for k in range(3):
        site = load_dataset(
            "image-folder", out / f"site-{k}", channels=1, image_size=8, classes=list("0123456789")
        )
        own = shared.dataset.train.subset(np.sort(shared.split.client_train[k]))  # files in index order
        assert (
            np.bincount(site.train.y.numpy(), minlength=10).tolist() == shared.split.train_counts[k].tolist()
        )
        # the same pixels: each class's images, in file order (their index), as the dataset holds them
        for c in range(10):
            assert site.train.x[site.train.y == c].equal(own.x[own.y == c])
    server = load_dataset("image-folder", out / "server", channels=1, image_size=8)
    assert len(server.train) == len(shared.split.server_val) and server.test.x.equal(
        shared.dataset.test.x[np.argsort(shared.dataset.test.y.numpy(), kind="stable")]
    )
    command = shlex.split(printed.strip().splitlines()[-1])
    assert command[:2] == ["fedistill", "run"]
    argv = [*command[1:], "--algorithm", "fedavg", "--model", "small-cnn", "--rounds", "1", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "runs"), "--name", "own"]) == 0
    summary = (tmp_path / "runs" / "own" / "fedavg" / "summary.json").read_text()
    assert '"own-data"' in summary
    capsys.readouterr()
    assert main(["deploy", "site-folders", "--out", str(out), "--clients", "3"]) == 2
    assert (
        "consortium is not empty: site-folders writes into a new or empty folder" in capsys.readouterr().err
    )


def test_site_folders_without_a_validation_holdout_print_a_command_that_runs(tmp_path, capsys) -> None:
    """With val_fraction = 0 the server's folder holds its test set alone, which only a run holding out no
    validation split reads: the printed command says val_fraction = 0 (before, it left it at its default,
    and the run stopped on the server's missing training records)."""
    import shlex

    out = tmp_path / "consortium"
    argv = ["deploy", "site-folders", "--out", str(out), "--clients", "2", "--set", "val_fraction=0"]
    assert main(argv) == 0
    assert not (out / "server" / "train").exists()
    command = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
    assert "val_fraction=0" in command
    argv = [*command[1:], "--algorithm", "fedavg", "--model", "small-cnn", "--rounds", "1", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "runs"), "--name", "own"]) == 0


def test_site_folders_write_a_segmentation_partition_as_mask_folders(tmp_path, capsys) -> None:
    """A semantic segmentation set's natural sites become mask folders (images and masks, pixel for pixel),
    and the command printed reads them as mask-folder with the set's class names."""
    import shlex

    from fedistill.data.registry import load_dataset
    from fedistill.engine.setup import prepare_data

    small = {"image_size": 16, "train_subjects": 4, "test_subjects": 1}
    keys = {"dataset": "mni152-synthetic-lesions", "partition": "natural", "clients": 2}
    sets = [f"mni152-synthetic-lesions.{key}={value}" for key, value in small.items()]
    argv = ["deploy", "site-folders", "--out", str(tmp_path / "out"), "--dataset", keys["dataset"]]
    argv += ["--partition", "natural", "--clients", "2", *(item for s in sets for item in ("--set", s))]
    assert main(argv) == 0
    command = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
    assert "mask-folder" in command and 'mask-folder.classes=["background","tumour"]' in command
    shared = prepare_data(build_config(RunConfig(), {**keys, "mni152-synthetic-lesions": small}))
    for k in range(2):
        site = load_dataset("mask-folder", tmp_path / "out" / f"site-{k}", image_size=16, classes=["bg", "t"])
        own = shared.dataset.train.subset(np.sort(shared.split.client_train[k]))
        assert site.train.x.equal(own.x) and site.train.y.equal(own.y)


def _idx_files(folder: Path, images: np.ndarray, labels: np.ndarray, n_train: int) -> None:
    """MNIST's four gzip IDX files under `folder/mnist/`: the first `n_train` records train, the rest test."""
    import gzip
    import struct

    (folder / "mnist").mkdir(parents=True)
    parts = {"train": slice(0, n_train), "t10k": slice(n_train, None)}
    for part, cut in parts.items():
        for kind, array, magic in (("images-idx3", images[cut], 2051), ("labels-idx1", labels[cut], 2049)):
            with gzip.open(folder / "mnist" / f"{part}-{kind}-ubyte.gz", "wb") as out:
                out.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", s) for s in array.shape))
                out.write(np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def test_sites_read_their_own_mnist_files_which_no_published_checksum_matches(tmp_path) -> None:
    """A site's (and the server's) IDX files are its own records, not the published MNIST: their format is
    checked, not their md5 against the published files'."""
    digits = load_digits()
    images = np.kron(np.clip(digits.images * 16, 0, 255), np.ones((3, 3))).astype(np.uint8)  # 24 x 24
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))  # 28 x 28, as MNIST's
    labels = digits.target.astype(np.uint8)
    _idx_files(tmp_path / "server", images[:200], labels[:200], 100)
    for k in range(2):
        mine = slice(200 + 150 * k, 350 + 150 * k)
        _idx_files(tmp_path / f"site-{k}", images[mine], labels[mine], 120)
    config = build_config(
        RunConfig(),
        {
            "algorithm": "fedavg",
            "dataset": "mnist",
            "data_dir": str(tmp_path / "server"),
            "site_data_dir": str(tmp_path / "site-{site}"),
            "clients": 2,
            "model": "small-cnn",
        },
    )
    data = validate_setup(config)
    assert data.client_sizes() == [108, 108] and len(data.dataset.test) == 100
    assert data.sites[1].dataset.train.x.shape[1:] == (1, 28, 28)


def test_a_resumes_dry_run_refuses_a_site_whose_records_changed_as_the_resume_does(sites, tmp_path) -> None:
    import shutil

    from algorithm_helpers import run_until_crash
    from fedistill.algorithms.classic.fedavg import FedAvgServer
    from fedistill.engine.dry_run import plan_resume

    copy = tmp_path / "data"
    shutil.copytree(sites, copy)
    run_until_crash(_config(copy, rounds=3), FedAvgServer, tmp_path / "run", crash_round=2)
    assert "continues after round 1" in plan_resume(tmp_path / "run")
    Image.fromarray(np.full((8, 8), 90, np.uint8)).save(copy / "site-1" / "train" / "7" / "extra.png")
    with pytest.raises(ConfigError, match="site 1's records differ from those the run began with"):
        plan_resume(tmp_path / "run")


def _brats_site(folder: Path, subjects: int, seed: int) -> None:
    """`subjects` BraTS 2018 subjects of 24 x 24 x 8 voxels under `folder/brats/HGG/`, each a tumour cube."""
    import nibabel as nib

    yy, xx = np.mgrid[:24, :24]
    disk = ((yy - 12) ** 2 + (xx - 12) ** 2 < 100)[:, :, None]
    for i in range(subjects):
        name = f"Brats18_{seed}_{i}"
        (folder / "brats" / "HGG" / name).mkdir(parents=True)
        rng = np.random.default_rng(seed * 10 + i)
        volume = np.where(disk, 100 + rng.random((24, 24, 8)) * 50, 0).astype(np.float32)
        seg = np.zeros((24, 24, 8), np.uint8)
        seg[8 : 10 + i, 8 : 10 + i, 2 : 4 + i] = 2
        for modality, data in (
            ("t1", volume),
            ("t1ce", volume),
            ("t2", volume),
            ("flair", volume),
            ("seg", seg),
        ):
            image = nib.Nifti1Image(data, np.diag([10.0, 10.0, 10.0, 1.0]))
            nib.save(image, str(folder / "brats" / "HGG" / name / f"{name}_{modality}.nii.gz"))


def test_per_pixel_sites_with_different_subject_counts_run_and_plot_each_sites_count(tmp_path) -> None:
    """A segmentation site's partition groups are its own subjects, none another site's: the partition plot
    shows each site's slice count (it stopped the run when the sites held different numbers of subjects)."""
    for where, subjects, seed in (("server", 3, 0), ("site-0", 4, 1), ("site-1", 3, 2)):
        _brats_site(tmp_path / where, subjects, seed)
    config = _config(
        tmp_path,
        dataset="brats",
        data_dir=str(tmp_path / "server"),
        clients=2,
        rounds=1,
        model="unet",
        brats={"image_size": 16},
        fedavg={"local_steps": 1},
    )
    summary = run_suite(config, tmp_path / "run", progress=False)[0]
    assert summary["partition"]["method"] == "own-data" and len(summary["partition"]["sizes"]) == 2
    assert (tmp_path / "run" / "fedavg" / "plots" / "partition.png").exists()


def test_a_flower_nodes_missing_data_dir_is_named_as_its_own_not_as_site_data_dirs(sites, tmp_path) -> None:
    """A node whose node config names a folder that is not there is told to fix its data-dir: the run's
    site_data_dir was never read."""
    config = _config(sites)
    info = validate_setup(config).dataset.info
    with pytest.raises(DataError, match=r"site 1's .*nope does not exist \(its node config's data-dir"):
        load_site(config, 1, info, tmp_path / "nope")
    with pytest.raises(DataError, match=r"site 5's folder .*site-5 does not exist \(site_data_dir = "):
        load_site(config, 5, info)


def test_the_servers_test_set_read_from_a_hello_is_the_nodes_own_copy(sites) -> None:
    """A received message's arrays are read-only; the node's harness copies them (torch warned of
    undefined behaviour on every node, and a tensor written in place would have written into them)."""
    import warnings

    from fedistill.engine.site_data import EVALUATION_SET, harness_from, site_greeting

    hello = site_greeting(validate_setup(_config(sites)).dataset)
    arrays = {name: np.array(value) for name, value in hello.arrays[EVALUATION_SET].items()}
    for value in arrays.values():
        value.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        harness = harness_from(arrays, hello.scalars["config"])
    assert not np.shares_memory(harness.test.x.numpy(), arrays["x"])
    assert harness.test.x.numpy().flags.writeable


@pytest.mark.parametrize(
    ("site_data_dir", "named"),
    [
        ("site-0", "has no {site}, so every site would read the same folder"),
        ("site-{site}", "site 3's folder"),
    ],
)
def test_a_flower_simulations_site_folders_are_checked_before_its_folder_as_in_process(
    sites, tmp_path, site_data_dir, named
) -> None:
    """A simulation's nodes read site_data_dir alone (no node has a data-dir of its own): a path without
    {site}, or a site folder that is not there, is named before the run's folder is made, as in-process
    (only a deployment's nodes may each name their own folder)."""
    pytest.importorskip("flwr")
    from fedistill.engine.dry_run import plan_new
    from fedistill.engine.launch import start_suite

    config = _config(sites, transport="flower", clients=4, site_data_dir=str(sites / site_data_dir))
    config = config.replace(out=str(tmp_path / "out"))
    for attempt in (plan_new, start_suite):
        with pytest.raises((ConfigError, DataError), match=named):
            attempt(config)
    assert not (tmp_path / "out").exists()


def test_a_site_data_dir_naming_one_sites_folder_is_answered_with_the_path_for_every_site(sites) -> None:
    """`site-0` for `site-{site}`: the line suggests the path with the number made `{site}`."""
    with pytest.raises(ConfigError, match=r"has no \{site\}.*write e\.g\. '.*/sites\d*/site-\{site\}' \("):
        validate_setup(_config(sites, site_data_dir=str(sites / "site-0")))
    # one site reads one folder: a path without {site} is no mistake there (it was refused as one)
    data = validate_setup(_config(sites, site_data_dir=str(sites / "site-1"), clients=1))
    assert data.client_sizes() == [108]


def test_a_server_reading_a_sites_folder_is_named_in_process_and_on_flower(sites, tmp_path) -> None:
    """data_dir naming a site's folder would make that site's records the server's validation and test
    data; in-process and over Flower alike the run stops naming the site, before any round."""
    from flower_local_grid import run_on_grid

    folder = {"channels": 1, "image_size": 8, "classes": [str(d) for d in range(10)]}
    config = _config(sites, data_dir=str(sites / "site-1"), rounds=1, **{"image-folder": folder})
    with pytest.raises(DataError, match=r"site 1 holds the server's training records"):
        run_suite(config, tmp_path / "here", progress=False)
    assert not (tmp_path / "here").exists()
    with pytest.raises(FederationError, match=r"node of partition 1 holds the server.s training records"):
        run_on_grid(config, tmp_path / "there", _grid(config, tmp_path))


def test_a_site_without_training_records_is_named_not_answered_with_fewer_clients(tmp_path) -> None:
    """A site whose files hold no training record is named; before, the split's own line told the user to
    lower `clients`, naming no site."""
    digits = load_digits()
    images = np.pad(np.kron(digits.images * 16, np.ones((3, 3))), ((0, 0), (2, 2), (2, 2))).astype(np.uint8)
    labels = digits.target.astype(np.uint8)
    _idx_files(tmp_path / "server", images[:200], labels[:200], 100)
    _idx_files(tmp_path / "site-0", images[200:300], labels[200:300], 80)
    _idx_files(tmp_path / "site-1", images[300:320], labels[300:320], 0)  # its test part alone
    keys = {"dataset": "mnist", "data_dir": str(tmp_path / "server"), "clients": 2, "model": "small-cnn"}
    config = build_config(RunConfig(), {**keys, "site_data_dir": str(tmp_path / "site-{site}")})
    with pytest.raises(DataError, match=r"site 1's folder .*site-1 holds no training records"):
        validate_setup(config)
    # the server's folder too, where its validation split is cut from its training part; with none cut, a
    # test set alone serves
    config = config.replace(data_dir=str(tmp_path / "site-1"), clients=1)
    with pytest.raises(DataError, match=r"is cut from its train/ folder.*site-1 holds no training records"):
        validate_setup(config)
    assert len(validate_setup(config.replace(val_fraction=0.0)).dataset.test) == 20


def test_a_sites_files_the_loader_refuses_are_named_with_the_site(tmp_path) -> None:
    """A loader's line about a site's files names the site: `BraTS needs at least 2 subjects` said
    nothing of which of the sites holds one."""
    for where, subjects, seed in (("server", 3, 0), ("site-0", 3, 1), ("site-1", 1, 2)):
        _brats_site(tmp_path / where, subjects, seed)
    config = _config(tmp_path, dataset="brats", data_dir=str(tmp_path / "server"), clients=2, model="unet")
    with pytest.raises(DataError, match=r"site 1's folder .*site-1: BraTS needs at least 2 subjects"):
        validate_setup(config)


def test_a_segmentation_site_holds_out_whole_subjects_of_its_own_for_validation(tmp_path) -> None:
    """Neighbouring slices of one subject are nearly one sample: a site holding its own volumes validates
    on whole subjects it does not train on (val_mode auto), as a natural site of a shared dataset does."""
    for where, subjects, seed in (("server", 3, 0), ("site-0", 6, 1), ("site-1", 3, 2)):
        _brats_site(tmp_path / where, subjects, seed)
    config = _config(
        tmp_path, dataset="brats", data_dir=str(tmp_path / "server"), clients=2, val_fraction=0.3,
        model="unet", brats={"image_size": 16},
    )  # fmt: skip
    data = validate_setup(config)
    site = data.sites[0]
    subjects = np.asarray(site.dataset.train_groups)  # BraTS: each subject its own group (its size rank)
    held, kept = set(subjects[site.split.client_val[0]]), set(subjects[site.split.client_train[0]])
    assert held and kept and not held & kept
    server = np.asarray(data.dataset.train_groups)
    assert not set(server[data.split.server_val]) & set(server[data.split.client_train[0]])


def test_a_server_test_set_over_the_message_cap_is_refused_before_a_flower_run_starts(
    sites, tmp_path
) -> None:
    """The start-up message carries the server's test set (300 images of 64 bytes and their labels, about
    21 KiB) to every site: like any message it is held to max_message_mb, before any folder is made."""
    from flower_local_grid import run_on_grid

    config = _config(sites, rounds=1, max_message_mb=0.01)
    with pytest.raises(ConfigError, match=r"test set, .* is 0.02 MiB, over max_message_mb = 0.01"):
        run_on_grid(config, tmp_path / "run", _grid(config, tmp_path))
    assert not (tmp_path / "run").exists()


def test_site_folders_keep_a_label_order_that_is_not_alphabetical(tmp_path, capsys) -> None:
    """Folders read back sorted by name: a set whose classes are not in alphabetical order gets the classes
    option in its command, so every label means what it meant in the dataset written."""
    command = _site_folders_command(tmp_path, capsys, 'image-folder.classes=["zebra","ant"]')
    assert 'image-folder.classes=["zebra","ant"]' in command  # without it, label 0 would be "ant"


def test_site_folders_keep_the_datasets_training_augmentation(tmp_path, capsys) -> None:
    """A set trained with random crops and flips (CIFAR's) is read back with them, not without."""
    command = _site_folders_command(
        tmp_path, capsys, "image-folder.crop_padding=2", "image-folder.horizontal_flip=true"
    )
    assert "image-folder.crop_padding=2" in command and "image-folder.horizontal_flip=true" in command


def test_site_folders_quote_class_names_as_toml_and_the_shell_read_them(tmp_path, capsys) -> None:
    """Class names went into the printed classes option between bare double quotes: a name holding `"` or
    a backslash made TOML that did not parse (the option then read as text). They are TOML strings now."""
    from fedistill.config import parse_assignment

    names = ('say "hi"', "back\\slash")
    classes = "[" + ", ".join(f"'{name}'" for name in names) + "]"  # TOML literal strings: no escapes
    command = _site_folders_command(tmp_path, capsys, f"image-folder.classes={classes}", names=names)
    given = [command[i + 1] for i, item in enumerate(command) if item == "--set"]
    option = next(item for item in given if item.startswith("image-folder.classes="))
    assert parse_assignment(option) == ("image-folder.classes", list(names))


def _site_folders_command(
    tmp_path: Path, capsys, *sets: str, names: tuple[str, str] = ("zebra", "ant")
) -> list[str]:
    """The command `fedistill deploy site-folders` prints for an image folder of two classes, zebra and ant
    unless `names` says otherwise (`sets`: its options)."""
    import shlex

    rng = np.random.default_rng(0)
    for part, n in (("train", 24), ("test", 6)):
        for c, name in enumerate(names):
            (tmp_path / "own" / part / name).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 100, (8, 8), dtype=np.uint8) + 120 * c
                Image.fromarray(pixels.astype(np.uint8)).save(tmp_path / "own" / part / name / f"{i}.png")
    argv = ["deploy", "site-folders", "--out", str(tmp_path / "out"), "--dataset", "image-folder"]
    argv += ["--data-dir", str(tmp_path / "own"), "--clients", "2", "--set", "image-folder.image_size=8"]
    assert main([*argv, *(item for s in sets for item in ("--set", s))]) == 0
    return shlex.split(capsys.readouterr().out.strip().splitlines()[-1])


def test_site_folders_name_a_table_of_another_dataset_as_a_run_does(tmp_path, capsys) -> None:
    """`--set mask-folder.image_size=9` on digits was silently ignored by site-folders; a run refuses it."""
    argv = ["deploy", "site-folders", "--out", str(tmp_path / "out"), "--clients", "2"]
    assert main([*argv, "--set", "mask-folder.image_size=9"]) == 2
    said = capsys.readouterr().err
    assert "sets options of dataset 'mask-folder', but the run uses dataset 'digits'" in said
    assert not (tmp_path / "out").exists()
