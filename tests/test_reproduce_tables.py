"""The reproductions' result files: a table is replaced whole or not at all."""

from __future__ import annotations

import pathlib

import pytest

from fedistill.reproduce.tables import write_table


def test_a_write_stopped_half_way_leaves_the_previous_table_whole(tmp_path, monkeypatch):
    write_table(tmp_path, "table", ["# old"], {"old": True})
    real = pathlib.Path.write_text

    def half_then_interrupt(self, text, *args, **kwargs):
        real(self, text[: len(text) // 2], *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(pathlib.Path, "write_text", half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_table(tmp_path, "table", ["# a new table, longer than the old one"], {"new": [1, 2, 3]})
    monkeypatch.undo()
    assert (tmp_path / "table.md").read_text(encoding="utf-8") == "# old\n"
    assert (tmp_path / "table.json").read_text(encoding="utf-8") == '{\n  "old": true\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.json", "table.md"]


def test_rewriting_the_expected_values_keeps_the_notes_between_their_entries(tmp_path):
    from fedistill.reproduce.expected import read_expected, write_expected
    from fedistill.reproduce.paths import EXPECTED

    path = tmp_path / "expected.toml"
    path.write_text(EXPECTED.read_text(encoding="utf-8"), encoding="utf-8")
    write_expected(read_expected(path), path)  # as `fedmdcg_table.py --update-expected` does
    notes = [line for line in EXPECTED.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
    assert [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")] == notes
    assert read_expected(path) == read_expected(EXPECTED)
