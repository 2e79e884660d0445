"""Stage-1 models are trained once: a later run that needs exactly the same local models loads them
from the sites' cache, ends with exactly the same results, and says so in its summary."""

import logging

from algorithm_helpers import TINY_FEDIOD, _strip_times
from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import run_suite
from fedistill.engine.rundir import read_jsonl

VOLATILE = {"teachers_from_cache"}


def _config(**changes) -> RunConfig:
    fast = {"algorithm": "fediod", "rounds": 1, "fediod": {"iters_per_epoch": 1, "samples_every": 0}}
    return build_config(RunConfig(), TINY_FEDIOD, fast, changes)


def _run(config: RunConfig, folder) -> dict:
    return run_suite(config, folder, progress=False)[0]


def _same_results(a: dict, b: dict) -> bool:
    keep = lambda final: {k: v for k, v in final.items() if k not in VOLATILE}  # noqa: E731
    return keep(a["final"]) == keep(b["final"])


def test_a_second_run_reuses_the_teachers_and_ends_identically(tmp_path):
    first = _run(_config(), tmp_path / "first")
    second = _run(_config(), tmp_path / "second")
    assert first["final"]["teachers_from_cache"] == 0.0
    assert second["final"]["teachers_from_cache"] == 3.0
    assert _same_results(first, second)
    rows = {run: read_jsonl(tmp_path / run / "fediod" / "metrics.jsonl") for run in ("first", "second")}
    assert _strip_times(rows["first"]) == _strip_times(rows["second"])
    assert len(list((tmp_path / ".cache" / "stage1").glob("teacher-*.safetensors"))) == 3
    assert "teachers_from_cache | 3.0" in (tmp_path / "second" / "fediod" / "summary.md").read_text()


def test_other_training_options_or_seed_train_afresh(tmp_path):
    _run(_config(), tmp_path / "a")
    longer = _run(_config(fediod={"teacher_epochs": 3}), tmp_path / "b")
    reseeded = _run(_config(seed=1), tmp_path / "c")
    assert longer["final"]["teachers_from_cache"] == 0.0
    assert reseeded["final"]["teachers_from_cache"] == 0.0
    assert len(list((tmp_path / ".cache" / "stage1").glob("*.safetensors"))) == 9


def test_another_augmentation_trains_afresh(tmp_path):
    """The augmentation's parameters live in the dataset's description, not in the training options: a
    run that crops with padding must not load the teachers a run without it trained."""
    _run(_config(augment="on"), tmp_path / "plain")  # digits: "on" without a padding crops nothing
    padded = _run(_config(augment="on", digits={"crop_padding": 1}), tmp_path / "padded")
    again = _run(_config(augment="on", digits={"crop_padding": 1}), tmp_path / "again")
    assert padded["final"]["teachers_from_cache"] == 0.0
    assert again["final"]["teachers_from_cache"] == 3.0
    assert _same_results(padded, again)
    assert len(list((tmp_path / ".cache" / "stage1").glob("*.safetensors"))) == 6


def test_another_thread_count_trains_afresh(tmp_path):
    """Thread counts change float rounding: a cached model must be the one this run would train."""
    import torch

    _run(_config(), tmp_path / "one-thread")
    before = torch.get_num_threads()
    try:
        two = _run(_config(threads=2), tmp_path / "two-threads")
    finally:
        torch.set_num_threads(before)
    assert two["final"]["teachers_from_cache"] == 0.0
    assert len(list((tmp_path / ".cache" / "stage1").glob("*.safetensors"))) == 6


def test_another_kernel_path_trains_afresh(tmp_path, monkeypatch):
    """The CPU's kernel path (AVX-512, AVX2, SSE4.1; `ATEN_CPU_CAPABILITY`, oneDNN's `ONEDNN_MAX_CPU_ISA`)
    changes float rounding as a thread count does: a run under another path must not load the teachers
    the first path trained, or its record names kernels its teachers were not trained with."""
    import os

    import torch

    _run(_config(), tmp_path / "native")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "OTHER")
    other = _run(_config(), tmp_path / "other-kernels")
    cap = "AVX2" if os.environ.get("ONEDNN_MAX_CPU_ISA") == "SSE41" else "SSE41"  # not the one in use
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    capped = _run(_config(), tmp_path / "capped-onednn")
    assert other["final"]["teachers_from_cache"] == 0.0
    assert capped["final"]["teachers_from_cache"] == 0.0
    assert len(list((tmp_path / ".cache" / "stage1").glob("*.safetensors"))) == 9


def test_the_cache_can_be_turned_off_or_moved(tmp_path):
    _run(_config(stage1_cache=False), tmp_path / "off")
    assert not (tmp_path / ".cache").exists()
    elsewhere = tmp_path / "shared-cache"
    _run(_config(cache_dir=str(elsewhere)), tmp_path / "moved-1")
    again = _run(_config(cache_dir=str(elsewhere)), tmp_path / "moved-2")
    assert again["final"]["teachers_from_cache"] == 3.0
    assert not (tmp_path / ".cache").exists()


def test_a_damaged_cache_file_is_retrained_with_a_warning(tmp_path, caplog):
    first = _run(_config(), tmp_path / "first")
    damaged = sorted((tmp_path / ".cache" / "stage1").glob("*.safetensors"))[0]
    damaged.write_bytes(damaged.read_bytes()[:100])
    with caplog.at_level(logging.WARNING):
        second = _run(_config(), tmp_path / "second")
    assert "unusable" in caplog.text
    assert second["final"]["teachers_from_cache"] == 2.0
    assert _same_results(first, second)
    third = _run(_config(), tmp_path / "third")  # the damaged file was replaced by the retrained model
    assert third["final"]["teachers_from_cache"] == 3.0


def test_the_model_options_are_part_of_the_cache_key():
    """`[model_options]` builds another model under the same name (DistilBERT from another folder, a wider
    net): it must not load the entry a run without them trained. No options leave the key as it was."""
    from types import SimpleNamespace

    import torch

    from fedistill.algorithms.shared.stage1 import stage1_key
    from fedistill.algorithms.shared.training import LocalTraining
    from fedistill.data.base import DatasetInfo, ImageSet

    info = DatasetInfo("synthetic", 1, 8, 10, (0.5,), (0.5,))
    data = ImageSet(torch.zeros(4, 1, 8, 8, dtype=torch.uint8), torch.arange(4))

    def key(**changes) -> str:
        config = build_config(RunConfig(), changes)
        ctx = SimpleNamespace(config=config, train=data, info=info, client_id=0)
        return stage1_key(ctx, "cnn", LocalTraining.from_config(config, info), "teacher")

    plain = key()
    assert key(model_options={}) == plain
    assert key(model_options={"width": 8}) != plain
    assert key(model_options={"width": 8}) != key(model_options={"width": 32})


def test_another_gpu_model_trains_afresh(monkeypatch):
    """On CUDA the GPU model and the cuDNN version change float rounding as a CPU's kernel path does: a
    cache folder shared by two machines must not hand one GPU's teachers to a run on another. A CPU run's
    key does not depend on them."""
    from types import SimpleNamespace

    import torch

    from fedistill.algorithms.shared import stage1
    from fedistill.algorithms.shared.training import LocalTraining
    from fedistill.data.base import DatasetInfo, ImageSet

    info = DatasetInfo("synthetic", 1, 8, 10, (0.5,), (0.5,))
    data = ImageSet(torch.zeros(4, 1, 8, 8, dtype=torch.uint8), torch.arange(4))
    config = build_config(RunConfig(), {})
    ctx = SimpleNamespace(config=config, train=data, info=info, client_id=0)
    spec = LocalTraining.from_config(config, info)
    gpu = {"name": "GPU A", "cudnn": 90100}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: gpu["name"])
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: gpu["cudnn"])
    cpu = stage1.stage1_key(ctx, "cnn", spec, "teacher")
    gpu["name"] = "GPU B"
    assert stage1.stage1_key(ctx, "cnn", spec, "teacher") == cpu  # no GPU in a CPU run's key

    monkeypatch.setattr(stage1.devices, "current", lambda: torch.device("cuda", 0))
    keys = {}
    for name, cudnn in (("GPU A", 90100), ("GPU B", 90100), ("GPU A", 90300)):
        gpu.update(name=name, cudnn=cudnn)
        keys[(name, cudnn)] = stage1.stage1_key(ctx, "cnn", spec, "teacher")
    assert len(set(keys.values())) == 3


def test_other_code_trains_afresh(monkeypatch):
    """A teacher trained by other code (another fedistill version, a local change to training) is not the
    one this code would train: the code's fingerprint is part of the key, so a shared cache folder never
    hands it over, and a comparison rerun after a change distils freshly trained teachers."""
    from types import SimpleNamespace

    import torch

    from fedistill.algorithms.shared import stage1
    from fedistill.algorithms.shared.training import LocalTraining
    from fedistill.data.base import DatasetInfo, ImageSet

    info = DatasetInfo("synthetic", 1, 8, 10, (0.5,), (0.5,))
    data = ImageSet(torch.zeros(4, 1, 8, 8, dtype=torch.uint8), torch.arange(4))
    config = build_config(RunConfig(), {})
    ctx = SimpleNamespace(config=config, train=data, info=info, client_id=0)
    spec = LocalTraining.from_config(config, info)
    monkeypatch.setattr(stage1, "code_fingerprint", lambda: "0123456789ab")
    this = stage1.stage1_key(ctx, "cnn", spec, "teacher")
    monkeypatch.setattr(stage1, "code_fingerprint", lambda: "ba9876543210")
    assert stage1.stage1_key(ctx, "cnn", spec, "teacher") != this
