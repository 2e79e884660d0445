"""FedIOD's segmentation tables and figures (fedistill.reproduce.segmentation_*, driven by
benchmarks/segmentation_tables.py and segmentation_figures.py): the runs they plan hold the shared protocol
(same model, same local epochs per site, same G budget for FedIOD and AsynDGAN) and parse as the CLI parses
them; the tables they write label every measured number semi-synthetic and keep the paper's numbers apart;
and, at a tiny size (slow), both scripts run end to end on the semi-synthetic sets."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import SHARED_DATA
from fedistill import cli
from fedistill.algorithms.registry import get_algorithm
from fedistill.config import options_for
from fedistill.engine import setup as runner
from fedistill.reproduce import (
    segmentation_figures,
    segmentation_plan,
    segmentation_report,
    segmentation_scores,
    segmentation_tables,
)

SHARED = SHARED_DATA  # FEDISTILL_SHARED_DATA, else shared/data beside the repository


@pytest.fixture(scope="module")
def tables() -> SimpleNamespace:
    """The tables' plan, report and entry point under one name."""
    return SimpleNamespace(
        parse=segmentation_plan.parse,
        tables=segmentation_plan.tables,
        plan=segmentation_plan.plan,
        METHODS=segmentation_plan.METHODS,
        INSTANCE_METRICS=segmentation_report.INSTANCE_METRICS,
        write=segmentation_report.write,
        main=segmentation_tables.main,
    )


def _config(table, spec):
    """The RunConfig `fedistill run` builds from the argv run_fedistill passes for `spec`."""
    argv = ["run", "--algorithm", spec.algorithm, "--dataset", table.dataset, "--data-dir", "data",
            "--clients", str(table.clients), "--alpha", "1", "--model", "unet", "--rounds", str(spec.rounds),
            *spec.extra, "--seed", "0", *[x for s in spec.sets for x in ("--set", s)]]  # fmt: skip
    config = cli.config_from_args(cli.build_parser().parse_args(argv))
    runner.check_sections(config)
    return config, options_for(config, spec.algorithm, get_algorithm(spec.algorithm).options)


def test_every_method_gets_the_same_model_and_local_epochs(tables):
    args = tables.parse([])
    for table in tables.tables(args):
        specs = {s.method: s for s in tables.plan(table, args, train_samples=330)}
        expected = {*tables.METHODS} - (set(segmentation_plan.TABLE2_ONLY) if table.number == 4 else set())
        assert set(specs) == expected
        built = {m: _config(table, s) for m, s in specs.items()}
        for method, (config, options) in built.items():
            assert (config.model, config.options["model_options"]) == ("unet", {"width": 8, "depth": 4})
            assert (config.partition, config.threads, config.optimizer) == ("natural", 1, "adam")
            assert config.options[table.dataset] == table.dataset_options
            if method in ("standalone", "centralized", "fedavg"):
                assert config.rounds * config.local_epochs == table.epochs
            elif method.startswith("fediod"):
                assert options.teacher_epochs == table.epochs
        fediod, asyndgan = built["fediod"][1], built["asyndgan"][1]
        for key in ("generator_width", "generator_blocks", "discriminator_width", "discriminator_layers",
                    "synthetic_batch_size", "iters_per_epoch"):  # fmt: skip
            assert getattr(fediod, key) == getattr(asyndgan, key), key
        assert built["fediod"][0].rounds == built["asyndgan"][0].rounds == table.distill_epochs
        # AsynDGAN's server-side S: as many epochs of synthetic pairs as a site's model gets of real ones
        assert asyndgan.segmenter_steps * args.batch_size >= table.epochs / table.distill_epochs * 330
        if table.number == 2:
            prior, margin, sampled, lean = (built[m][1] for m in segmentation_plan.TABLE2_ONLY)
            assert (lean.pixel_logits, lean.student_steps, lean.pool_generator_batch) == ("margin", 0, True)
            assert (lean.iters_per_epoch, lean.pool_steps) == (20, 5)
            assert (fediod.mask_source, prior.mask_source) == ("clients", "prior")
            logits = (fediod.pixel_logits, margin.pixel_logits, sampled.pixel_logits)
            assert logits == ("all", "margin", "margin")
            assert (fediod.sites_per_step, margin.sites_per_step, sampled.sites_per_step) == (0, 0, 3)
        # the default row leaves the preset and the S-steps to the library: only the paper's row sets them
        paper_only = {"fediod.preset='paper'", f"fediod.student_steps={args.student_steps}"}
        assert set(specs["fediod"].sets) - set(specs["fediod-default"].sets) == paper_only
        assert set(specs["fediod-default"].sets) < set(specs["fediod"].sets)
        assert built["fediod-default"][1].preset == "auto"
        assert len({s.name for s in specs.values()}) == len(specs)  # one run folder per method


def test_run_names_change_with_any_setting(tables):
    args = tables.parse([])
    (table,) = tables.tables(tables.parse(["--tables", "2"]))
    names = {s.method: s.name for s in tables.plan(table, args, 330)}
    other = tables.parse(["--tables", "2", "--t2-rounds", "10"])
    changed = {s.method: s.name for s in tables.plan(tables.tables(other)[0], other, 330)}
    assert changed["fedavg"] != names["fedavg"]  # --reuse must not keep a run of other settings
    assert changed["fediod"] == names["fediod"]  # ... and keeps the runs the change does not touch


@pytest.mark.parametrize(
    "argv",
    [
        ["--methods", "fedprox"],
        ["--tables", "3"],
        ["--t2-epochs", "15", "--t2-rounds", "10"],
        ["--sampled-sites", "11"],
        ["--lean-iters", "0"],
    ],
    ids=[
        "unknown-method",
        "unknown-table",
        "epochs-not-whole-rounds",
        "more-sampled-sites-than-sites",
        "no-lean-g-steps",
    ],
)
def test_bad_arguments_stop_with_a_usage_error(tables, argv, capsys):
    with pytest.raises(SystemExit) as stop:
        tables.parse(argv)
    assert stop.value.code == 2
    assert "error" in capsys.readouterr().err


def _fake_row(method: str, sites: int, keys: dict[str, float]) -> dict:
    return {"method": method, "run": f"runs/{method}", "sites": [dict(keys) for _ in range(sites)],
            "trained_on": [], "wall_s": 12.0, "cpu_s": 10.0, "rounds_s": 8.0, "up_bytes": 2e6,
            "label_bytes": 1e5 if method in ("asyndgan", "fediod") else 0, "matches_run_summary": True,
            "ensemble_dice": 0.8, "teacher_mean_dice": 0.5, "fraction_of_ensemble": 0.9,
            "selected_epoch": 3, "machine": "Some CPU, 2 CPUs, AVX512 kernels"}  # fmt: skip


def test_records_name_no_folder_of_the_machine(tables, tmp_path):
    """The recorded command leaves out the folders it read and wrote (both spellings), and a run outside
    the checkout is named under OUT, so a record carries no machine path."""
    from fedistill.reproduce.paths import display_path

    argv = ["--tables", "4", "--out", str(tmp_path / "runs"), f"--results={tmp_path}", "--data-dir",
            str(tmp_path), "--t4-iters", "10", "--set", "fediod.sites_per_step=2"]  # fmt: skip
    args = tables.parse(argv)
    assert segmentation_report.command(args) == (
        "python benchmarks/segmentation_tables.py --tables 4 --t4-iters 10 --set fediod.sites_per_step=2"
    )
    assert display_path(tmp_path / "runs" / "seg4-x" / "fediod") == "OUT/seg4-x/fediod"


def test_table2_labels_every_measured_number_and_keeps_the_papers_apart(tables, tmp_path):
    args = tables.parse(["--tables", "2", "--results", str(tmp_path)])
    (table,) = tables.tables(args)
    metrics = {"dice": 0.7, "sensitivity": 0.8, "specificity": 0.99, "hd95": 5.0}
    metrics |= {f"real_{m}_patient{p}": 0.1 for m in ("dice", "hd95") for p in (1, 2)}
    rows = {m: _fake_row(m, 10 if m == "standalone" else 1, metrics) for m in table.methods}
    rows["fediod"]["machine"] = "Another CPU, 2 CPUs, AVX2 kernels"  # a row from another machine: both named
    text = tables.write(table, rows, args).read_text()
    assert "Machine: Some CPU, 2 CPUs, AVX512 kernels; Another CPU, 2 CPUs, AVX2 kernels." in text
    measured = [line for line in text.splitlines() if line.startswith("| ") and "(semi-synthetic)" in line]
    assert len(measured) == len(tables.METHODS)
    assert "| Standalone (semi-synthetic) | 70.00 ± 0.00 |" in text
    assert "Not comparable" in text and "| FedIOD (paper, BraTS 2018) | 75.38 |" in text
    assert "domain" in text and "uploads: +0.00 Dice points" in text
    sampled = "| 3 sites per G-step (`sites_per_step`), one logit per pixel | 70.00 | 5.00 | 2.0 | 1.00 |"
    assert sampled in text
    record = json.loads((tmp_path / "segmentation_table2.json").read_text())
    assert record["data"] == "semi-synthetic" and "not comparable" in record["paper_note"]
    assert record["command"].startswith("python benchmarks/segmentation_tables.py --tables 2")
    assert record["rows"]["fediod"]["sites"][0]["dice"] == 0.7


def test_merge_adds_rows_to_a_record_of_the_same_settings_only(tables, tmp_path):
    from fedistill.errors import ConfigError

    metrics = {"dice": 0.7, "sensitivity": 0.8, "specificity": 0.99, "hd95": 5.0}
    metrics |= {f"real_{m}_patient{p}": 0.1 for m in ("dice", "hd95") for p in (1, 2)}
    first = tables.parse(["--tables", "2", "--methods", "fedavg,fediod", "--results", str(tmp_path)])
    (table,) = tables.tables(first)
    tables.write(table, {m: _fake_row(m, 1, metrics) for m in table.methods}, first)
    path = tmp_path / "segmentation_table2.json"  # a record of the older form: one command, a folder in it
    old = json.loads(path.read_text())
    old["command"] += " --out /machine/runs"
    old["rows"]["fedavg"]["run"] = "/machine/runs/seg2-x/fedavg"
    path.write_text(json.dumps({k: v for k, v in old.items() if k != "commands"}))

    added = tables.parse(
        ["--tables", "2", "--methods", "fediod-default", "--merge", "--results", str(tmp_path)]
    )
    (table,) = tables.tables(added)
    text = tables.write(table, {"fediod-default": _fake_row("fediod-default", 1, metrics)}, added, merge=True)
    record = json.loads((tmp_path / "segmentation_table2.json").read_text())
    assert list(record["rows"]) == ["fedavg", "fediod", "fediod-default"]  # in the table's order
    assert record["settings"]["methods"] == list(record["rows"])
    assert record["rows"]["fedavg"]["run"] == "OUT/seg2-x/fedavg"  # no machine folder carried over
    assert [c.split("--methods ")[1].split()[0] for c in record["commands"]] == [
        "fedavg,fediod",
        "fediod-default",
    ]
    assert (
        "Commands: `python benchmarks/segmentation_tables.py --tables 2 --methods fedavg,fediod`; then"
        in (text.read_text())
    )
    assert "| FedIOD, default settings (semi-synthetic) | 70.00 |" in text.read_text()

    other = tables.parse(["--tables", "2", "--methods", "fediod-default", "--merge", "--t2-iters", "5",
                          "--results", str(tmp_path)])  # fmt: skip
    with pytest.raises(ConfigError, match=r"other settings \(iters\).*run the whole table"):
        tables.write(tables.tables(other)[0], {}, other, merge=True)
    # the real patients scored on the other scale: their columns would not compare
    scale = tables.parse(["--tables", "2", "--methods", "fediod-default", "--merge", "--real-intensity",
                          "percentile", "--results", str(tmp_path)])  # fmt: skip
    with pytest.raises(ConfigError, match=r"other settings \(real_intensity\)"):
        tables.write(tables.tables(scale)[0], {}, scale, merge=True)
    with pytest.raises(ConfigError, match="no record"):
        segmentation_report.earlier_record(table, tables.parse(["--results", str(tmp_path / "none")]))


def test_merge_without_a_record_stops_with_one_line_before_any_run(tables, tmp_path, capsys):
    argv = ["--tables", "2", "--methods", "fedavg", "--merge", "--results", str(tmp_path / "none")]
    assert tables.main(argv) == 2
    err = capsys.readouterr().err
    assert "error: --merge: no record" in err and "Traceback" not in err
    assert not (tmp_path / "none").exists()


def test_table4_rows_per_test_site_and_table8_per_trained_site(tables, tmp_path):
    if not (SHARED / "nuclei" / "fluorescence_instances.tif").is_file():
        pytest.skip("the shared nuclei image is not on this machine")
    args = tables.parse(["--tables", "4", "--results", str(tmp_path), "--data-dir", str(SHARED)])
    (table,) = tables.tables(args)
    sites = ("synthetic-fluorescence", "synthetic-he-sparse-large", "synthetic-he-dense-small")
    metrics = {f"{m}_{s}": 0.5 for m in tables.INSTANCE_METRICS for s in sites} | {"dice": 0.5}
    rows = {m: _fake_row(m, 3 if m == "standalone" else 1, metrics) for m in table.methods}
    rows["standalone"]["trained_on"] = list(sites)
    text = tables.write(table, rows, args).read_text()
    assert text.count("| **FedIOD** | average | 50.00 | 50.00 | 50.00 | 0.50 |") == 1
    averages = [line.split(" | ")[0][4:-2] for line in text.splitlines() if " | average | " in line]
    trained = {segmentation_plan.LABELS[m] for m in table.methods if m != "standalone"}
    assert trained <= set(averages)  # every trained method's row, the recalibrated FedAvg's too
    assert (
        sum(line.startswith(f"| {sites[0]} | ") for line in text.splitlines()) == 3
    )  # Table 8: one per test site
    assert "| FedIOD (paper) | TNBC | 75.01 |" in text and "no row here stands for Cell17" in text


@pytest.mark.slow
def test_tables_and_figures_end_to_end_at_a_tiny_size(tables, tmp_path):
    if not (SHARED / "brain-mri" / "lesion_brain1_image.nii.gz").is_file():
        pytest.skip("the shared brain and nuclei images are not on this machine")
    tiny = ["--out", str(tmp_path / "runs"), "--results", str(tmp_path), "--data-dir", str(SHARED),
            "--t2-clients", "2", "--t2-image-size", "32", "--t2-subjects", "4,2", "--t2-epochs", "1",
            "--t2-rounds", "1", "--t2-distill-epochs", "1", "--t2-iters", "1", "--t4-image-size", "64",
            "--t4-patch-size", "32", "--t4-images", "4,1", "--t4-epochs", "1", "--t4-rounds", "1",
            "--t4-distill-epochs", "1", "--t4-iters", "1", "--width", "4", "--depth", "2", "--g-width", "4",
            "--g-blocks", "1", "--d-width", "4", "--d-layers", "1", "--synthetic-batch", "3",
            "--sampled-sites", "1"]  # fmt: skip
    assert tables.main(tiny) == 0
    for n in (2, 4):
        record = json.loads((tmp_path / f"segmentation_table{n}.json").read_text())
        assert all(r["matches_run_summary"] for r in record["rows"].values())
        assert all(r["cpu_s"] > 0 for r in record["rows"].values())
    assert tables.main([*tiny, "--reuse"]) == 0  # scored again from the saved models, nothing rerun
    figures = ["--results", str(tmp_path), "--runs", str(tmp_path / "runs"), "--data-dir", str(SHARED)]
    assert segmentation_figures.main([*figures, "--slices", "2"]) == 0
    for name in ("figure5", "figure6", "figure3_nuclei", "figure6_nuclei"):
        assert (tmp_path / f"segmentation_{name}.png").stat().st_size > 0


def test_a_records_run_outside_the_repository_is_found_under_the_tables_out_folder(tmp_path):
    from fedistill.reproduce.paths import CHECKOUT, display_path, recorded_path

    run = recorded_path("OUT/seg2-x-fediod-1234/fediod", tmp_path)
    assert run == tmp_path / "seg2-x-fediod-1234" / "fediod"
    assert display_path(run) == "OUT/seg2-x-fediod-1234/fediod"  # the inverse of what records write
    assert recorded_path("runs/seg2/fediod", tmp_path) == CHECKOUT / "runs/seg2/fediod"


def test_figures_name_the_missing_runs_and_the_option_that_finds_them(tmp_path):
    record = {"rows": {"fediod": {"run": "OUT/seg2-x-fediod-1234/fediod"}}}
    (tmp_path / "segmentation_table2.json").write_text(json.dumps(record))
    with pytest.raises(
        SystemExit, match=r"seg2-x-fediod-1234.*pass the segmentation tables' --out as --runs"
    ):
        segmentation_figures.main(["--results", str(tmp_path), "--runs", str(tmp_path / "elsewhere")])


@pytest.mark.parametrize("flag", ["--t2-subjects", "--t4-images"])
@pytest.mark.parametrize("value", ["4", "40,x", "4,2,1"])
def test_a_split_that_is_not_two_counts_is_a_one_line_usage_error(flag, value, capsys):
    with pytest.raises(SystemExit):
        segmentation_plan.parse([flag, value])
    error = capsys.readouterr().err
    assert flag in error and repr(value) in error and "TRAIN,TEST" in error


def test_the_median_site_does_not_depend_on_how_the_cpu_orders_equal_dice(monkeypatch):
    """NumPy's default sort hands equal keys back in an order that follows the CPU's vector instructions;
    two sites with the same Dice must still give the same median site, on every machine and in both
    figures that pick it."""
    real = np.argsort

    def ties_reversed(keys, *args, kind=None, **kwargs):
        order = real(keys, *args, kind="stable", **kwargs)
        if kind == "stable":
            return order
        keys = np.asarray(keys)[order]
        groups = np.split(order, np.flatnonzero(np.diff(keys)) + 1)  # runs of equal keys, each reversed
        return np.concatenate([g[::-1] for g in groups])

    monkeypatch.setattr(segmentation_scores.np, "argsort", ties_reversed)
    assert segmentation_scores.median_site([0.5, 0.7, 0.7, 0.9]) == 2  # sorted: sites 0, 1, 2, 3
    assert segmentation_scores.median_site([0.8, 0.8, 0.8]) == 1
    assert segmentation_scores.median_site([0.6]) == 0


def test_figures_of_a_table_with_no_run_stop_with_one_line(tmp_path):
    """A table whose runs all failed records no row: the figures say so, not a bare StopIteration."""
    (tmp_path / "segmentation_table2.json").write_text(json.dumps({"rows": {}}))
    with pytest.raises(SystemExit, match=r"segmentation_table2\.json names no run"):
        segmentation_figures.main(["--results", str(tmp_path), "--runs", str(tmp_path)])


def test_figures_name_a_run_that_saved_no_model(tmp_path):
    """A run that stopped before it exported its model has a config but no models/: the figure names the
    file it needs instead of ending in safetensors' error."""
    from fedistill.config import RunConfig, build_config
    from fedistill.reproduce.segmentation_scores import saved_models

    config = build_config(RunConfig(), {"algorithm": "fediod", "dataset": "digits", "model": "small-cnn"})
    with pytest.raises(SystemExit, match=r"models/student\.safetensors.*did the run finish"):
        saved_models(tmp_path / "fediod", "fediod", config, None)


def test_a_model_with_a_validation_chosen_threshold_is_scored_at_it(tables, tmp_path):
    """A run with `task.decision_threshold = "validation"` scores its final test Dice at the threshold its
    sites' validation counts chose; the tables scored its saved model at argmax and called them different."""
    if not (SHARED / "brain-mri" / "lesion_brain1_image.nii.gz").is_file():
        pytest.skip("the shared brain images are not on this machine")
    tiny = ["--tables", "2", "--methods", "fedavg", "--out", str(tmp_path / "runs"),
            "--results", str(tmp_path), "--data-dir", str(SHARED), "--sampled-sites", "1",
            "--t2-clients", "2", "--t2-image-size", "32", "--t2-subjects", "8,2",
            "--t2-epochs", "2", "--t2-rounds", "2", "--width", "4", "--depth", "2",
            "--set", "task.decision_threshold='validation'"]  # fmt: skip
    assert tables.main(tiny) == 0
    row = json.loads((tmp_path / "segmentation_table2.json").read_text())["rows"]["fedavg"]
    run = next((tmp_path / "runs").glob("*/fedavg"))
    assert json.loads((run / "summary.json").read_text())["final"]["decision_threshold"] != 0.5
    assert row["matches_run_summary"]
