"""Exporting a run's model: safetensors by default in <run>/<algorithm>/export/ with its model card;
ONNX equal to PyTorch (onnxruntime, max abs difference <= 1e-4) for a classifier, a segmentation U-Net
and the reconstruction U-Net; TorchScript equal to PyTorch; the `fedistill export` command."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import fedistill
from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo
from fedistill.data.registry import load_dataset
from fedistill.errors import ConfigError
from fedistill.federation.ledger import DOWN, UP
from fedistill.inference import TrainedModel
from fedistill.inference.export import add_arguments, export_model, exported_module, run_command, verify
from fedistill.inference.model_card import card_markdown
from fedistill.inference.trained_model import InputError
from fedistill.machine import describe, machine
from fedistill.models import build_model
from fedistill.tasks import make_task

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    keys = {"algorithm": "fedavg", "model": "small-cnn", "clients": 3, "rounds": 1, "device": "cpu"}
    return fedistill.run(**keys, out=str(out), name="e", quiet=True).run_dir


@pytest.fixture(scope="module")
def test_images():
    return load_dataset("digits").test.x


def _onnx_outputs(path, inputs: torch.Tensor) -> torch.Tensor:
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: inputs.numpy()})[0])


def test_default_export_is_safetensors_in_the_runs_export_folder_with_a_card(run_dir):
    path = fedistill.export(run_dir, "fedavg")
    assert path == run_dir / "fedavg" / "export" / "global.safetensors"
    model = fedistill.load_model(run_dir, "fedavg")
    weights = load_file(str(path))
    assert weights.keys() == model.module.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in model.module.state_dict().items())
    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
    assert metadata["architecture"] == "small-cnn" and metadata["algorithm"] == "fedavg"
    assert json.loads(metadata["task_options"]) == model.task.options()
    assert json.loads(metadata["preprocessing"])["mean"] == list(model.info.mean)
    assert metadata["norm"] == "batch" and "group_norm_groups" not in metadata  # "auto", resolved
    assert DatasetInfo.from_json(metadata["dataset_info"]) == model.info

    summary = json.loads((run_dir / "fedavg" / "summary.json").read_text(encoding="utf-8"))
    card = json.loads((path.parent / "global.safetensors.card.json").read_text(encoding="utf-8"))
    assert card["model"]["file"] == "global.safetensors" and card["model"]["architecture"] == "small-cnn"
    assert card["method"]["algorithm"] == "fedavg" and card["method"]["federated"] is True
    assert card["dataset"] == "digits" and card["clients"] == 3
    assert card["partition"] == {k: summary["partition"][k] for k in ("method", "alpha", "hash")}
    assert card["left_the_sites"]["bytes_per_kind"] == summary["communication"][UP]["per_kind"]
    assert card["left_the_sites"]["total_bytes"] == summary["communication"][UP]["total_bytes"] > 0
    assert card["sent_to_the_sites"]["total_bytes"] == summary["communication"][DOWN]["total_bytes"]
    assert card["final_metrics"] == summary["final"]
    assert card["differential_privacy"] is None
    assert card["versions"] == summary["versions"]
    assert card["trained_on"] == describe(summary["machine"]) == describe(machine())
    assert card["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40,64}", card["git_commit"])
    pre = card["preprocessing"]
    assert (pre["image_size"], pre["channels"]) == (8, 1)
    assert (pre["mean"], pre["std"]) == (list(model.info.mean), list(model.info.std))
    assert pre["class_names"] == [str(d) for d in range(10)]
    text = (path.parent / "global.safetensors.card.md").read_text(encoding="utf-8")
    assert "## What left the sites" in text and "parameters" in text and summary["partition"]["hash"] in text
    assert f"- trained on: {describe(machine())}" in text
    part = summary["partition"]
    assert f"- partition: {part['method']} (alpha {part['alpha']}), hash" in text
    iid = {**card, "partition": {**card["partition"], "method": "iid"}}  # an iid split draws no alpha
    assert f"- partition: iid, hash `{part['hash']}`" in card_markdown(iid)


def test_onnx_classifier_equals_pytorch_on_the_test_set(run_dir, test_images, tmp_path):
    pytest.importorskip("onnxruntime")
    path = fedistill.export(run_dir, "fedavg", "onnx", output=tmp_path / "digits.onnx")
    assert path == tmp_path / "digits.onnx" and (tmp_path / "digits.onnx.card.json").is_file()
    model = fedistill.load_model(run_dir, "fedavg")
    inputs = model.preprocess(test_images)  # 360 images: a batch size the export never saw
    with torch.no_grad():
        expected = model.module(inputs)
    # one self-contained file: copied alone (as a user hands a model on) it still runs
    assert [p.name for p in tmp_path.glob("digits.onnx*") if ".card." not in p.name] == ["digits.onnx"]
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "digits.onnx").write_bytes(path.read_bytes())
    difference = float((_onnx_outputs(alone / "digits.onnx", inputs) - expected).abs().max())
    print(f"ONNX small-cnn (digits) max abs difference: {difference:.3g}")
    assert difference <= TOLERANCE
    card = json.loads((tmp_path / "digits.onnx.card.json").read_text(encoding="utf-8"))
    assert card["model"]["format"] == "onnx" and card["check"]["max_abs_difference"] <= TOLERANCE


def test_each_export_in_one_folder_keeps_its_own_card(run_dir, tmp_path):
    """Two exports into one folder: each file's card describes it (one shared model-card.md was
    overwritten by the second export, leaving the first file beside a card of another file)."""
    pytest.importorskip("onnxruntime")
    onnx = fedistill.export(run_dir, "fedavg", "onnx", output=tmp_path)
    weights = fedistill.export(run_dir, "fedavg", "safetensors", output=tmp_path)
    for path, format in ((onnx, "onnx"), (weights, "safetensors")):
        card = json.loads((tmp_path / f"{path.name}.card.json").read_text(encoding="utf-8"))
        assert (card["model"]["file"], card["model"]["format"]) == (path.name, format)
        assert path.name in (tmp_path / f"{path.name}.card.md").read_text(encoding="utf-8")


def _dense_model(architecture: str, info: DatasetInfo, options: dict) -> TrainedModel:
    torch.manual_seed(0)
    module = build_model(architecture, info, options=options)
    module.train()
    with torch.no_grad():  # running statistics that are not the identity
        for _ in range(3):
            module(torch.randn(4, info.channels, info.image_size, info.image_size) * 2 + 0.5)
    module.eval()
    task = make_task(info)
    return TrainedModel(module, task, info, "none", RunConfig(), architecture, architecture)


SEGMENTATION = "semantic-segmentation"
DENSE = {
    "unet": (
        DatasetInfo("toy-seg", 1, 16, 3, (0.3,), (0.2,), class_names=("bg", "a", "b"), task=SEGMENTATION),
        {"width": 4, "depth": 2},
    ),
    "unet-fastmri": (
        DatasetInfo("toy-mri", 1, 16, 1, (0.0,), (1.0,), task="reconstruction"),
        {"chans": 4, "num_pool_layers": 2},
    ),
}


def test_a_reconstruction_net_s_weights_carry_what_turns_their_output_into_the_image(tmp_path):
    info, options = DENSE["unet-fastmri"]
    model = _dense_model("unet-fastmri", info, options)
    path = tmp_path / "net.safetensors"
    export_model(model, "safetensors", path)
    with safe_open(str(path), "pt") as handle:
        recorded = json.loads(handle.metadata()["task_options"])
    assert recorded["residual"] is True and recorded["output_scale"] == "slice"
    assert recorded == model.task.options()


@pytest.mark.parametrize("architecture", sorted(DENSE))
def test_onnx_dense_nets_equal_pytorch(architecture, tmp_path):
    pytest.importorskip("onnxruntime")
    info, options = DENSE[architecture]
    model = _dense_model(architecture, info, options)
    path = tmp_path / f"{architecture}.onnx"
    check = export_model(model, "onnx", path)
    images = torch.rand(5, 1, 16, 16, generator=torch.Generator().manual_seed(3))
    inputs = model.preprocess(images)
    with torch.no_grad():
        expected = exported_module(model)(inputs)
    exported = _onnx_outputs(path, inputs)
    difference = float((exported - expected).abs().max())
    print(f"ONNX {architecture} max abs difference: {difference:.3g}")
    assert difference <= TOLERANCE and check is not None and check["max_abs_difference"] <= TOLERANCE
    predicted = model.predict(images)
    if architecture == "unet":
        assert predicted.shape == (5, 16, 16) and predicted.dtype == torch.int64 and int(predicted.max()) < 3
    else:
        assert predicted.shape == (5, 1, 16, 16) and predicted.dtype == torch.float32
        # the file returns the image (input + the net's correction in the slice's units), as predict does
        assert float((exported - predicted).abs().max()) <= TOLERANCE
        with torch.no_grad():
            correction = inputs.std(dim=(1, 2, 3), keepdim=True) * model.module(inputs)
            assert float((exported - inputs - correction).abs().max()) <= TOLERANCE


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_torchscript_equals_pytorch_and_the_export_command(run_dir, test_images, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([str(run_dir), "--format", "torchscript", "--output", str(tmp_path)])
    assert run_command(args) == 0
    path = tmp_path / "global.pt"
    assert str(path) in capsys.readouterr().out and (tmp_path / "global.pt.card.md").is_file()
    model = fedistill.load_model(run_dir)
    inputs = model.preprocess(test_images)
    scripted = torch.jit.load(str(path))
    with torch.no_grad():
        assert torch.equal(scripted(inputs), model.module(inputs))
    assert verify(model, "torchscript", path)["max_abs_difference"] == 0.0


def test_unknown_format_is_refused_before_any_work(run_dir):
    with pytest.raises(ConfigError, match="unknown export format 'tflite'"):
        fedistill.export(run_dir, "fedavg", "tflite")


def test_an_output_file_named_for_another_format_is_refused_in_one_line(run_dir, tmp_path):
    """`--format onnx --output m.safetensors` wrote an ONNX graph under a safetensors name."""
    with pytest.raises(ConfigError, match=r"m\.safetensors: an export as onnx is a \.onnx file"):
        fedistill.export(run_dir, "fedavg", "onnx", output=tmp_path / "m.safetensors")
    assert not list(tmp_path.glob("m.*"))


def test_a_batch_size_below_one_is_one_clear_error_in_the_api(run_dir, test_images):
    model = fedistill.load_model(run_dir, "fedavg")
    with pytest.raises(ConfigError, match="must be a positive integer, got 0"):
        model.predict(test_images[:4], batch_size=0)


def test_float_images_on_the_0_255_scale_are_refused_not_read_as_they_are(run_dir, test_images):
    model = fedistill.load_model(run_dir, "fedavg")
    on_255 = test_images[:2].float()
    assert float(on_255.max()) > 2
    with pytest.raises(InputError, match=r"float images must lie in \[0, 1\], got values in \[0, "):
        model.predict(on_255)
    model.predict(on_255 / 255)  # the same images on the scale the model takes


def test_a_group_norm_export_records_its_groups_and_rebuilds_from_the_file_alone(tmp_path):
    """GroupNorm's weights have one shape for every group count: a file without the count loaded into a
    net of 2 groups without a word and answered differently."""
    keys = {"algorithm": "centralized", "model": "small-cnn", "clients": 2, "rounds": 1, "device": "cpu"}
    run = fedistill.run(**keys, norm="group", group_norm_groups=4, out=str(tmp_path), name="gn", quiet=True)
    path = fedistill.export(run.run_dir, "centralized")
    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
    assert (metadata["norm"], metadata["group_norm_groups"]) == ("group", "4")
    info = DatasetInfo.from_json(metadata["dataset_info"])
    rebuilt = build_model(metadata["architecture"], info, norm=metadata["norm"],
                          group_norm_groups=int(metadata["group_norm_groups"]),
                          options=json.loads(metadata["model_options"]))  # fmt: skip
    rebuilt.load_state_dict(load_file(str(path)))
    model = fedistill.load_model(run.run_dir, "centralized")
    images = load_dataset("digits").test.x[:16]
    assert torch.equal(rebuilt.eval()(model.preprocess(images)), model.outputs(images))
    card = json.loads((path.parent / f"{path.name}.card.json").read_text(encoding="utf-8"))
    assert (card["model"]["norm"], card["model"]["group_norm_groups"]) == ("group", 4)


def test_the_card_of_a_reconstruction_net_s_weights_says_they_output_the_correction(tmp_path):
    """The card of a safetensors export said a reconstruction net outputs the image, while the bare net
    outputs the correction that the task's residual and output scale turn into it."""
    from fedistill.inference.model_card import model_card, output_description

    info, options = DENSE["unet-fastmri"]
    model = _dense_model("unet-fastmri", info, options)
    inputs = model.preprocess(torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(4)))
    with torch.no_grad():
        raw, image = model.module(inputs), exported_module(model)(inputs)
    std = inputs.std(dim=(1, 2, 3), keepdim=True)
    assert float((inputs + raw * std - image).abs().max()) <= TOLERANCE  # what the card states
    summary = {"algorithm": "fedavg", "description": "", "federated": True, "rounds": 1}
    summary |= {"communication": {}, "final": {}}
    model.algorithm = "fedavg"
    for format, suffix in (("safetensors", ".safetensors"), ("onnx", ".onnx"), ("torchscript", ".pt")):
        output = model_card(model, summary, tmp_path / f"net{suffix}", format)["model"]["output"]
        if format == "safetensors":
            assert "not the image" in output and "is x + y * std(x) (the unbiased std over" in output
        else:
            assert output.startswith("images (N, C, H, W)")
    plain = dataclasses.replace(model, task=model.task.identity_baseline())  # no residual, no scale
    assert output_description(plain, "safetensors").startswith("images (N, C, H, W)")
    segmenter = _dense_model("unet", *DENSE["unet"])
    assert output_description(segmenter, "safetensors").startswith("per-pixel logits")


def test_an_export_its_runtime_cannot_run_is_one_line_naming_the_file(tmp_path, monkeypatch):
    """An ONNX file that the installed onnxruntime could not load (an opset newer than it knows) ended the
    export in onnxruntime's traceback, after the exporter's own failures were one line."""
    import fedistill.inference.export as export_module

    def refuse(format, path, inputs):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Load model failed\nopset 99 is not supported")

    monkeypatch.setattr(export_module, "run_exported", refuse)
    model = _dense_model("unet", *DENSE["unet"])
    path = tmp_path / "unet.pt"
    message = r"unet\.pt was written, but torch\.jit .* cannot run it \(\[ONNXRuntimeError\] : 1 : FAIL"
    with pytest.raises(export_module.ExportError, match=message) as caught:
        export_model(model, "torchscript", path)
    assert "\n" not in str(caught.value) and path.is_file()


def test_a_model_file_with_task_options_this_version_lacks_says_so(run_dir, tmp_path):
    """A model file written by a newer version, recording a task option this one does not have, was
    refused as if the run's config had a typo ("task 'classification' has no option(s) ...")."""
    import shutil

    from safetensors.torch import save_file

    from fedistill.errors import RunDirError

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("checkpoints", "export"))
    path = copy / "fedavg" / "models" / "global.safetensors"
    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
    state = load_file(str(path))
    metadata["task_options"] = json.dumps({"temperature_scaling": 1.5})
    save_file(state, str(path), metadata)
    message = r"global\.safetensors records task option\(s\) temperature_scaling.* newer version of fedistill"
    with pytest.raises(RunDirError, match=message):
        fedistill.load_model(copy, "fedavg")


def test_an_export_whose_outputs_differ_from_pytorch_fails_and_its_card_says_so(
    run_dir, tmp_path, monkeypatch
):
    """The check against PyTorch only wrote its difference to the card: an export computing something else
    succeeded. Now a difference above the tolerance fails the export, and the card names it."""
    import fedistill.inference.export as export_module

    real = export_module.run_exported
    monkeypatch.setattr(export_module, "run_exported", lambda *args: real(*args) + 1.0)
    with pytest.raises(export_module.ExportError, match=r"differ from PyTorch's by 1 \(tolerance") as caught:
        export_module.export(run_dir, format="torchscript", output=tmp_path)
    assert "\n" not in str(caught.value)
    card = (tmp_path / "global.pt.card.md").read_text()
    assert "max abs difference 1 (ABOVE the tolerance" in card
    monkeypatch.setattr(export_module, "run_exported", real)
    export_module.export(run_dir, format="torchscript", output=tmp_path / "good")
    assert "(within the tolerance" in (tmp_path / "good" / "global.pt.card.md").read_text()


def test_an_existing_export_is_replaced_only_with_overwrite(run_dir, tmp_path, capsys):
    """`export` wrote over any file at its target without a word (another run's model, an earlier export)."""
    target = tmp_path / "model.pt"
    target.write_bytes(b"someone else's file")
    with pytest.raises(ConfigError, match=r"model\.pt already exists; pass --overwrite"):
        fedistill.export(run_dir, "fedavg", "torchscript", output=target)
    assert target.read_bytes() == b"someone else's file"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert (
        run_command(
            parser.parse_args(
                [str(run_dir), "--format", "torchscript", "--output", str(target), "--overwrite"]
            )
        )
        == 0
    )
    assert target.read_bytes() != b"someone else's file" and target.with_name("model.pt.card.md").is_file()


def test_the_loaded_model_and_its_card_say_which_epoch_s_model_it_is(run_dir, tmp_path):
    from fedistill.engine.summary import read_summary
    from fedistill.inference.model_card import model_card
    from fedistill.inference.selection import which_model

    model = fedistill.load_model(run_dir, "fedavg")
    assert model.selection == "the last round's model (round 1 of 1; no selection across rounds)"
    assert f"selection={model.selection!r}" in repr(model) and "SmallCNN" not in repr(model)
    summary = read_summary(run_dir / "fedavg")
    card = model_card(model, summary, tmp_path / "global.safetensors", "safetensors")
    assert card["model"]["selection"] == model.selection
    assert f"- which model: {model.selection}" in card_markdown(card)

    chosen = {"selected_epoch": 3, "selection": "best on the clients' validation splits"}
    selected = {**summary, "rounds": 5, "rounds_done": 5, "final": {**summary["final"], **chosen}}
    assert which_model(selected) == "epoch 3 of 5, best on the clients' validation splits"
    stopped = {**summary, "rounds": 10, "rounds_done": 4, "stopped": "the loss is NaN"}
    assert which_model(stopped) == (
        "the last round's model (round 4 of 10, stopped early: the loss is NaN; no selection across rounds)"
    )


def test_the_card_names_a_git_commit_only_when_its_code_trained_the_model(run_dir, tmp_path, monkeypatch):
    from fedistill.engine.summary import read_summary
    from fedistill.inference import model_card as cards

    monkeypatch.setattr(cards, "git_commit", lambda: "a" * 40)
    model = fedistill.load_model(run_dir, "fedavg")
    summary = read_summary(run_dir / "fedavg")
    path = tmp_path / "global.safetensors"
    assert cards.model_card(model, summary, path, "safetensors")["git_commit"] == "a" * 40  # this code ran it
    other = {**summary, "versions": {**summary["versions"], "code": "0123456789ab"}}  # trained by other code
    card = cards.model_card(model, other, path, "safetensors")
    assert card["git_commit"] is None
    unknown = "- git commit: unknown (this export's checkout is not the code that trained it"
    assert unknown in card_markdown(card)
    resumed = {**summary, "code_history": [summary["versions"]["code"], "0123456789ab"]}  # two codes ran it
    assert cards.model_card(model, resumed, path, "safetensors")["git_commit"] is None


def test_the_card_of_a_reconstruction_net_says_what_its_inputs_are():
    """Its preprocessing read as a classifier's (uint8 divided by 255, class names) though the net takes
    the zero-filled images of slices scaled per volume to a maximum of 1."""
    from fedistill.inference.model_card import preprocessing

    model = _dense_model("unet-fastmri", *DENSE["unet-fastmri"])
    pre = preprocessing(model)
    assert "zero-filled" in pre["input"] and "inverse Fourier transform" in pre["input"]
    assert pre["scale"].startswith("each volume divided by its maximum") and "255" not in pre["scale"]
    assert "class_names" not in pre and pre["undersampling"] == {
        key: model.task.options()[key]
        for key in ("mask", "acceleration", "center_fraction", "mask_mode", "mask_seed")
    }  # the seed picks the masks: under mask_mode = "fixed", the one pattern the net was trained on


def test_the_card_counts_one_client_and_one_round_in_the_singular(run_dir, tmp_path):
    from fedistill.engine.summary import read_summary
    from fedistill.inference import model_card as cards

    model = fedistill.load_model(run_dir, "fedavg")
    summary = read_summary(run_dir / "fedavg")
    card = cards.model_card(model, summary, tmp_path / "g.safetensors", "safetensors")
    card["clients"], card["method"]["rounds"] = 1, 1
    assert "- trained by 1 client over 1 round (seed" in card_markdown(card)
    card["clients"], card["method"]["rounds"] = 3, 2
    assert "- trained by 3 clients over 2 rounds (seed" in card_markdown(card)


@pytest.mark.parametrize("window", [None, [-160, 240]])
def test_the_card_of_a_nifti_folder_model_says_how_a_volume_becomes_its_slices(window):
    """Its preprocessing began at uint8 slices, leaving out how a NIfTI volume became them (orientation,
    the intensity window or percentiles, the field of view): an ONNX user could not feed it a scan."""
    import dataclasses

    from fedistill.inference.model_card import preprocessing

    model = _dense_model("unet", *DENSE["unet"])
    table = {"image_size": 16} if window is None else {"image_size": 16, "window": window}
    config = RunConfig().replace(dataset="nifti-folder", options={"nifti-folder": table})
    pre = preprocessing(dataclasses.replace(model, config=config))
    assert "closest RAS orientation" in pre["volumes"] and "axial slices" in pre["volumes"]
    assert "larger physical side" in pre["volumes"]
    scale = "window [-160.0, 240.0]" if window else "0.5th-99.5th percentiles"
    assert scale in pre["volumes"]
    assert "volumes" not in preprocessing(model)  # a model of 2D images: nothing about volumes
    assert "of a 4-D file (several volumes along its 4th axis) volume 0 alone" in pre["volumes"]
    config = config.replace(options={"nifti-folder": {**table, "channel": 2}})
    pre = preprocessing(dataclasses.replace(model, config=config))
    assert "of a 4-D file (several volumes along its 4th axis) volume 2 alone" in pre["volumes"]
