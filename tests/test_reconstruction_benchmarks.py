"""The MRI reconstruction benchmarks (FedIOD's Table 9 and Figure 7) and the paper-scale configs.

Every config under configs/reconstruction/ must parse as `fedistill run --config` parses it, hold the
paper's protocol (three sources as sites, 4x, Adam 1e-4 for 20 local epochs, FedIOD's 100 distillation
epochs at 1e-4) and carry its paper values in configs/expected.toml equal to those of its comment header.
The table and the figure (fedistill.reproduce.reconstruction_*, driven by benchmarks/reconstruction_table.py
and reconstruction_figures.py) run end to end on the no-files `mni152-t1` stand-in at a tiny size, each
method its own `fedistill run` as the table launches it (here in this process), and write their table and
figure."""

import json
import re
import subprocess
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedistill import cli
from fedistill.algorithms.registry import get_algorithm
from fedistill.config import RunConfig, build_config, load_toml, options_for
from fedistill.engine import setup as runner
from fedistill.machine import describe, machine
from fedistill.reproduce import launch, reconstruction_figures, reconstruction_plan, reconstruction_report
from fedistill.reproduce.paths import recorded_path
from fedistill.reproduce.reconstruction_scores import Harness

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
RECONSTRUCTION = sorted((CONFIGS / "reconstruction").glob("*.toml"))
CELL = re.compile(r"(BraTS2020|fastMRI|IXI) ([\d.]+) / ([\d.]+) dB")
SOURCE_KEYS = {"BraTS2020": "brats", "fastMRI": "fastmri", "IXI": "ixi"}
TINY = [
    "--dataset", "mni152-t1", "--image-size", "16", "--chans", "2", "--pools", "2", "--epochs", "1",
    "--batch-size", "16", "--fediod-epochs", "1", "--iters", "1", "--set", "fediod.discriminator_layers=2",
]  # fmt: skip


#: The table's plan and entry point under one name.
TABLE = SimpleNamespace(
    parse_args=reconstruction_plan.parse_args,
    run_specs=reconstruction_plan.run_specs,
    common_sets=reconstruction_plan.common_sets,
    command_line=reconstruction_plan.command_line,
    read_paper=reconstruction_plan.read_paper,
    main=reconstruction_report.main,
)


def test_every_table9_cell_has_a_config():
    names = {p.name for p in RECONSTRUCTION}
    for contrast in ("t1", "t2"):
        assert {f"{contrast}-fedavg.toml", f"{contrast}-fediod.toml"} <= names
        assert {f"{contrast}-flmrcm-target-{s}.toml" for s in ("brats", "fastmri", "ixi")} <= names
    assert len(RECONSTRUCTION) == 10


@pytest.mark.parametrize("path", RECONSTRUCTION, ids=lambda p: p.stem)
def test_a_config_parses_holds_the_protocol_and_has_its_paper_values(path):
    config = build_config(RunConfig(), load_toml(path))  # what `fedistill run --config` builds
    runner.check_sections(config)
    (name,) = config.algorithms
    options = options_for(config, name, get_algorithm(name).options)
    contrast, method = path.stem.split("-")[:2]
    assert (name, config.dataset, config.options["mri-cross-site"]["contrast"]) == (
        method,
        "mri-cross-site",
        contrast,
    )
    assert (config.clients, config.partition, config.model, config.optimizer, config.lr) == (
        3, "natural", "unet-fastmri", "adam", 1e-4
    )  # fmt: skip
    assert config.options["task"]["acceleration"] == 4.0
    if name == "fediod":  # 20 local epochs, then 100 distillation epochs at a constant 1e-4
        assert (options.teacher_epochs, config.rounds, options.schedule) == (20, 100, "constant")
        assert options.lr_generator == options.lr_discriminator == options.lr_student == 1e-4
    else:  # the same 20 local epochs per site
        assert (config.rounds, config.local_epochs, config.local_steps) == (20, 1, 0)
    if name == "flmrcm":
        sources = config.options["mri-cross-site"]["sources"]
        assert sources[options.target_site] == path.stem.rpartition("-")[2]

    entry = tomllib.loads((CONFIGS / "expected.toml").read_text(encoding="utf-8"))[
        f"reconstruction/{path.name}"
    ]
    header = CELL.findall(path.read_text(encoding="utf-8").split("\n", 2)[1])
    assert header, "the comment header states the paper's SSIM / PSNR"
    stated = {
        f"paper_{m}_{SOURCE_KEYS[s]}": float(v)
        for s, ssim, psnr in header
        for m, v in (("ssim", ssim), ("psnr", psnr))
    }
    assert stated == {k: v for k, v in entry.items() if k.startswith("paper_")}
    assert (entry["tolerance_ssim"], entry["tolerance_psnr"]) == (0.01, 1.0)
    assert not any(k.startswith("ours_") for k in entry)  # nothing measured at paper scale yet


def test_table_arguments_are_checked_and_every_method_gets_the_same_local_budget():
    table = TABLE
    for bad in (
        ["--methods", "fedavg,fedprox"],
        ["--image-size", "40"],
        ["--flmrcm-targets", "4"],
        ["--epochs", "0"],
    ):
        with pytest.raises(SystemExit):
            table.parse_args(bad)
    args = table.parse_args(
        ["--epochs", "7", "--fediod-epochs", "3", "--iters", "2", "--flmrcm-targets", "1,3"]
    )
    specs = table.run_specs(args)
    assert [s.method for s in specs] == [
        "standalone", "centralized", "fedavg", "flmrcm", "flmrcm", "fediod", "fediod",
    ]  # fmt: skip
    # FedIOD twice: its default (the lean preset on per-pixel tasks) and the paper's exchanges
    assert [s.row for s in specs[-2:]] == ["fediod", "fediod-paper"]
    assert not any("preset" in x or "student_steps" in x for x in specs[-2].sets)
    assert {"fediod.preset='paper'", "fediod.student_steps=2"} <= set(specs[-1].sets)
    assert [s.target for s in specs if s.method == "flmrcm"] == [1, 3]
    for spec in specs:  # every site trains 7 local epochs, whatever the method
        assert spec.extra[spec.extra.index("--local-epochs") + 1] == "1"
        assert spec.rounds == (3 if spec.method == "fediod" else 7)
    for spec in specs[-2:]:
        assert "fediod.teacher_epochs=7" in spec.sets and "fediod.iters_per_epoch=2" in spec.sets
    assert "threads=1" in table.common_sets(args)  # one torch thread unless told
    assert table.command_line(args).startswith(
        "python benchmarks/reconstruction_table.py --dataset brain-t1-sites"
    )
    assert set(table.read_paper()) == {"fedavg", "flmrcm", "fediod"}
    assert table.read_paper()["flmrcm"]["ssim"] == {"brats": 0.9577, "fastmri": 0.9023, "ixi": 0.9362}


def test_run_names_carry_the_set_items_so_reuse_never_mixes_settings():
    """Without `--set` the names stay as they were (finished runs are reused); any `--set` adds a digest of
    the items, the same in any order, so `--reuse` cannot hand back a run made with other settings."""
    plain = {s.name for s in TABLE.run_specs(TABLE.parse_args([]))}
    assert "brain-t1-sites-64px-c16-e20-lr0.001-seed0-fedavg" in plain
    one = TABLE.parse_args(["--set", "augment='on'", "--set", "fediod.w_bn=1"])
    other = TABLE.parse_args(["--set", "fediod.w_bn=1", "--set", "augment='on'"])
    third = TABLE.parse_args(["--set", "augment='off'"])
    names = [{s.name for s in TABLE.run_specs(a)} for a in (one, other, third)]
    assert names[0] == names[1] and not names[0] & plain and not names[0] & names[2]


@pytest.fixture(scope="module")
def tiny_table(tmp_path_factory):
    """The table on 16 px slices of `mni152-t1`, every method, each `fedistill run` in this process."""
    table = TABLE
    tmp = tmp_path_factory.mktemp("reconstruction")

    def in_process(command, check):
        assert command[1:4] == ["-m", "fedistill.cli", "run"]
        code = cli.main(command[3:])
        if check and code:
            raise subprocess.CalledProcessError(code, command)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launch.subprocess, "run", in_process)
        table.main([*TINY, "--out", str(tmp / "runs"), "--results", str(tmp / "results")])
    return tmp


def test_table_writes_every_method_per_source_with_the_paper_and_the_ledger(tiny_table):
    payload = json.loads((tiny_table / "results" / "reconstruction_table9.json").read_text())
    sites = payload["sites"]
    assert sites == ["reference", "bias-field-noisy", "low-resolution", "contrast-shift"]
    methods = [r["method"] for r in payload["rows"]]
    assert methods == [
        "zero-filled", "standalone", "standalone-own", *["standalone-site"] * 4, "centralized", "fedavg",
        "flmrcm", *["flmrcm-target"] * 4, "fediod", "fediod-paper",
    ]  # fmt: skip
    for row in payload["rows"]:
        assert set(row["ssim"]) == set(row["psnr"]) == set(sites)
        assert all(0 < v < 1 for v in row["ssim"].values())
        assert (row["wall_time_s"] is None) == (
            row["method"] in ("zero-filled", "standalone-own", "standalone-site")
        )
    # Standalone as each site deploys it: every source scored by the model of its own site
    own = next(r for r in payload["rows"] if r["method"] == "standalone-own")
    site_models = {r["site"]: r for r in payload["rows"] if r["method"] == "standalone-site"}
    for metric in ("ssim", "psnr"):
        assert own[metric] == {s: site_models[s][metric][s] for s in sites}
    assert payload["facts"]["rescore_max_abs_diff"] < 1e-6  # saved models score as their runs did
    assert payload["facts"]["fediod"]["up_per_kind"].get("parameters", 0) == 0
    # every run's ledger totals; the lean default sends less than the paper's exchanges on the same budget
    moved = {r["method"]: r["all_bytes"] for r in payload["rows"] if "all_bytes" in r}
    assert moved["fedavg"] > 0 and moved["fediod"] < moved["fediod-paper"]
    assert all(r["up_bytes"] <= r["all_bytes"] for r in payload["rows"] if "all_bytes" in r)
    text = (tiny_table / "results" / "reconstruction_table9.md").read_text()
    assert "| FedAvg | " in text and "0.9232" in text and "32.31" in text  # the paper's T1 IXI beside ours
    assert "parameters: 0 B" in text and "Not comparable" in text and "| sites sent MB | all MB |" in text
    assert "--dataset mni152-t1 --image-size 16" in text and str(tiny_table) not in text
    assert f"Machine: {describe(machine())}." in text and payload["facts"]["machine"] == describe(machine())


def test_figure_draws_every_method_from_the_table(tiny_table):
    figures = reconstruction_figures
    table = str(tiny_table / "results" / "reconstruction_table9.json")
    with pytest.raises(SystemExit):
        figures.parse_args(["--table", table, "--error-max", "0"])
    runs = str(tiny_table / "runs")  # the table's --out: it names its runs OUT/<run>/<algorithm>
    assert all(m["run_dir"].startswith("OUT/") for r in json.loads(Path(table).read_text())["rows"]
               for m in r.get("models") or [])  # fmt: skip
    with pytest.raises(SystemExit, match="pass the table's --out as --runs"):
        figures.main(["--table", table, "--results", str(tiny_table / "figures"), "--runs", str(tiny_table)])
    out = figures.main(["--table", table, "--results", str(tiny_table / "figures"), "--runs", runs])
    assert out.name == "reconstruction_figure7.png" and out.stat().st_size > 10_000
    harness = Harness(
        recorded_path(json.loads(Path(table).read_text())["rows"][1]["run_dir"], Path(runs)), ""
    )
    columns = figures.reconstructions(json.loads(Path(table).read_text()), harness, Path(runs))
    titles = [title for title, _ in columns]
    assert titles == [
        "Zero-filled",
        "Standalone (own site)",
        "Centralized",
        "FedAvg",
        "FL-MRCM (target = site)",
        "FedIOD",
    ]


def test_the_figure_reads_the_table_in_its_own_results_folder(tmp_path):
    """`--results X` after the table ran with `--results X`: the figure draws X's table, not the published
    one (which names other runs), unless `--table` says which."""
    (tmp_path / "reconstruction_table9.json").write_text("{}")
    args = reconstruction_figures.parse_args(["--results", str(tmp_path)])
    assert Path(args.table) == tmp_path / "reconstruction_table9.json"
    elsewhere = tmp_path / "other.json"
    elsewhere.write_text("{}")
    args = reconstruction_figures.parse_args(["--results", str(tmp_path), "--table", str(elsewhere)])
    assert Path(args.table) == elsewhere


def test_a_table_that_names_no_model_stops_with_one_line_not_a_traceback(tmp_path):
    """A table whose runs all failed (or ran with no export) has no model to draw: the figure says so and
    which script writes them, instead of ending in a bare StopIteration."""
    table = tmp_path / "reconstruction_table9.json"
    rows = [{"method": "fedavg", "models": []}, {"method": "fediod"}]
    table.write_text(json.dumps({"settings": {"acceleration": 4}, "rows": rows}))
    with pytest.raises(SystemExit, match=r"names no model.*reconstruction_table\.py"):
        reconstruction_figures.main(
            ["--table", str(table), "--results", str(tmp_path), "--runs", str(tmp_path)]
        )


def test_a_method_without_a_model_for_some_site_is_named_when_left_out(capsys):
    """FL-MRCM's row holds one model per target site; if one is missing the whole column cannot be drawn,
    and the figure says which method it left out and for which site instead of dropping it silently."""
    import torch

    harness = SimpleNamespace(
        dataset=SimpleNamespace(test=None, info=None),
        task=SimpleNamespace(
            outputs=lambda *_: torch.zeros(2, 1, 4, 4),
            identity_baseline=lambda: SimpleNamespace(outputs=lambda *_: torch.zeros(2, 1, 4, 4)),
        ),
        site_names=["site-a", "site-b"],
    )
    table = {"rows": [{"method": "flmrcm", "models": [{"site": "site-b", "run_dir": "OUT/x", "file": "g"}]}]}
    columns = reconstruction_figures.reconstructions(table, harness, Path("."))
    assert [title for title, _ in columns] == ["Zero-filled"]
    assert "FL-MRCM (target = site) left out: no model for site-a" in capsys.readouterr().err
