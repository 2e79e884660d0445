"""The real lesion patients' figure: every method's mask on each patient's largest-lesion slices, as
`fedistill predict` makes it, with one Dice per method per slice in the JSON beside the PNG."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
import torch

from conftest import SHARED_DATA
from fedistill.algorithms.shared.training import new_model
from fedistill.config import RunConfig, build_config, write_config
from fedistill.data.base import DatasetInfo
from fedistill.engine.checkpoint import save_model
from fedistill.inference import load_model
from fedistill.inference.segment import segment_volume
from fedistill.reproduce.segmentation_real_figure import (
    find_runs,
    largest_lesion_slices,
    main,
    real_patients_figure,
)

BRAIN_MRI = SHARED_DATA / "brain-mri"
PATIENTS = ("lesion_brain1", "lesion_brain2")
INFO = DatasetInfo("mni152-synthetic-lesions", 1, 32, 2, (0.2,), (0.3,), task="semantic-segmentation")


def _tiny_run(root, name: str, seed: int):
    """A finished one-algorithm run folder holding an untrained tiny U-Net, as `fedistill run` lays it out."""
    config = build_config(RunConfig(), {
        "algorithm": "fedavg",
        "dataset": "mni152-synthetic-lesions",
        "model": "unet",
        "model_options": {"width": 4, "depth": 2},
        "mni152-synthetic-lesions": {"image_size": 32},
        "data_dir": str(root / "data"),
        "out": str(root),
        "name": name,
    })  # fmt: skip
    run = root / name
    (run / "fedavg" / "models").mkdir(parents=True)
    write_config(config, run / "config.toml")
    write_config(config, run / "fedavg" / "config.toml")
    summary = {"algorithm": "fedavg", "description": "", "federated": True, "rounds": 1, "final": {}}
    summary |= {"communication": {}, "wall_time_s": 0.0}  # what every finished run's summary holds
    (run / "fedavg" / "summary.json").write_text(json.dumps(summary))
    torch.manual_seed(seed)
    module = new_model(config, INFO)
    save_model(module, run / "fedavg" / "models" / "global.safetensors", {"dataset_info": INFO.to_json()})
    return run


def test_slices_are_the_largest_true_lesions_in_slice_order():
    truth = np.zeros((6, 8, 8), bool)
    truth[1, :2, :2] = True  # 4
    truth[3, :3, :3] = True  # 9
    truth[4, :2, :2] = True  # 4, ties with slice 1: the lower index wins
    truth[5, :1, :3] = True  # 3
    assert largest_lesion_slices(truth, 2) == [1, 3]
    assert largest_lesion_slices(truth, 10) == [1, 3, 4, 5]  # never an empty slice


def test_figure_of_the_real_patients_writes_png_and_dice_per_method_per_slice(tmp_path):
    if not all((BRAIN_MRI / f"{p}_{k}.nii.gz").is_file() for p in PATIENTS for k in ("image", "label")):
        pytest.skip(f"brain-lesions-real files not found under {BRAIN_MRI}")
    runs = {"A": (_tiny_run(tmp_path, "a", 0), "fedavg"), "B": (_tiny_run(tmp_path, "b", 1), "fedavg")}
    out = tmp_path / "results"
    record = real_patients_figure(
        runs, SHARED_DATA, out, load=load_model, segment=segment_volume, count=2, command="the command"
    )

    assert (out / "segmentation_real_patients.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = json.loads((out / "segmentation_real_patients.json").read_text())
    assert written == json.loads(json.dumps(record))
    assert written["command"] == "the command"
    assert all(run["model"].startswith("fedistill.load_model") for run in written["runs"].values())
    assert str(tmp_path) not in json.dumps(written)  # no machine paths
    expected = []
    for patient in PATIENTS:  # the two slices with the most true lesion voxels, from the label alone
        label = np.asarray(nib.as_closest_canonical(nib.load(BRAIN_MRI / f"{patient}_label.nii.gz")).dataobj)
        area = (label > 0).sum((0, 1))
        expected += [(patient, int(z)) for z in sorted(np.argsort(-area, kind="stable")[:2])]
    assert [(s["patient"], s["slice"]) for s in written["slices"]] == expected
    for chosen in written["slices"]:
        assert set(chosen["dice"]) == {"A", "B"}
        assert all(0.0 <= d <= 100.0 for d in chosen["dice"].values())
    assert written["brain_extraction"] == "outline" and written["skull_strip"] is True
    # the tissue rule's figure stands beside the default's, and says which rule made it
    tissue = real_patients_figure(
        runs, SHARED_DATA, out, load=load_model, segment=segment_volume, count=1, skull_strip="tissue"
    )
    assert tissue["brain_extraction"] == "tissue"
    assert tissue["figure"] == "segmentation_real_patients_tissue.png"
    assert (out / "segmentation_real_patients_tissue.json").is_file()
    assert json.loads((out / "segmentation_real_patients.json").read_text()) == written


def test_runs_of_one_algorithm_are_told_apart_by_the_tables_method(tmp_path):
    """Table 2's FedAvg runs (plain and recalibrated) share the algorithm folder `fedavg`; each is found,
    under its table label, and a run folder not named by the tables keeps its algorithm's name."""
    plain = _tiny_run(tmp_path, "seg2-brats-synthetic-lesions-64px-K10-seed0-fedavg-a3f63a6b", 0)
    again = _tiny_run(tmp_path, "seg2-brats-synthetic-lesions-64px-K10-seed0-fedavg-recalibrated-6039dbeb", 1)
    other = tmp_path / "elsewhere"
    _tiny_run(other, "my-run", 2)

    assert find_runs(tmp_path) == {
        "FedAvg": (plain, "fedavg"),
        "FedAvg, BatchNorm statistics recomputed at the sites": (again, "fedavg"),
    }
    assert find_runs(other) == {"FedAvg": (other / "my-run", "fedavg")}


def test_whole_head_and_a_brain_extraction_rule_are_refused_together(tmp_path, capsys):
    with pytest.raises(SystemExit):
        argv = ["--runs", str(tmp_path), "--whole-head", "--brain-extraction", "tissue"]
        main(argv, load_model, segment_volume)
    assert "--whole-head predicts with no brain extraction" in capsys.readouterr().err
