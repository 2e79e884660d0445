"""`threads` is checked once, in the config's own validation: every transport refuses a negative count
with the same one line and exit 2 before anything starts (Flower's nodes used to fail one by one)."""

import pytest

from fedistill.cli import main
from fedistill.config import RunConfig, build_config
from fedistill.errors import ConfigError

FAST = ["--clients", "3", "--rounds", "1", "--model", "mlp", "--quiet"]


@pytest.mark.parametrize("transport", ["inprocess", "flower"])
def test_a_negative_thread_count_is_one_line_and_exit_2_on_every_transport(tmp_path, capsys, transport):
    out = tmp_path / "runs"
    code = main(["run", *FAST, "--out", str(out), "--set", "threads=-1", "--set", f"transport='{transport}'"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.splitlines() == [err]
    assert err.startswith("fedistill: error: threads = -1") and "positive" in err
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize("value", [0, 1, 4])
def test_zero_is_the_default_and_positive_counts_are_counts(value):
    assert build_config(RunConfig(), {"threads": value}).threads == value


@pytest.mark.parametrize("value", [-1, -8, 1.5, "two", True])
def test_anything_else_is_refused(value):
    with pytest.raises(ConfigError, match="threads"):
        build_config(RunConfig(), {"threads": value})


def test_an_absurd_thread_count_is_one_line_before_anything_starts(tmp_path, capsys):
    """threads=100000 started that many OS threads and crashed later inside matplotlib's import."""
    out = tmp_path / "runs"
    code = main(["run", *FAST, "--out", str(out), "--set", "threads=100000"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.splitlines() == [err]
    assert err.startswith("fedistill: error: threads = 100000") and "1024" in err
    assert not out.exists()


def test_the_bound_does_not_depend_on_this_machine():
    """A run made on a large machine resumes on a small one: the bound is fixed, not the core count."""
    assert build_config(RunConfig(), {"threads": 1024}).threads == 1024
    with pytest.raises(ConfigError, match="threads = 1025"):
        build_config(RunConfig(), {"threads": 1025})
