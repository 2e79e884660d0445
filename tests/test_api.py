"""The Python API: `fedistill.run`, `summary` and `load_model` against the files a run writes, the
trained model reproducing the run's own test accuracy, and one-line errors for every wrong input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fedistill
from fedistill.api import DEMO_CONFIG, run_config
from fedistill.config import load_toml
from fedistill.data.registry import load_dataset
from fedistill.engine.rundir import read_jsonl
from fedistill.engine.summary import results_rows
from fedistill.errors import RunDirError, UserError
from fedistill.federation.ledger import UP
from fedistill.inference import InputError
from fedistill.machine import describe, machine

KEYS = {"algorithm": "fedavg", "model": "small-cnn", "clients": 3, "rounds": 1, "device": "cpu"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> fedistill.RunResult:
    out = tmp_path_factory.mktemp("runs")
    return fedistill.run(**KEYS, out=str(out), name="a", quiet=True)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


def test_import_fedistill_stays_light():
    code = "import sys, fedistill; print('torch' in sys.modules, sorted(dir(fedistill)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("False ")
    for name in ("run", "summary", "load_model", "RunResult", "TrainedModel", "export"):
        assert repr(name) in out
        assert getattr(fedistill, name) is not None


def test_run_result_holds_what_the_run_wrote(finished):
    run_dir = finished.run_dir
    assert run_dir.name == "a" and (run_dir / "config.toml").is_file()
    assert list(finished) == ["fedavg"] and len(finished) == 1 and "fedavg" in finished
    fedavg = finished["fedavg"]
    written = json.loads((run_dir / "fedavg" / "summary.json").read_text(encoding="utf-8"))
    assert fedavg.summary == written
    assert fedavg.final == written["final"] and 0.0 <= fedavg.final["test_accuracy"] <= 1.0
    assert fedavg.communication == written["communication"]
    assert fedavg.bytes_up == written["communication"][UP]["total_bytes"] > 0
    assert fedavg.metrics == read_jsonl(run_dir / "fedavg" / "metrics.jsonl")
    assert fedavg.curve("test_accuracy") == [(1, fedavg.final["test_accuracy"])]
    assert fedavg.headline == "test_accuracy"
    assert finished.table() == results_rows([written])
    assert finished.table()[0]["algorithm"] == "fedavg"
    assert finished.markdown() in (run_dir / "results.md").read_text(encoding="utf-8")
    # which CPU and kernel path made these numbers, in the summary, its Markdown and the suite's results
    assert written["machine"] == machine()
    ran_on = describe(written["machine"])
    assert f"Machine: {ran_on}" in (run_dir / "fedavg" / "summary.md").read_text(encoding="utf-8")
    assert f"Ran on: {ran_on}" in (run_dir / "results.md").read_text(encoding="utf-8")
    with pytest.raises(KeyError, match="fedprox"):
        finished["fedprox"]


def test_summary_reads_a_run_or_one_algorithms_folder(finished):
    assert fedistill.summary(finished.run_dir) == finished
    alone = fedistill.summary(finished.run_dir / "fedavg")
    assert alone.run_dir == finished.run_dir / "fedavg"
    assert alone["fedavg"] == finished["fedavg"]


def test_keys_dotted_tables_and_a_config_file_layer_as_the_cli_does(tmp_path):
    config = run_config(None, {"fediod.rounds": 2, "fedprox": {"mu": 0.1}, "rounds": 1})
    assert config.rounds == 1
    assert config.options["fediod"] == {"rounds": 2} and config.options["fedprox"] == {"mu": 0.1}
    toml = tmp_path / "base.toml"
    toml.write_text("rounds = 5\nclients = 4\n[fedavg]\nlr = 0.1\n", encoding="utf-8")
    layered = run_config(toml, {"rounds": 1})
    assert (layered.rounds, layered.clients, layered.options["fedavg"]) == (1, 4, {"lr": 0.1})
    assert run_config(None, {"out": "x"}).algorithm == load_toml(DEMO_CONFIG)["algorithm"]  # the demo


def test_streaming_a_run_keeps_the_demo_as_on_the_command_line():
    """`track` says where a run is watched, not what it runs: `fedistill run --track tensorboard` runs the
    demo, and so does `fedistill.run(track="tensorboard")`."""
    from fedistill.cli import build_parser, config_from_args

    config = run_config(None, {"track": "tensorboard", "out": "x"})
    assert config.algorithm == load_toml(DEMO_CONFIG)["algorithm"] and config.track == "tensorboard"
    assert config.options["fediod"]["student_noise"] == 0.5  # the demo's own setting, not the defaults'
    on_the_command_line = config_from_args(build_parser().parse_args(["run", "--track", "tensorboard"]))
    assert on_the_command_line.algorithm == config.algorithm


def test_loaded_model_reproduces_the_runs_test_accuracy(finished, digits):
    model = fedistill.load_model(finished.run_dir, "fedavg")
    assert (model.name, model.architecture, model.algorithm) == ("global", "small-cnn", "fedavg")
    assert not model.module.training and model.device == torch.device("cpu")
    assert model.info == digits.info and model.task.name == "classification"
    assert model.config.model == "small-cnn" and model.config.algorithm == "fedavg"
    test = digits.test
    predicted = model.predict(test.x)
    accuracy = int((predicted == test.y).sum()) / len(test)
    assert abs(accuracy - finished["fedavg"].final["test_accuracy"]) <= 1e-6
    as_floats = model.predict((test.x.float() / 255.0).numpy()[:, 0])  # (N, H, W) floats in [0, 1]
    assert torch.equal(as_floats, predicted)
    proba = model.predict_proba(test.x)
    assert torch.allclose(proba.sum(1), torch.ones(len(test)), atol=1e-5)
    assert torch.equal(proba.argmax(1), predicted)
    from_its_folder = fedistill.load_model(finished.run_dir / "fedavg")  # the algorithm may be left out
    assert torch.equal(from_its_folder.predict(test.x[:20]), predicted[:20])


def test_centralized_exports_the_pooled_model_it_trained(tmp_path, digits):
    """Centralized's one model (the tables' upper bound) comes back for predict and export, fetched once
    through the message boundary; Standalone's models stay with their sites."""
    keys = KEYS | {"algorithm": "centralized,standalone"}
    result = fedistill.run(**keys, out=str(tmp_path), name="pooled", quiet=True)
    model = fedistill.load_model(result.run_dir, "centralized")
    assert (model.name, model.algorithm) == ("global", "centralized")
    accuracy = int((model.predict(digits.test.x) == digits.test.y).sum()) / len(digits.test)
    assert abs(accuracy - result["centralized"].final["test_accuracy"]) <= 1e-6
    ledger = read_jsonl(result.run_dir / "centralized" / "ledger.jsonl")
    sent = [r for r in ledger if r.get("type") == "query.model" and r.get("direction") == UP]
    assert len(sent) == 1
    with pytest.raises(RunDirError, match="exported no whole model"):
        fedistill.load_model(result.run_dir, "standalone")


def test_a_model_loads_without_its_dataset_from_the_facts_saved_beside_it(finished, digits, monkeypatch):
    import fedistill.data.registry as registry

    def no_data(*args, **kwargs):
        raise AssertionError("load_model read the dataset")

    monkeypatch.setattr(registry, "load_dataset", no_data)
    model = fedistill.load_model(finished.run_dir, "fedavg")
    assert model.info == digits.info  # normalisation, size and classes, exactly as trained
    accuracy = int((model.predict(digits.test.x) == digits.test.y).sum()) / len(digits.test)
    assert abs(accuracy - finished["fedavg"].final["test_accuracy"]) <= 1e-6


def test_a_data_dir_does_not_replace_the_normalisation_the_model_trained_with(finished, digits, monkeypatch):
    """The facts saved beside the weights are the training's; a dataset at `data_dir` (changed since, or
    another one) is read only for a model saved without them."""
    import dataclasses

    import fedistill.data.registry as registry

    changed = dataclasses.replace(digits, info=dataclasses.replace(digits.info, mean=(0.9,), std=(0.1,)))
    monkeypatch.setattr(registry, "load_dataset", lambda *args, **kwargs: changed)
    model = fedistill.load_model(finished.run_dir, "fedavg", data_dir=finished.run_dir / "elsewhere")
    assert model.info == digits.info


def test_a_model_file_is_opened_once(finished, monkeypatch):
    """Its tensors and the dataset facts in its header come from one opening of the file."""
    import safetensors

    opened: list[str] = []
    real = safetensors.safe_open

    def counting(path, *args, **kwargs):
        opened.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(safetensors, "safe_open", counting)
    model = fedistill.load_model(finished.run_dir, "fedavg")
    assert [Path(p).name for p in opened] == ["global.safetensors"]
    assert model.info.num_classes == 10


def test_dataset_facts_survive_their_json_record():
    from fedistill.data.base import DatasetInfo, TextInfo

    text = DatasetInfo("ag-news", 1, 128, 4, (0.0,), (1.0,), class_names=("a", "b", "c", "d"),
                       task="text-classification", text=TextInfo("bert", 30522, 0, 128))  # fmt: skip
    image = DatasetInfo(
        "x", 3, 32, 10, (0.1, 0.2, 0.3), (0.4, 0.5, 0.6), crop_padding=4, horizontal_flip=True
    )
    for info in (text, image):
        assert DatasetInfo.from_json(info.to_json()) == info
    with pytest.raises(ValueError, match="not a dataset record"):
        DatasetInfo.from_json('{"name": "x"}')


def test_wrong_images_are_refused_in_one_line(finished):
    model = fedistill.load_model(finished.run_dir)
    for images, expected in (
        (np.zeros((2, 3, 8, 8), dtype=np.uint8), r"\(N, 1, 8, 8\)"),
        (np.zeros((2, 1, 9, 9), dtype=np.uint8), r"got shape \(2, 1, 9, 9\)"),
        (np.zeros((2, 9, 9), dtype=np.uint8), r"got shape \(2, 9, 9\)$"),  # as given, no channel added
        (np.zeros((2, 8, 8), dtype=np.int32), "uint8"),
    ):
        with pytest.raises(InputError, match=expected) as exc:
            model.predict(images)
        _one_line(exc)
    assert issubclass(InputError, ValueError) and issubclass(InputError, UserError)


def test_images_in_minus_one_to_one_or_normalised_are_refused(finished, digits):
    """Floats in [-1, 1] and already normalised digits (about [-0.81, 1.85]) were taken for [0, 1] images
    and normalised again: other labels, without a word."""
    model = fedistill.load_model(finished.run_dir)
    x01 = digits.test.x[:20].float() / 255.0
    for images in (x01 * 2 - 1, model.preprocess(x01).cpu()):
        with pytest.raises(InputError, match=r"must lie in \[0, 1\].*\(x \+ 1\) / 2") as exc:
            model.predict(images)
        _one_line(exc)
    overshoot = x01 * 1.2 - 0.1  # [-0.1, 1.1], as a bicubic resize leaves [0, 1] images: still taken
    assert model.predict(overshoot).shape == (20,)


def test_flipped_numpy_views_are_taken(finished, digits):
    """A NumPy view with negative strides (a horizontal flip, channels reversed) raised torch's ValueError."""
    model = fedistill.load_model(finished.run_dir)
    images = digits.test.x[:20, 0].numpy()
    flipped = images[:, :, ::-1]
    assert torch.equal(model.predict(flipped), model.predict(flipped.copy()))


def _copy(finished, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(finished.run_dir, copy, ignore=shutil.ignore_patterns(".lock*"))
    return copy


def test_run_directory_mistakes_give_one_line_errors(finished, tmp_path):
    run_dir = finished.run_dir
    (tmp_path / "empty").mkdir()
    cases = [
        (tmp_path / "nowhere", "fedavg", "is not a folder"),
        (tmp_path / "empty", "fedavg", "not a run directory"),
        (run_dir, "fedprox", "holds no 'fedprox'"),
        (run_dir / "fedavg", "fedprox", "is the fedavg folder of the run"),
    ]
    for where, algorithm, expected in cases:
        with pytest.raises(RunDirError, match=expected) as exc:
            fedistill.load_model(where, algorithm)
        _one_line(exc)
    with pytest.raises(RunDirError, match="exported no model 'student'"):
        fedistill.load_model(run_dir, "fedavg", name="student")
    with pytest.raises(RunDirError, match="already holds a run") as exc:
        fedistill.run(**KEYS, out=str(run_dir.parent), name="a", quiet=True)
    _one_line(exc)
    with pytest.raises(UserError, match="resume continues with the run's saved config"):
        fedistill.run(resume=run_dir, rounds=2)


def test_unfinished_model_less_and_damaged_runs_are_named(finished, tmp_path):
    copy = _copy(finished, tmp_path)
    weights = copy / "fedavg" / "models" / "global.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(RunDirError, match=r"global\.safetensors is damaged") as exc:
        fedistill.load_model(copy, "fedavg")
    _one_line(exc)
    shutil.rmtree(copy / "fedavg" / "models")  # left out of a copy: not a model that stayed with the sites
    with pytest.raises(RunDirError, match=r"has no models/ folder.*left out of a copy") as exc:
        fedistill.load_model(copy, "fedavg")
    assert "stay with the sites" not in _one_line(exc)
    (copy / "fedavg" / "summary.json").unlink()
    for call in (fedistill.load_model, fedistill.summary):
        with pytest.raises(RunDirError, match="--resume") as exc:
            call(copy)
        _one_line(exc)


def test_resume_of_a_finished_run_gives_its_results(finished, tmp_path):
    copy = _copy(finished, tmp_path)
    resumed = fedistill.run(resume=copy, quiet=True)
    assert resumed.run_dir == copy
    assert resumed["fedavg"].final == finished["fedavg"].final


def test_nan_images_and_empty_batches_get_a_clear_answer(finished, digits):
    """One NaN pixel made every logit NaN and predicted class 0 silently; an empty batch crashed."""
    model = fedistill.load_model(finished.run_dir, "fedavg")
    images = digits.test.x[:2].float() / 255.0
    images[0, 0, 3, 3] = float("nan")
    with pytest.raises(InputError, match="NaN or infinite"):
        model.predict(images)
    assert model.predict(digits.test.x[:0]).shape == (0,)
    assert model.predict_proba(digits.test.x[:0]).shape == (0, 10)


def test_a_reconstruction_model_reconstructs_as_its_run_scored(tmp_path, finished, digits):
    """`reconstruct` undersamples with the run's masks and keeps the measured lines: on the test slices it
    gives the run's own SSIM (`predict` takes zero-filled images and skips data consistency)."""
    keys = {"algorithm": "fedavg", "dataset": "mni152-t1", "model": "unet-fastmri", "clients": 2, "rounds": 1,
            "partition": "natural", "batch_size": 8, "optimizer": "adam", "lr": 1e-3, "device": "cpu",
            "mni152-t1": {"image_size": 32, "sites": 2},
            "model_options": {"chans": 4, "num_pool_layers": 2}}  # fmt: skip
    result = fedistill.run(**keys, out=str(tmp_path), name="mri", quiet=True)
    model = fedistill.load_model(result.run_dir, "fedavg")
    assert model.task.data_consistency
    data = load_dataset("mni152-t1", image_size=32, sites=2)
    reconstructed = model.reconstruct(data.test.x)
    assert reconstructed.shape == data.test.x.shape
    scored = model.task.score(reconstructed, data.test, model.info, meta=data.test_meta, groups=None)
    assert abs(scored["ssim"] - result["fedavg"].final["test_ssim"]) <= 1e-5
    with pytest.raises(InputError, match="reconstruct is for reconstruction models"):
        fedistill.load_model(finished.run_dir, "fedavg").reconstruct(digits.test.x[:2])
    raw = data.test.x[:2] * 4000  # a scanner's own units: the advice is the run's scaling, not 255
    with pytest.raises(InputError, match="divide each volume by its maximum") as exc:
        model.reconstruct(raw)
    assert "255" not in _one_line(exc)


def test_a_run_killed_before_its_next_algorithm_asks_which_to_load(finished, tmp_path):
    """A run planning two algorithms that stopped before the second started holds one folder: leaving the
    algorithm out silently took that one, though the user may have meant the other."""
    copy = _copy(finished, tmp_path)
    config = copy / "config.toml"
    config.write_text(config.read_text().replace('algorithm = "fedavg"', 'algorithm = "fedavg,fediod"'))
    with pytest.raises(RunDirError, match=r"holds 2 algorithms \(fedavg; not started: fediod\)") as exc:
        fedistill.load_model(copy)
    _one_line(exc)
    assert fedistill.load_model(copy, "fedavg").algorithm == "fedavg"


def test_a_run_in_which_no_algorithm_started_says_so_rather_than_asking_which(finished, tmp_path):
    """A run that stopped before its first round holds no algorithm to choose between."""
    copy = _copy(finished, tmp_path)
    shutil.rmtree(copy / "fedavg")
    expected = r"no algorithm has started in .* \(it plans fedavg\); finish"
    with pytest.raises(RunDirError, match=expected) as exc:
        fedistill.load_model(copy)
    assert "name the one" not in _one_line(exc)


@pytest.mark.parametrize("config", [123, {"rounds": 2}, ["config.toml"]])
def test_a_config_that_is_neither_a_path_nor_a_runconfig_is_one_clear_error(config):
    """fedistill.run(config=...) takes a TOML path or a RunConfig; anything else was a bare TypeError from
    deep inside the TOML reader (a dict of keys belongs in the keyword arguments)."""
    with pytest.raises(
        UserError, match=f"config must be a TOML file's path or a RunConfig, not {type(config).__name__}"
    ):
        run_config(config, {})


def test_summary_of_a_run_with_unfinished_algorithms_names_them(finished, tmp_path):
    """A run planning two algorithms whose second never finished read back as if it held one: no word of
    the missing one (`fedistill summary` names it on stderr)."""
    copy = _copy(finished, tmp_path)
    config = copy / "config.toml"
    config.write_text(config.read_text().replace('algorithm = "fedavg"', 'algorithm = "fedavg,fediod"'))
    with pytest.warns(UserWarning, match=r"not finished \(no summary\.json\): fediod; finish with") as caught:
        result = fedistill.summary(copy)
    assert caught[0].filename == __file__  # the warning points at the caller's line, not into fedistill
    assert list(result) == ["fedavg"] and result.unfinished == ("fediod",)
    with pytest.raises(KeyError, match=r"fediod has not finished in .*: fedistill run --resume"):
        result["fediod"]
    assert finished.unfinished == ()


@pytest.mark.parametrize("device", [torch.device("cuda"), torch.device("cuda", 0), torch.device("mps")])
def test_a_torch_device_the_machine_lacks_is_one_clear_error(finished, monkeypatch, device):
    """load_model takes a device's name or a torch.device; a torch.device this machine lacks went to torch
    unchecked and failed as 'Torch not compiled with CUDA enabled' (an AssertionError), where its name gives
    a ConfigError saying what the machine has."""
    from fedistill.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="this machine has no") as exc:
        fedistill.load_model(finished.run_dir, "fedavg", device=device)
    _one_line(exc)
    assert fedistill.load_model(finished.run_dir, "fedavg", device=torch.device("cpu")).device.type == "cpu"


def test_paths_are_taken_where_a_key_is_a_folder(tmp_path):
    """`out`, `data_dir` and `cache_dir` are folders, and a Python caller holds them as Path objects:
    fedistill.run(out=tmp_path) was refused with 'out must be str, got PosixPath(...)'."""
    keys = {"out": tmp_path, "data_dir": tmp_path / "data", "cache_dir": tmp_path / "cache", "rounds": 1}
    config = run_config(None, keys)
    assert (config.out, config.data_dir, config.cache_dir) == (
        str(tmp_path),
        str(tmp_path / "data"),
        str(tmp_path / "cache"),
    )
    assert run_config(None, {"fediod": {"rounds": 2}, "out": tmp_path}).options["fediod"] == {"rounds": 2}


def test_moving_a_loaded_model_to_a_device_the_machine_lacks_is_one_clear_error(finished, monkeypatch):
    """TrainedModel.to passed its device to torch unchecked: 'cuda' on a machine without one failed as
    'Torch not compiled with CUDA enabled' and a misspelt name with torch's own parse error."""
    from fedistill.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = fedistill.load_model(finished.run_dir, "fedavg")
    for device in ("cuda", torch.device("cuda"), "gpu"):
        with pytest.raises(ConfigError, match=r"this machine has no CUDA|device must be auto") as exc:
            model.to(device)
        _one_line(exc)
    assert model.to("cpu") is model and model.device == torch.device("cpu")


def test_a_curve_of_a_metric_the_run_never_recorded_names_those_it_did(finished):
    """curve('test_acc') gave [] without a word, as if the run had recorded the metric at no round."""
    fedavg = finished["fedavg"]
    with pytest.raises(KeyError, match=r"no round of fedavg recorded 'test_acc' \(recorded: .*test_accuracy"):
        fedavg.curve("test_acc")
    assert fedavg.curve("test_accuracy")


def test_inputs_that_are_no_array_of_numbers_are_refused_in_one_line(finished):
    model = fedistill.load_model(finished.run_dir)
    for images, given in (
        ("digit.png", "a str"),  # a path where pixels belong
        (np.array(["a", "b"]), "an array of <U1"),
        (np.array([None, None]), "an array of object"),
        ([np.zeros((8, 8)), np.zeros((9, 9))], "a list"),  # images of two sizes
        (None, "a NoneType"),
    ):
        with pytest.raises(InputError, match=f"images are arrays of numbers.*got {given}") as exc:
            model.predict(images)
        _one_line(exc)


def test_a_model_file_given_for_its_run_names_the_run_to_pass(finished):
    weights = finished.run_dir / "fedavg" / "models" / "global.safetensors"
    with pytest.raises(RunDirError, match=f"is a file, not a run directory; pass the run {finished.run_dir}"):
        fedistill.load_model(weights)
    exported = fedistill.export(finished.run_dir, "fedavg", "safetensors", overwrite=True)
    with pytest.raises(RunDirError, match=f"pass the run {finished.run_dir}") as exc:
        fedistill.load_model(exported)
    _one_line(exc)
