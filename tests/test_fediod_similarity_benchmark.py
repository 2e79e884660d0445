"""A fast check of the FedIOD similarity study (the paper's Figure 4; fedistill.reproduce.fediod_similarity,
driven by benchmarks/fediod_similarity.py) on a tiny FedIOD run on the embedded 8x8 digits: the run's
private sets are rebuilt whole, the report has one finite entry per client with its DLG row, and copies of
private images count as memorised."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from algorithm_helpers import TINY_FEDIOD
from fedistill.analysis.similarity import similarity_to_private
from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import run_suite
from fedistill.reproduce import fediod_similarity, similarity_study


@pytest.fixture(scope="module")
def bench() -> SimpleNamespace:
    """The study's entry point and its measurements under one name."""
    return SimpleNamespace(
        main=fediod_similarity.main,
        load_run=similarity_study.load_run,
        sample_synthetic=similarity_study.sample_synthetic,
        reference_for=similarity_study.reference_for,
    )


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    layer = copy.deepcopy(TINY_FEDIOD)
    layer["fediod"].update(teacher_epochs=1, iters_per_epoch=1)  # only its files are needed, not a good G
    config = build_config(RunConfig(), layer, {"algorithm": "fediod", "rounds": 1})
    out = tmp_path_factory.mktemp("suite")
    run_suite(config, out, progress=False)
    return out / "fediod"


def _finite(report: dict, skip: tuple[str, ...] = ()) -> bool:
    return all(math.isfinite(v) for k, v in report.items() if k not in skip)


def test_report_has_one_finite_entry_per_client_with_its_dlg_row(bench, tiny_run, tmp_path) -> None:
    argv = ["--run", str(tiny_run), "--synthetic", "64", "--dlg-images", "1", "--dlg-iterations", "5",
            "--feature-epochs", "1", "--out", str(tmp_path)]  # fmt: skip
    assert bench.main(argv) == 0
    data = json.loads((tmp_path / "fediod_similarity_digits.json").read_text())
    (entry,) = data["runs"]
    assert entry["synthetic"] == entry["held_out"] == 64
    assert [r["client"] for r in entry["results"]] == [0, 1, 2]
    for row in entry["results"]:
        assert row["fediod"]["synthetic"] == 64 and _finite(row["fediod"])
        dlg = row["dlg"]
        assert dlg["images"] == 1 and math.isfinite(dlg["psnr_mean"])
        assert dlg["gradient_check_max"] < 1e-5  # the captured update is exactly lr x the image's gradient
        # one reconstruction: FID is undefined (written as null), everything else is a number
        similarity = dlg["similarity"]
        assert similarity["fid"] is None and similarity["fid_held_out_same_n"] is None
        assert similarity["memorised_pixel"] in (0.0, 1.0)
        assert _finite(similarity, skip=("fid", "fid_held_out_same_n"))
    text = (tmp_path / "fediod_similarity_digits.md").read_text()
    assert "not comparable to the Inception-based FIDs" in text and "DLG" in text
    assert (tmp_path / "fediod_similarity_digits.png").stat().st_size > 0


def test_private_sets_are_every_training_image_a_client_holds(bench, tiny_run) -> None:
    run = bench.load_run(tiny_run, "data")
    sizes = [len(run.private(k)) for k in range(run.config.clients)]
    split = run.data.split
    assert sizes == [len(t) + len(v) for t, v in zip(split.client_train, split.client_val, strict=True)]
    assert sum(sizes) == len(run.data.dataset.train)  # train shards and local validation shards cover it
    synthetic = bench.sample_synthetic(run, 20, "batch")
    assert synthetic.shape == (20, 1, 8, 8) and 0 <= float(synthetic.min()) <= float(synthetic.max()) <= 1
    assert bench.sample_synthetic(run, 20, "batch").equal(synthetic)  # seeded by the run


def test_copies_of_private_images_are_memorised(bench, tiny_run) -> None:
    run = bench.load_run(tiny_run, "data")
    reference = bench.reference_for(run.data.dataset.test, run.info, 1, 0)
    private = run.private(0)
    report = similarity_to_private(private, private, reference.held_out, reference.features)
    assert report.pixel_nn_mean_synthetic == 0.0
    assert report.memorised_pixel == report.memorised_feature == 1.0
    assert report.memorised_pixel_held_out <= 0.05 + 1e-9


def test_a_run_whose_data_is_not_under_data_dir_is_named_in_one_line(bench, tiny_run, tmp_path) -> None:
    """A run of one's own (an image folder) read with the default --data-dir, or a wrong one: the study
    stops with the run, the dataset's own one-line error and the option to fix, not a traceback."""
    import shutil

    run = tmp_path / "own" / "fediod"
    shutil.copytree(tiny_run, run)
    config = (run / "config.toml").read_text()
    (run / "config.toml").write_text(config.replace('dataset = "digits"', 'dataset = "image-folder"'))
    with pytest.raises(SystemExit) as stop:
        bench.load_run(run, str(tmp_path / "nowhere"))
    message = str(stop.value.code)
    assert "\n" not in message and message.startswith(f"{run}: image-folder:")
    assert message.endswith("check --data-dir (the folder the run read its data from)")


def test_an_exact_dlg_reconstruction_is_null_and_counted_and_the_report_says_so(
    bench, tiny_run, tmp_path, monkeypatch
) -> None:
    """An exact reconstruction has an infinite PSNR: its mean reached the JSON only as a bare null (no
    count, as privacy_attacks.json keeps in psnr_infinite) and the report printed `inf dB`."""
    import dataclasses

    real = similarity_study.merge

    def exact(scores):
        merged = real(scores)
        return dataclasses.replace(merged, psnr=[math.inf] * len(merged.psnr))

    monkeypatch.setattr(similarity_study, "merge", exact)
    argv = ["--run", str(tiny_run), "--synthetic", "64", "--dlg-images", "1", "--dlg-iterations", "2",
            "--feature-epochs", "1", "--clients", "0", "--out", str(tmp_path)]  # fmt: skip
    assert bench.main(argv) == 0

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    data = json.loads((tmp_path / "fediod_similarity_digits.json").read_text(), parse_constant=refuse)
    (row,) = data["runs"][0]["results"]
    dlg = row["dlg"]
    assert dlg["psnr"] == [None] and dlg["psnr_mean"] is None and dlg["psnr_infinite"] == 1
    assert dlg["idlg_psnr_mean"] is None and dlg["idlg_psnr_infinite"] == 1
    text = (tmp_path / "fediod_similarity_digits.md").read_text()
    assert "inf dB" not in text and "| 0 | 1 | ∞ |" in text
    assert "PSNR ∞ (1 of 1 images reconstructed exactly)" in text
