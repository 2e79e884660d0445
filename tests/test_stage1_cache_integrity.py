"""The stage-1 cache is verified: every entry is written with a sha256 record, and an entry that does not
match it (a flipped byte loads without complaint otherwise) or has none is retrained with a one-line
warning and overwritten, so the run ends exactly as a run without the cache does."""

import logging

from algorithm_helpers import TINY_FEDIOD, _results, _strip_times
from fedistill.algorithms.shared.stage1_entry import record_of
from fedistill.checksums import manifest_files, sha256_of
from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import run_suite
from fedistill.engine.rundir import read_jsonl


def _config(**changes) -> RunConfig:
    fast = {"algorithm": "fediod", "rounds": 1, "fediod": {"iters_per_epoch": 1, "samples_every": 0}}
    return build_config(RunConfig(), TINY_FEDIOD, fast, changes)


def _run(config: RunConfig, folder) -> dict:
    return run_suite(config, folder, progress=False)[0]


def _entries(tmp_path) -> list:
    return sorted((tmp_path / ".cache" / "stage1").glob("teacher-*.safetensors"))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "stage-1" in r.message]


def test_every_entry_is_written_with_its_sha256(tmp_path):
    _run(_config(), tmp_path / "first")
    entries = _entries(tmp_path)
    assert len(entries) == 3
    for entry in entries:
        assert manifest_files(record_of(entry).read_text(encoding="utf-8")) == {entry.name: sha256_of(entry)}


def test_a_flipped_byte_is_retrained_with_one_warning_and_the_results_do_not_move(tmp_path, caplog):
    uncached = _run(_config(stage1_cache=False), tmp_path / "uncached")
    _run(_config(), tmp_path / "first")
    damaged = _entries(tmp_path)[1]
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0x01  # inside the last tensor's values: the file still loads, only the checksum notices
    damaged.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        second = _run(_config(), tmp_path / "second")
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert damaged.name in warnings[0] and "does not match its checksum" in warnings[0]
    assert "training it again" in warnings[0]
    assert second["final"]["teachers_from_cache"] == 2.0
    assert _results(second["final"]) == _results(uncached["final"])
    rows = {run: read_jsonl(tmp_path / run / "fediod" / "metrics.jsonl") for run in ("uncached", "second")}
    assert _strip_times(rows["second"]) == _strip_times(rows["uncached"])
    record = manifest_files(record_of(damaged).read_text(encoding="utf-8"))
    assert record == {damaged.name: sha256_of(damaged)}  # rewritten for the retrained model
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        third = _run(_config(), tmp_path / "third")  # the entry was overwritten with the retrained model
    assert third["final"]["teachers_from_cache"] == 3.0
    assert _warnings(caplog) == []


def test_an_entry_without_its_checksum_record_is_retrained(tmp_path, caplog):
    _run(_config(), tmp_path / "first")
    entry = _entries(tmp_path)[0]
    record_of(entry).unlink()
    with caplog.at_level(logging.WARNING):
        second = _run(_config(), tmp_path / "second")
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and entry.name in warnings[0] and "no checksum record" in warnings[0]
    assert second["final"]["teachers_from_cache"] == 2.0
    assert record_of(entry).is_file()
    assert _run(_config(), tmp_path / "third")["final"]["teachers_from_cache"] == 3.0
