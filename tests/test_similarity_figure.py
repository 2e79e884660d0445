"""The similarity study's figure: the DLG contrast stays on the figure when one client has none."""

from __future__ import annotations

import math

from matplotlib.figure import Figure

from fedistill.reproduce.similarity_report import plot


def _fediod(scale: float) -> dict[str, float]:
    keys = ("fid_synthetic", "fid_held_out", "pixel_nn_mean_synthetic", "pixel_nn_mean_held_out")
    return {k: scale * (i + 1) for i, k in enumerate(keys)} | {"memorised_pixel": 0.0}


def test_dlg_bars_stay_for_the_clients_that_have_them(tmp_path, monkeypatch):
    """A client too small for DLG (fewer than 2 private images) used to drop the DLG series from every
    client's panel without a word; the others keep their bars, and the legend counts the clients covered."""
    drawn = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: drawn.append(self) or save(self, *a, **k))
    dlg = {"similarity": {"pixel_nn_mean": 0.01, "memorised_pixel": 1.0}}
    results = [
        {"client": 0, "fediod": _fediod(1.0), "dlg": dlg},
        {"client": 1, "fediod": _fediod(2.0)},
        {"client": 2, "fediod": _fediod(3.0), "dlg": dlg},
    ]
    data = {"runs": [{"label": "run", "fid_synthetic_to_held_out": 5.0, "results": results}]}
    plot(data, tmp_path / "similarity.png")
    _, distance, share = drawn[0].axes
    for ax in (distance, share):
        (bars,) = [c for c in ax.containers if c.get_label().startswith("FedAvg + DLG")]
        heights = [b.get_height() for b in bars]
        assert heights[0] > 0 and math.isnan(heights[1]) and heights[2] > 0
        assert bars.get_label() == "FedAvg + DLG (2 of 3 clients)"
