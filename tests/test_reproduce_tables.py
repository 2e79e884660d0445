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
