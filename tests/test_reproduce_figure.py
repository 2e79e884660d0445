"""table.png: every row of a checked table shows, including one whose run gave no number."""

from __future__ import annotations

from matplotlib.figure import Figure

from fedistill.reproduce.figure import plot_checks
from fedistill.reproduce.target_spec import Column
from fedistill.reproduce.verdict import NO_RESULT, Check


def test_a_row_without_our_number_says_no_result(tmp_path, monkeypatch):
    """A failed run leaves its row with the paper's cross and the band but no dot: without a word the reader
    takes the missing dot for a drawing quirk, not for a failed check."""
    drawn = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: drawn.append(self) or save(self, *a, **k))
    column = Column("acc", "test accuracy %", ("final.test_accuracy",))
    cells = [
        Check("FedAvg", "acc", (81.0,), 81.0, 0.0, 83.0, 81.5, 2.0, -0.5, "reproduced"),
        Check("FedDF", "acc", (), None, None, 79.0, 80.0, 2.0, None, NO_RESULT),
    ]
    plot_checks(cells, [column], tmp_path / "table.png", title="t (ci)")
    (ax,) = drawn[0].axes
    texts = [t for t in ax.texts if t.get_text() == NO_RESULT]
    assert len(texts) == 1
    assert texts[0].get_position()[1] == 1  # on FedDF's row
