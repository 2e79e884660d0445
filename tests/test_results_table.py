"""The results table every run prints, and the image grids runs save."""

import numpy as np
from PIL import Image

from fedistill.engine.summary import human_bytes, results_rows, summary_markdown
from fedistill.federation.ledger import DOWN, UP
from fedistill.plots import plot_image_grid


def _summary(algorithm: str, final: dict) -> dict:
    traffic = {"total_bytes": 2048, "per_kind": {"parameters": 1024}, "per_client": {}}
    return {
        "algorithm": algorithm,
        "federated": True,
        "final": final,
        "rounds": 3,
        "wall_time_s": 1.25,
        "communication": {UP: traffic, DOWN: traffic},
    }


def test_one_shot_runs_get_an_of_ensemble_column_and_the_others_a_dash():
    rows = results_rows(
        [
            _summary("fediod", {"test_accuracy": 0.87, "fraction_of_ensemble": 0.9021}),
            _summary("fedavg", {"test_accuracy": 0.97, "local_accuracy": 0.9}),
        ]
    )
    assert list(rows[0]).index("of ensemble") == list(rows[0]).index("test %") + 1
    assert rows[0]["of ensemble"] == "0.90" and rows[1]["of ensemble"] == "-"
    assert rows[0]["test %"] == "87.00" and rows[1]["local %"] == "90.00"
    # no one-shot run in the table: no such column
    assert "of ensemble" not in results_rows([_summary("fedavg", {"test_accuracy": 0.97})])[0]


def test_the_image_grid_is_one_mosaic_with_every_image_in_its_cell(tmp_path):
    images = np.zeros((10, 1, 8, 8), np.float32)
    images[3] = 0.5  # one grey image among black ones: row 0, column 3 of a 4-column, 3-row grid
    path = plot_image_grid(images, tmp_path / "grid.png", columns=4)
    pixels = np.asarray(Image.open(path).convert("L"), np.float32)
    height, width = pixels.shape
    assert width > height  # 4 columns by 3 rows of square cells
    grey_rows, grey_columns = np.nonzero((pixels > 100) & (pixels < 160))
    assert grey_columns.min() > 0.7 * width and grey_rows.max() < 0.4 * height
    black_rows, black_columns = np.nonzero(pixels < 30)
    assert black_rows.max() > 0.6 * height and black_columns.min() < 0.1 * width
    labelled = plot_image_grid(
        np.random.rand(4, 3, 8, 8), tmp_path / "rgb.png", labels=list("abcd"), columns=2
    )
    assert Image.open(labelled).size[0] > 0


def test_byte_columns_count_in_powers_of_1000_as_every_other_mb_the_project_prints():
    """The demo's FedAvg sent 12,874,400 bytes: 12.9 MB, as its README and demos record say (bytes / 1e6),
    not 12.3 (bytes / 1024**2 under the name MB)."""
    summary = _summary("fedavg", {"test_accuracy": 0.97})
    summary["communication"][UP] = {
        "total_bytes": 12_874_400,
        "per_kind": {"parameters": 12_873_440, "metrics": 960},
        "per_client": {},
    }
    (row,) = results_rows([summary])
    assert row["up"] == "12.9 MB" and row["params up"] == "12.9 MB"
    assert human_bytes(999) == "999 B" and human_bytes(772_464) == "772.5 KB"
    assert human_bytes(1_500_000_000) == "1.5 GB"


def test_summary_md_shows_a_small_final_value_not_as_zero():
    """summary.md printed every final metric to four decimals: a DP run's `dp_delta` of 1e-05 read 0.0000,
    as would any NMSE or loss under 0.00005. Such a value keeps three significant digits now."""
    final = {"test_accuracy": 0.95, "dp_delta": 1e-05, "test_nmse": 0.000234, "zero": 0.0}
    summary = _summary("fedavg", final)
    summary |= {
        "dataset": "digits",
        "description": "FedAvg",
        "model": "mlp",
        "clients": 3,
        "seed": 0,
        "partition": {"method": "iid", "alpha": 0.5, "hash": "0" * 64},
        "peak_memory_mb": 1.0,
        "dropped_clients": {},
        "versions": {},
    }
    text = summary_markdown(summary)
    assert "| test_accuracy | 0.9500 |" in text and "| zero | 0.0000 |" in text
    assert "| dp_delta | 1e-05 |" in text and "| test_nmse | 0.000234 |" in text


def test_a_table_wider_than_120_columns_is_printed_whole_into_a_file_or_pipe(capsys):
    """Into a log or a pipe the table was printed 120 columns wide, whatever it needed: the
    reconstruction demo's table (its floor row's long label) came out with cut cells, `0.8117 ± 0.0…`."""
    from fedistill.engine.summary import print_results

    long_name = "a method whose name alone takes most of a line of the results table"
    final = {"test_accuracy": 0.8117, "test_accuracy_std": 0.0123, "local_accuracy": 0.9}
    print_results([_summary(long_name, final), _summary("fedavg", {"test_accuracy": 0.97})])
    out = capsys.readouterr().out
    assert "…" not in out and long_name in out and "81.17 ± 1.23" in out


def test_summary_md_and_results_md_give_alpha_only_for_a_partition_that_draws_with_it(tmp_path):
    """An iid or natural split ignores alpha: "iid (alpha 0.5)" read as if the split were skewed."""
    from fedistill.engine.summary import write_suite_results

    base = _summary("fedavg", {"test_accuracy": 0.95}) | {
        "dataset": "digits",
        "description": "FedAvg",
        "model": "mlp",
        "clients": 3,
        "seed": 0,
        "peak_memory_mb": 1.0,
        "dropped_clients": {},
        "versions": {},
    }
    for method, shown in (
        ("iid", "- partition: iid, hash"),
        ("dirichlet", "- partition: dirichlet (alpha 0.5), hash"),
    ):
        summary = base | {"partition": {"method": method, "alpha": 0.5, "hash": "0" * 64}}
        assert shown in summary_markdown(summary)
        write_suite_results(tmp_path, [summary], {"fedavg": [{"round": 1, "test_accuracy": 0.95}]})
        first = (tmp_path / "results.md").read_text().splitlines()[0]
        expected = "iid, seed 0" if method == "iid" else "dirichlet alpha 0.5, seed 0"
        assert first == f"# Results: digits, 3 clients, {expected}"


def test_results_md_counts_the_federation_s_clients_when_a_pooled_run_comes_first(tmp_path):
    """Centralized trains one pooled client: a suite listing it first was headed "digits, 1 clients"."""
    from fedistill.engine.summary import write_suite_results

    def summary(algorithm: str, federated: bool, clients: int) -> dict:
        return _summary(algorithm, {"test_accuracy": 0.9}) | {
            "federated": federated,
            "dataset": "digits",
            "clients": clients,
            "seed": 0,
            "partition": {"method": "dirichlet", "alpha": 0.5, "hash": "0" * 64},
        }

    curves = {name: [{"round": 1, "test_accuracy": 0.9}] for name in ("centralized", "fedavg")}
    write_suite_results(tmp_path, [summary("centralized", False, 1), summary("fedavg", True, 3)], curves)
    assert (tmp_path / "results.md").read_text().startswith("# Results: digits, 3 clients, dirichlet")
    write_suite_results(tmp_path, [summary("centralized", False, 1)], {"centralized": curves["centralized"]})
    assert (tmp_path / "results.md").read_text().startswith("# Results: digits, 1 client, dirichlet")


def test_summary_md_folds_the_per_client_traffic_of_a_large_federation_into_a_spread():
    """One row per client and content kind made a 1,000-site run's summary.md thousands of lines long:
    past `PER_CLIENT_ROWS` clients it gives each kind's spread over the clients instead (summary.json keeps
    every client)."""
    from fedistill.engine.summary import PER_CLIENT_ROWS

    def run(clients: int) -> str:
        up = {str(c): {"logits": 100 * (c + 1), "metrics": 8} for c in range(clients)}
        summary = _summary("fediod", {"test_accuracy": 0.9})
        summary["communication"] = {
            UP: {"total_bytes": 0, "per_kind": {"logits": 1}, "per_client": up},
            DOWN: {"total_bytes": 0, "per_kind": {}, "per_client": {"0": {"inputs": 5}}},
        }
        summary |= {
            "dataset": "digits", "description": "FedIOD", "model": "mlp", "clients": clients, "seed": 0,
            "partition": {"method": "iid", "alpha": 0.5, "hash": "0" * 64}, "peak_memory_mb": 1.0,
            "dropped_clients": {}, "versions": {},
        }  # fmt: skip
        return summary_markdown(summary)

    small = run(PER_CLIENT_ROWS)
    assert f"| {UP} | {PER_CLIENT_ROWS - 1} | logits | {100 * PER_CLIENT_ROWS:,} |" in small
    large = run(1000)
    assert len(large.splitlines()) < 60
    assert "| direction | kind | clients | min | median | max (client) |" in large
    assert f"| {UP} | logits | 1,000 | 100 | 50,050 | 100,000 (999) |" in large
    assert (
        f"| {UP} | metrics | 1,000 | 8 | 8 | 8 (0) |" in large
        and f"| {DOWN} | inputs | 1 | 5 | 5 | 5 (0) |" in large
    )
