"""`--reuse` keeps a finished run only when this code made it: the code fingerprint a summary records, and
what happens to a run another code made (reproduce/reuse.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fedistill.errors import RunDirError
from fedistill.reproduce import reuse
from fedistill.version import code_fingerprint, fingerprint_of


def package(root: Path, source: str) -> Path:
    (root / "pkg").mkdir(parents=True, exist_ok=True)
    (root / "pkg" / "mod.py").write_text(source, encoding="utf-8")
    return root / "pkg"


BASE = '"""A module."""\n\n\ndef f(x):\n    """Twice x."""\n    return 2 * x\n'


def test_the_fingerprint_ignores_comments_docstrings_and_layout_but_not_code(tmp_path):
    base = fingerprint_of(package(tmp_path / "a", BASE))
    assert len(base) == 12 and int(base, 16) >= 0
    reworded = (
        '"""Another module text."""\n# a comment\ndef f(x):  # why\n    """Doubles x."""\n\n    return 2*x\n'
    )
    assert fingerprint_of(package(tmp_path / "b", reworded)) == base
    assert fingerprint_of(package(tmp_path / "c", BASE.replace("2 * x", "3 * x"))) != base
    assert fingerprint_of(package(tmp_path / "d", BASE.replace("return", "y = 1\n    return"))) != base
    moved = package(tmp_path / "e", BASE)
    (moved / "mod.py").rename(moved / "other.py")  # the same code under another module name
    assert fingerprint_of(moved) != base
    lone = fingerprint_of(package(tmp_path / "f", 'def f():\n    """Only a docstring."""\n'))
    assert lone == fingerprint_of(package(tmp_path / "g", "def f():\n    pass\n"))


def test_an_editors_lock_file_in_the_package_changes_nothing(tmp_path):
    """Editors leave hidden files beside the module being edited (Emacs a `.#mod.py` link to nowhere, others
    a half-written `.mod.py` copy): the fingerprint read it, so every run of that installation crashed on a
    missing file or a syntax error. No hidden file is a module, so none is read."""
    base = fingerprint_of(package(tmp_path / "a", BASE))
    edited = package(tmp_path / "b", BASE)
    (edited / ".#mod.py").symlink_to(tmp_path / "user@host.1234")  # Emacs' lock: a dangling link
    (edited / ".mod.py").write_text("def f(x:\n", encoding="utf-8")  # a half-written backup
    assert fingerprint_of(edited) == base


def test_this_installation_has_one_fingerprint():
    assert code_fingerprint() == fingerprint_of(Path(reuse.__file__).parents[1])


def finished_run(out: Path, name: str, code: str | None, algorithm: str = "fedavg") -> Path:
    """A run folder as `fedistill run` leaves it, its summary recording `code` (None: no fingerprint)."""
    suite = out / name
    (suite / algorithm).mkdir(parents=True)
    (suite / "config.toml").write_text('algorithm = "fedavg"\n', encoding="utf-8")
    versions = {"fedistill": "0.1.0"} | ({} if code is None else {"code": code})
    summary = {"algorithm": algorithm, "versions": versions}
    (suite / algorithm / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return suite / algorithm / "summary.json"


def test_a_run_this_code_made_is_kept_where_it_is(tmp_path):
    path = finished_run(tmp_path, "run", code_fingerprint())
    assert reuse.current(path) and reuse.reusable(path, True)
    assert not reuse.reusable(path, False)  # without --reuse nothing is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert not reuse.kept([path, tmp_path / "run" / "standalone" / "summary.json"])  # one is missing


@pytest.mark.parametrize("code", ["0123456789ab", None])
def test_a_run_other_code_made_is_set_aside_and_named(tmp_path, caplog, monkeypatch, code):
    monkeypatch.delenv(reuse.KEEP_OTHER_CODE, raising=False)
    path = finished_run(tmp_path, "run", code)
    assert not reuse.current(path)  # nothing moves when only asked
    assert (tmp_path / "run").is_dir()
    with caplog.at_level(logging.WARNING, logger=reuse.__name__):
        assert not reuse.reusable(path, True)
    label = code or "unrecorded"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"run.other-code-{label}"]
    assert f"set aside as run.other-code-{label}" in caplog.text and reuse.KEEP_OTHER_CODE in caplog.text
    finished_run(tmp_path, "run", code)  # made again by other code, set aside beside the first
    assert not reuse.reusable(path, True)
    assert (tmp_path / f"run.other-code-{label}-2" / "fedavg" / "summary.json").is_file()


def test_the_environment_variable_keeps_runs_of_other_code_with_a_warning(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv(reuse.KEEP_OTHER_CODE, "1")
    path = finished_run(tmp_path, "run", "0123456789ab")
    with caplog.at_level(logging.WARNING, logger=reuse.__name__):
        assert reuse.reusable(path, True)
    assert "kept, though made by other code (0123456789ab" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_one_stale_algorithm_sets_the_whole_run_aside_even_after_a_missing_one(tmp_path):
    current = finished_run(tmp_path, "run", code_fingerprint())
    (tmp_path / "run" / "fediod").mkdir()
    stale = tmp_path / "run" / "fediod" / "summary.json"
    stale.write_text(json.dumps({"versions": {"code": "0123456789ab"}}), encoding="utf-8")
    missing = tmp_path / "run" / "standalone" / "summary.json"
    assert not reuse.kept([current, missing, stale])
    assert not (tmp_path / "run").exists() and (tmp_path / "run.other-code-0123456789ab").is_dir()


def test_a_summary_outside_a_run_folder_is_never_moved(tmp_path):
    (tmp_path / "loose").mkdir()
    path = tmp_path / "loose" / "summary.json"
    path.write_text(json.dumps({"versions": {"code": "0123456789ab"}}), encoding="utf-8")
    assert not reuse.reusable(path, True) and path.is_file()


def test_a_run_that_cannot_be_set_aside_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv(reuse.KEEP_OTHER_CODE, raising=False)
    path = finished_run(tmp_path, "run", "0123456789ab")

    def refuse(self, target):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "rename", refuse)
    told = r"cannot be set aside .*Permission denied.*FEDISTILL_REUSE_OTHER_CODE=1"
    with pytest.raises(RunDirError, match=told):
        reuse.reusable(path, True)


def test_the_fedmdcg_table_reuses_a_cell_only_when_its_config_still_asks_for_those_settings(tmp_path):
    """A cell's run name says dataset, method, omega, seed and rounds, not what its config file holds:
    after the config changes (here its lr), `--reuse` must run the cell again, not keep the old run."""
    import argparse

    from fedistill.config import read_config
    from fedistill.reproduce.fedmdcg_table import run_cell

    config = tmp_path / "cell.toml"
    base = 'algorithm = "fedavg"\ndataset = "digits"\nmodel = "mlp"\nclients = 3\nval_fraction = 0.0\n'
    config.write_text(base + "lr = 0.05\n", encoding="utf-8")
    args = argparse.Namespace(out=str(tmp_path / "runs"), rounds=1, reuse=True, threads=1, data_dir="data")
    run_dir = run_cell(config, "digits", "fedavg", 1.0, 0, args)
    made = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))["versions"]["code"]
    assert made == code_fingerprint() and read_config(run_dir.parent / "config.toml").lr == 0.05
    mtime = (run_dir / "summary.json").stat().st_mtime_ns
    assert run_cell(config, "digits", "fedavg", 1.0, 0, args) == run_dir  # the same settings: kept
    assert (run_dir / "summary.json").stat().st_mtime_ns == mtime
    config.write_text(base + "lr = 0.01\n", encoding="utf-8")
    assert run_cell(config, "digits", "fedavg", 1.0, 0, args) == run_dir
    assert read_config(run_dir.parent / "config.toml").lr == 0.01  # run again under the new settings
    assert (run_dir / "summary.json").stat().st_mtime_ns != mtime
