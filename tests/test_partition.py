"""Partitioners, holdout, split files and the two plots, on synthetic labels."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from fedistill.data.partition import (
    PARTITIONERS,
    class_counts,
    holdout,
    iid_shards,
    load_split,
    make_split,
    partition,
    save_split,
)
from fedistill.errors import DataError, PartitionError, UserError
from fedistill.plots import plot_learning_curves, plot_partition

NUM_CLASSES = 10
LABELS = np.repeat(np.arange(NUM_CLASSES), 100)  # 10 classes x 100 samples, sorted like a class-ordered file
TEST_LABELS = np.tile(np.arange(NUM_CLASSES), 30)
# flwr-datasets is slow to import; `natural` takes its sites from the data (tested on its own below)
LOCAL = [name for name in PARTITIONERS if name not in ("dirichlet-flwr", "natural")]
DIRICHLET = [name for name in LOCAL if name != "iid"]


def _split(method: str, labels=LABELS, k: int = 10, alpha: float | None = 0.5, seed: int = 0, **options):
    return partition(labels, k, method=method, alpha=alpha, seed=seed, num_classes=NUM_CLASSES, **options)


def _fractions(parts: list[np.ndarray]) -> np.ndarray:
    counts = class_counts(LABELS, parts, NUM_CLASSES)
    return counts / counts.sum(axis=1, keepdims=True)


def _png(path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------------
# proportions


def test_iid_is_exactly_balanced_per_class():
    counts = class_counts(LABELS, _split("iid", alpha=None), NUM_CLASSES)
    assert counts.shape == (10, NUM_CLASSES) and counts.dtype == np.int64
    assert (counts == 10).all()
    uneven = class_counts(LABELS, _split("iid", k=7, alpha=None), NUM_CLASSES)  # 100 = 7*14 + 2
    assert set(np.unique(uneven)) <= {14, 15}
    assert uneven.sum(axis=1).max() - uneven.sum(axis=1).min() <= 1


@pytest.mark.parametrize("method", DIRICHLET)
def test_large_alpha_is_nearly_uniform(method):
    fractions = _fractions(_split(method, alpha=1000.0))
    total_variation = np.abs(fractions - 1 / NUM_CLASSES).sum(axis=1).mean() / 2
    # dirichlet-equal samples later clients from what is left, so it is noisier than the others.
    assert total_variation < (0.2 if method == "dirichlet-equal" else 0.05)


@pytest.mark.parametrize("method", DIRICHLET)
def test_tiny_alpha_gives_about_one_class_per_client(method):
    fractions = _fractions(_split(method, alpha=0.05, seed=0))
    effective_classes = (1 / (fractions**2).sum(axis=1)).mean()
    assert effective_classes < 2.5


# ------------------------------------------------------------------------------------------------
# coverage, determinism, sizes


@pytest.mark.parametrize("method", LOCAL)
def test_make_split_covers_every_sample_exactly_once(method):
    alpha = None if method == "iid" else 0.5
    split = make_split(LABELS, TEST_LABELS, 10, method=method, alpha=alpha, seed=3, num_classes=NUM_CLASSES)
    train = np.concatenate([*split.client_train, split.server_val])
    assert np.array_equal(np.sort(train), np.arange(LABELS.size))  # 900 = 10*90, so no leftover
    assert split.server_val.size == 100
    assert (np.bincount(LABELS[split.server_val], minlength=NUM_CLASSES) == 10).all()  # stratified
    assert np.array_equal(np.sort(np.concatenate(split.client_val)), split.server_val)
    assert np.array_equal(np.sort(np.concatenate(split.client_test)), np.arange(TEST_LABELS.size))
    assert (class_counts(TEST_LABELS, split.client_test, NUM_CLASSES) == 3).all()
    assert np.array_equal(split.train_counts, class_counts(LABELS, split.client_train, NUM_CLASSES))
    assert all(p.dtype == np.int64 for p in split.client_train)


@pytest.mark.parametrize("method", LOCAL)
def test_same_seed_same_split_other_seed_other_split(method):
    alpha = None if method == "iid" else 0.5
    first, again, other = (_split(method, alpha=alpha, seed=s) for s in (7, 7, 8))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert any(not np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_dirichlet_equal_gives_every_client_floor_n_over_k():
    for k in (7, 10, 13):
        parts = _split("dirichlet-equal", k=k, alpha=0.3, seed=1)
        assert [p.size for p in parts] == [LABELS.size // k] * k
        assert np.unique(np.concatenate(parts)).size == (LABELS.size // k) * k  # disjoint


def test_dirichlet_equal_does_not_depend_on_the_order_argpartition_returns(monkeypatch):
    """NumPy's argpartition returns the chosen samples in an order that follows the CPU's vector
    instructions; the split (order included, which the partition hash reads) must not."""
    from fedistill.data.partition import partitioners

    expected = _split("dirichlet-equal", alpha=0.3, seed=1)
    real = np.argpartition

    def reversed_within_sides(a: np.ndarray, kth: int) -> np.ndarray:
        order = real(a, kth)
        return np.concatenate([order[: kth + 1][::-1], order[kth + 1 :][::-1]])

    monkeypatch.setattr(partitioners.np, "argpartition", reversed_within_sides)
    reversed_first = _split("dirichlet-equal", alpha=0.3, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(expected, reversed_first, strict=True))


def test_dirichlet_balanced_respects_min_size_per_group():
    labels = np.repeat(np.arange(NUM_CLASSES), 200)
    parts = partition(labels, 20, method="dirichlet-balanced", alpha=0.1, seed=2, num_classes=NUM_CLASSES)
    sizes = np.array([p.size for p in parts])
    assert sizes.sum() == labels.size and np.unique(np.concatenate(parts)).size == labels.size
    for group in (sizes[:10], sizes[10:]):  # two groups of 10 clients, 1000 samples each
        assert group.sum() == 1000
        assert group.min() >= int(0.5 * 1000 / 10)


def test_dirichlet_keeps_file_order_when_asked():
    parts = _split("dirichlet", alpha=1.0, shuffle_within_class=False)
    for part in parts:
        for c in range(NUM_CLASSES):
            of_class = part[LABELS[part] == c]
            assert np.array_equal(of_class, np.sort(of_class))
    # consecutive chunks: client k's block of class c ends where client k+1's begins
    starts = [p[LABELS[p] == 0] for p in parts]
    assert np.array_equal(np.concatenate(starts), np.flatnonzero(LABELS == 0))


def test_dirichlet_flwr_runs_and_turns_exhausted_retries_into_partition_error():
    pytest.importorskip("flwr_datasets")
    parts = _split("dirichlet-flwr", alpha=0.5, seed=1)
    again = _split("dirichlet-flwr", alpha=0.5, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(LABELS.size))
    small = np.repeat(np.arange(NUM_CLASSES), 20)
    with pytest.raises(PartitionError, match=r"at least 10 samples in 10 attempts.*raise alpha"):
        partition(small, 20, method="dirichlet-flwr", alpha=0.05, seed=0, num_classes=NUM_CLASSES)


# ------------------------------------------------------------------------------------------------
# error paths


@pytest.mark.parametrize("method", DIRICHLET)
@pytest.mark.parametrize(
    ("alpha", "message"),
    [
        (0, r"alpha must be > 0 \(got 0\); use a small positive value"),
        (-1.0, r"alpha must be > 0 \(got -1.0\)"),
        (float("inf"), r"alpha must be finite \(got inf\)"),
        (None, r"needs alpha"),
    ],
)
def test_bad_alpha_is_rejected(method, alpha, message):
    with pytest.raises(PartitionError, match=message):
        _split(method, alpha=alpha)


def test_more_clients_than_samples_is_rejected():
    with pytest.raises(
        PartitionError, match=r"num_clients=1001 is more than the 1000 samples.*lower `clients` \(--clients\)"
    ):
        _split("iid", k=1001, alpha=None)
    with pytest.raises(
        PartitionError, match=r"num_clients \(`clients`\) must be a positive integer \(got 0\)"
    ):
        _split("dirichlet", k=0)


@pytest.mark.parametrize(
    ("method", "options", "message"),
    [
        ("dirichlet-balanced", {"min_fraction": 1.0, "max_retries": 3}, r"after 3 attempts.*raise alpha"),
        (
            "dirichlet-unbalanced",
            {"min_size": 100, "max_retries": 5},
            r"at least 100 samples after 5 attempts",
        ),
    ],
)
def test_exhausted_retries_raise(method, options, message):
    with pytest.raises(PartitionError, match=message):
        _split(method, alpha=0.05, **options)


def test_switch_options_must_be_booleans():
    """`--set partition.shuffle_within_class=False` reaches the partitioner as the text "False" (TOML's
    false is lower case); a truthy string used to shuffle when the user asked for file order."""
    with pytest.raises(UserError, match=r"shuffle_within_class must be true or false \(got 'False'\)"):
        _split("dirichlet", alpha=1.0, shuffle_within_class="False")
    with pytest.raises(UserError, match=r"shuffle_within_class must be true or false \(got 0\)"):
        _split("dirichlet", alpha=1.0, shuffle_within_class=0)
    ordered = _split("dirichlet", alpha=1.0, shuffle_within_class=np.bool_(False))
    assert all(np.array_equal(p, np.sort(p)) for p in ordered)  # class by class, each in file order
    pytest.importorskip("flwr_datasets")
    for option in ("self_balancing", "shuffle"):
        with pytest.raises(UserError, match=rf"{option} must be true or false \(got 'false'\)"):
            _split("dirichlet-flwr", alpha=0.5, **{option: "false"})


def test_client_without_data_is_named():
    with pytest.raises(PartitionError, match=r"client \d+ received no training samples.*raise alpha, lower"):
        _split("dirichlet", k=50, alpha=0.01)
    with pytest.raises(PartitionError, match=r"client 9 received no training samples"):
        _split("dirichlet-equal", alpha=0.01, seed=4)  # client 8 took everything left


def test_an_empty_client_is_told_a_fix_its_own_partitioner_has():
    """A partitioner that retries is told to ask more of its retry; the error never suggests the very
    partitioner that left the client empty."""
    few = np.repeat(np.arange(3), 10)  # 30 samples over 20 clients: half the average rounds to 0
    cases = [
        ("dirichlet-balanced", {}, r"raise min_fraction"),
        ("dirichlet-unbalanced", {"min_size": 0}, r"raise min_size"),
        ("dirichlet", {}, r"'dirichlet-balanced'"),
    ]
    for method, options, fix in cases:
        with pytest.raises(PartitionError, match=r"received no training samples") as caught:
            partition(few, 20, method=method, alpha=0.1, seed=0, num_classes=3, **options)
        message = str(caught.value)
        assert re.search(fix, message), message
        assert f"such as {method!r}" not in message


def test_unknown_names_are_rejected_with_a_suggestion():
    with pytest.raises(
        UserError,
        match=r"unknown partitioner 'dirichlet-balance'; did you mean 'dirichlet-balanced'\? "
        r"\(valid: dirichlet,",
    ):
        _split("dirichlet-balance")
    with pytest.raises(
        UserError, match=r"unknown dirichlet-balanced option 'group_sise'; did you mean 'group_size'"
    ):
        _split("dirichlet-balanced", group_sise=5)
    with pytest.raises(UserError, match=r"labels must lie in \[0, 10\)"):
        partition(LABELS + 1, 10, method="iid", alpha=None, seed=0, num_classes=NUM_CLASSES)


# ------------------------------------------------------------------------------------------------
# holdout and shards


def test_holdout_modes():
    train, held = holdout(LABELS, 0.1, seed=0, mode="tail")
    assert np.array_equal(held, np.arange(900, 1000)) and np.array_equal(train, np.arange(900))
    train, held = holdout(LABELS, 0.1, seed=0)
    assert (np.bincount(LABELS[held], minlength=NUM_CLASSES) == 10).all()
    assert np.array_equal(np.sort(np.concatenate([train, held])), np.arange(LABELS.size))
    train, held = holdout(LABELS, 0.0, seed=0)
    assert held.size == 0 and train.size == LABELS.size
    with pytest.raises(UserError, match=r"must lie in \[0, 1\)"):
        holdout(LABELS, 1.0, seed=0)
    with pytest.raises(UserError, match=r"unknown holdout mode 'last'"):
        holdout(LABELS, 0.1, seed=0, mode="last")


def test_iid_shards_and_empty_holdout():
    shards = iid_shards(TEST_LABELS, 3, seed=0)
    assert (class_counts(TEST_LABELS, shards, NUM_CLASSES) == 10).all()
    split = make_split(
        LABELS, TEST_LABELS, 5, method="iid", alpha=None, seed=0, num_classes=NUM_CLASSES, val_fraction=0
    )
    assert split.server_val.size == 0 and all(v.size == 0 for v in split.client_val)
    with pytest.raises(PartitionError, match=r"400 clients a validation shard .* larger validation fraction"):
        iid_shards(TEST_LABELS, 400, seed=0)
    # a test set too small for the clients: no validation fraction can help there
    with pytest.raises(
        PartitionError, match=r"400 clients a test shard from 300 samples; use fewer clients$"
    ):
        iid_shards(TEST_LABELS, 400, seed=0, what="test")


def test_make_split_names_every_val_mode():
    """The holdout knows random and tail only; make_split also takes subjects, which its error omitted."""
    with pytest.raises(
        UserError,
        match=r"unknown val_mode 'subject'; did you mean 'subjects'\? \(valid: random, subjects, tail\)",
    ):
        make_split(
            LABELS, TEST_LABELS, 2, method="natural", alpha=None, seed=0, num_classes=10, val_mode="subject"
        )
    with pytest.raises(UserError, match=r"unknown val_mode 'auto' \(valid: random, subjects, tail\)"):
        make_split(LABELS, TEST_LABELS, 2, method="iid", alpha=None, seed=0, num_classes=10, val_mode="auto")


# ------------------------------------------------------------------------------------------------
# files


def test_save_load_round_trip_and_tamper_detection(tmp_path):
    split = make_split(
        LABELS,
        TEST_LABELS,
        10,
        method="dirichlet-balanced",
        alpha=0.3,
        seed=5,
        num_classes=NUM_CLASSES,
        group_size=5,
    )
    save_split(split, tmp_path)
    meta = json.loads((tmp_path / "partition.json").read_text())
    assert meta["hash"] == split.hash() and meta["options"] == {"group_size": 5}
    assert meta["client_train_sizes"] == [p.size for p in split.client_train]
    loaded = load_split(tmp_path)
    assert loaded.hash() == split.hash()
    assert all(np.array_equal(a, b) for a, b in zip(loaded.client_train, split.client_train, strict=True))
    assert np.array_equal(loaded.train_counts, split.train_counts)

    arrays = dict(split.arrays())
    arrays["client_train_0"] = arrays["client_train_0"][:-1]
    np.savez(tmp_path / "partition.npz", **arrays)
    with pytest.raises(DataError, match=r"does not match partition.json.*create the split again"):
        load_split(tmp_path)

    save_split(split, tmp_path)
    meta["seed"] = 6
    (tmp_path / "partition.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"does not match partition.json"):
        load_split(tmp_path)
    with pytest.raises(DataError, match=r"does not exist"):
        load_split(tmp_path / "missing")


# ------------------------------------------------------------------------------------------------
# plots


def test_plots_write_png(tmp_path):
    counts = class_counts(LABELS, _split("dirichlet-balanced", alpha=0.1), NUM_CLASSES)
    assert _png(plot_partition(counts, tmp_path / "partition.png", title="alpha=0.1"))
    rows = [
        {"round": r, "algorithm": name, "test_accuracy": 0.1 + 0.01 * r * (i + 1), "loss": 1 / (r + 1)}
        for i, name in enumerate(("fedavg", "feddf"))
        for r in range(20)
    ]
    rows.append({"round": 20, "algorithm": "fedavg"})  # no metric: skipped
    out = plot_learning_curves(rows, tmp_path / "curves" / "acc.png", metrics=("test_accuracy", "loss"))
    assert _png(out)
    assert _png(
        plot_learning_curves(
            {"a": rows[:5], "b": rows[20:25]}, tmp_path / "overlay.png", metrics=("test_accuracy",)
        )
    )


def test_natural_cuts_the_ordered_groups_into_contiguous_sites():
    groups = np.repeat(np.arange(10), [3, 1, 4, 1, 5, 9, 2, 6, 5, 3])  # ten subjects in the protocol's order
    parts = partition(groups, 4, method="natural", alpha=None, seed=0, num_classes=10)
    assert [sorted(set(groups[p])) for p in parts] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(groups.size))
    again = partition(groups, 4, method="natural", alpha=None, seed=99, num_classes=10)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))  # the data fix the sites
    with pytest.raises(PartitionError, match="10 groups in its data, fewer than 11 clients"):
        partition(groups, 11, method="natural", alpha=None, seed=0, num_classes=10)


def test_sites_of_several_subjects_validate_on_whole_subjects_of_their_own():
    """12 subjects x 20 slices over 3 natural sites of 4: a tenth of the 12 subjects (one) held out whole
    by one site, never a subject another site trains on, no slice of a training subject (before: a
    random tenth of every subject's slices, dealt to the sites round-robin)."""
    groups = np.repeat(np.arange(12), 20)
    split = make_split(
        groups, np.arange(12), 3, method="natural", alpha=None, seed=0, num_classes=12, val_mode="subjects"
    )
    held = [sorted(set(groups[v])) for v in split.client_val]
    assert sum(len(h) for h in held) == 1 and sum(v.size for v in split.client_val) == 20
    for train, val, subjects in zip(split.client_train, split.client_val, held, strict=True):
        assert not set(groups[train]) & set(subjects)  # whole subjects: none of their slices trains
        assert set(subjects) <= set(range(12)) and np.intersect1d(train, val).size == 0
    assert [sorted(set(groups[np.concatenate([t, v])])) for t, v in zip(split.client_train, split.client_val,
            strict=True)] == [list(range(0, 4)), list(range(4, 8)), list(range(8, 12))]  # fmt: skip
    assert np.array_equal(np.sort(np.concatenate(split.client_val)), split.server_val)
    every = np.sort(np.concatenate(split.client_train + split.client_val))
    assert np.array_equal(every, np.arange(groups.size))
    # 40 subjects over 10 sites: four held out, by four sites, one each
    forty = make_split(np.repeat(np.arange(40), 5), np.arange(40), 10, method="natural", alpha=None, seed=1,
                       num_classes=40, val_mode="subjects")  # fmt: skip
    assert sorted(v.size for v in forty.client_val) == [0] * 6 + [5] * 4
    # one volume per site: a contiguous slab of it, at least one slice
    one = make_split(np.repeat(np.arange(2), 30), [0, 1], 2, method="natural", alpha=None, seed=0,
                     num_classes=2, val_mode="subjects")  # fmt: skip
    for val in one.client_val:
        assert val.size == 3 and np.array_equal(val, np.arange(val[0], val[0] + 3))
    with pytest.raises(UserError, match="needs partition = 'natural'"):
        make_split(
            LABELS, TEST_LABELS, 2, method="iid", alpha=None, seed=0, num_classes=10, val_mode="subjects"
        )


def test_a_per_pixel_natural_run_validates_on_slabs_by_default():
    from fedistill.config import RunConfig
    from fedistill.engine.setup import validation_mode

    assert validation_mode(RunConfig(partition="natural"), per_pixel=True) == "subjects"
    assert validation_mode(RunConfig(partition="natural"), per_pixel=False) == "random"
    assert validation_mode(RunConfig(partition="dirichlet"), per_pixel=True) == "random"
    assert validation_mode(RunConfig(partition="natural", val_mode="random"), per_pixel=True) == "random"


def test_a_site_of_one_source_validates_on_whole_subjects_of_its_own(monkeypatch):
    """Two sources of five 8-slice volumes, one source per site: each site holds out floor(0.2 · 5) = 1
    whole volume (before: a 8-slice slab at a random offset, mostly cutting across two volumes that kept
    their other slices in training). The assembled MRI and nuclei sets carry the volume of each sample."""
    from fedistill.data.medical.nuclei_sets import Patching, WholeImage, nuclei_dataset
    from fedistill.data.mri.assemble import Volume, build_dataset

    rng = np.random.default_rng(0)
    volumes = [
        Volume(f"s{i}", rng.random((8, 8, 8), dtype=np.float32), np.arange(8), group=i // 5)
        for i in range(10)
    ]
    data = build_dataset("two-sources", volumes, volumes[:2], ("a", "b"))
    subjects = data.train_subject_ids
    assert np.array_equal(subjects, np.repeat(np.arange(10), 8))
    for seed in range(20):
        split = make_split(
            data.train_groups, data.test_groups, 2, method="natural", alpha=None, seed=seed, num_classes=2,
            val_fraction=0.2, val_mode="subjects", subjects=subjects,
        )  # fmt: skip
        for site, (train, val) in enumerate(zip(split.client_train, split.client_val, strict=True)):
            held = np.unique(subjects[val])
            assert held.size == 1 and val.size == 8 and held[0] // 5 == site  # one whole volume of its own
            assert not set(subjects[train]) & set(held)
        every = np.sort(np.concatenate(split.client_train + split.client_val))
        assert np.array_equal(every, np.arange(80))
    from fedistill.config import RunConfig
    from fedistill.engine import setup

    monkeypatch.setattr(setup, "load_dataset", lambda *args, **kwargs: data)
    prepared = setup.prepare_data(
        RunConfig(dataset="two-sources", partition="natural", clients=2, val_fraction=0.2)
    )
    assert [np.unique(subjects[v]).size for v in prepared.split.client_val] == [
        1,
        1,
    ]  # the run passes them on
    wholes = [WholeImage(f"w{i}", np.zeros((3, 8, 16), np.uint8), np.zeros((8, 16), np.int64), i % 2)
              for i in range(3)]  # fmt: skip
    nuclei = nuclei_dataset("tiles", wholes, wholes[:1], Patching(8, 8, 1.0), ("x", "y"))
    assert np.array_equal(nuclei.train_subject_ids, [0, 0, 1, 1, 2, 2])  # two patches per whole image
    assert np.array_equal(nuclei.test_meta["subject"], [0, 0])


def test_a_learning_curve_stars_the_model_its_run_kept_and_names_its_units(tmp_path, monkeypatch):
    """With model selection a run reports the kept epoch's score, not the last: the plot stars that point,
    so the curve's end and the table's number no longer disagree without a word."""
    from fedistill import plots

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or Path(path))
    rows = [{"round": r, "test_accuracy": [0.5, 0.9, 0.7][r - 1]} for r in (1, 2, 3)]
    plots.plot_learning_curves(
        {"fediod": rows}, tmp_path / "c.png", metrics=("test_accuracy",), selected={"fediod": 2}
    )
    (ax,) = figures[0].axes
    star = [line for line in ax.get_lines() if line.get_marker() == "*"]
    assert len(star) == 1 and list(star[0].get_xdata()) == [2.0] and list(star[0].get_ydata()) == [0.9]
    assert "fediod kept (round 2)" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert ax.get_ylabel() == "test accuracy (fraction, 1 = perfect)"
    assert plots.axis_label("test_psnr") == "test psnr (dB)" and plots.axis_label("loss") == "loss"
    plots.plot_learning_curves({"fedavg": rows}, tmp_path / "d.png", metrics=("test_accuracy",))
    assert not [line for line in figures[1].axes[0].get_lines() if line.get_marker() == "*"]


def test_a_partition_that_cuts_slices_warns_that_a_volumes_slices_are_spread_over_sites(caplog):
    """Slices of brain volumes (the semi-synthetic lesions' subjects) under the default partition: one
    warning names the subjects and `--partition natural`, which gives each site whole subjects, silently."""
    from conftest import SHARED_DATA
    from fedistill.config import RunConfig, build_config
    from fedistill.engine.setup import prepare_data

    if not (SHARED_DATA / "brain-mri" / "mni152_2009a_t1.nii.gz").is_file():
        pytest.skip(f"the MNI152 brain is not under {SHARED_DATA}")
    keys = {
        "dataset": "mni152-synthetic-lesions",
        "data_dir": str(SHARED_DATA),
        "mni152-synthetic-lesions": {"image_size": 32, "train_subjects": 8, "test_subjects": 2},
        "clients": 2,
    }
    config = build_config(RunConfig(), keys)
    assert config.partition == "dirichlet"
    with caplog.at_level(logging.WARNING, logger="fedistill"):
        prepare_data(config)
    spread = [r.getMessage() for r in caplog.records if "spread" in r.getMessage()]
    assert len(spread) == 1, spread
    assert "mni152-synthetic-lesions: the slices of one subject" in spread[0]
    assert 'partition = "natural"' in spread[0] and "whole subjects" in spread[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedistill"):
        prepare_data(config.replace(partition="natural"))
    assert not [r for r in caplog.records if "spread" in r.getMessage()]
