"""A key written in the wrong place (an algorithm's or a dataset's option at the top level, an option in
another algorithm's table) is refused in one line that names the table where it lives and how to write
it there, from the command line, a config file, `--set`, Flower's run config and `fedistill.run`; a
misspelt key still gets its did-you-mean."""

from pathlib import Path

import pytest

import fedistill
from fedistill.cli import main
from fedistill.errors import ConfigError

FAST = ["--clients", "2", "--rounds", "1", "--model", "mlp", "--quiet"]


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    """The one line `fedistill run` ends with; nothing was written."""
    assert main(["run", *FAST, "--out", str(tmp_path), "--name", "a", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert not (tmp_path / "a").exists()
    return err


@pytest.mark.parametrize(
    ("assignment", "expected"),
    [
        ("teacher_epochs=1", "it is an option of fediod (and of "),
        ("teacher_epochs=1", "write fediod.teacher_epochs=1 or put it under [fediod]"),
        ("preset=paper", 'write fediod.preset="paper" or put it under [fediod]'),
        ("lr_student=0.01", "write fediod.lr_student=0.01 or put it under [fediod]"),
    ],
)
def test_an_algorithm_option_at_the_top_level_names_its_table(tmp_path, capsys, assignment, expected):
    err = _refused(tmp_path, capsys, "--algorithm", "fedavg,fediod", "--set", assignment)
    key = assignment.partition("=")[0]
    assert f"unknown config key {key!r}: " in err
    assert expected in err
    assert "did you mean" not in err  # not local_epochs: the key exists, in another table


def test_the_run_s_own_algorithm_is_the_table_it_names(tmp_path, capsys):
    """dense takes teacher_epochs too: a run of dense is pointed at [dense], fediod named among the rest."""
    err = _refused(tmp_path, capsys, "--algorithm", "fedavg,dense", "--set", "teacher_epochs=2")
    assert "it is an option of dense (and of fediod" in err
    assert "write dense.teacher_epochs=2 or put it under [dense]" in err


def test_an_option_of_no_running_algorithm_says_so(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--algorithm", "fedavg", "--set", "teacher_epochs=1")
    assert "none of which this run uses (algorithm = 'fedavg', dataset = 'digits')" in err
    assert "fediod.teacher_epochs=1" in err


def test_a_dataset_option_at_the_top_level_names_the_dataset_s_table(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--algorithm", "fedavg", "--dataset", "brats", "--set", "image_size=64")
    assert "unknown config key 'image_size': it is an option of brats (and of " in err
    assert "write brats.image_size=64 or put it under [brats]" in err
    assert "did you mean" not in err  # not batch_size


def test_a_dataset_named_by_an_alias_is_the_table_it_names(tmp_path, capsys):
    """`dataset = "fmnist"` spells fashion-mnist: its table is the run's, under the name the run uses."""
    err = _refused(tmp_path, capsys, "--algorithm", "fedavg", "--dataset", "fmnist", "--set", "image_size=28")
    assert "it is an option of fmnist (and of " in err and "this run uses" not in err
    assert "write fmnist.image_size=28 or put it under [fmnist]" in err


@pytest.mark.parametrize("dataset", ["fmnist", "fashion-mnist"])
def test_a_common_key_in_an_alias_table_names_the_table_as_written(tmp_path, capsys, dataset):
    """`[fmnist] rounds = 3` was refused as `fashion-mnist.rounds ... outside [fashion-mnist]`, a table the
    config never wrote, while `[fmnist]` itself is accepted as the dataset's table: the line names the
    table as written and says whose alias it is."""
    err = _refused(
        tmp_path, capsys, "--algorithm", "fedavg", "--dataset", dataset, "--set", "fmnist.rounds=3"
    )
    assert err.startswith("fedistill: error: fmnist.rounds: rounds is a common key"), err
    assert "[fmnist] is the table of dataset fashion-mnist" in err
    assert "outside [fmnist]" in err and "[fashion-mnist]" not in err


def test_a_model_option_at_the_top_level_names_model_options(tmp_path, capsys):
    """[model_options] is a table of every run: no "this run does not use" for it."""
    err = _refused(tmp_path, capsys, "--algorithm", "fedavg", "--set", "width=2")
    assert err.endswith(
        "unknown config key 'width': it is an option of model_options: write model_options.width=2 or put it "
        "under [model_options]"
    )


def test_a_partitioner_option_at_the_top_level_names_partition_options(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--algorithm", "fedavg", "--set", "min_size=5")
    assert err.endswith(
        "unknown config key 'min_size': it is an option of partition_options: write "
        "partition_options.min_size=5 or put it under [partition_options]"
    )


def test_a_top_level_key_in_a_config_file_names_its_table(tmp_path, capsys):
    config = tmp_path / "experiment.toml"
    config.write_text('algorithm = "fediod"\nteacher_epochs = 1\n')
    err = _refused(tmp_path, capsys, "--config", str(config))
    assert "unknown config key 'teacher_epochs': it is an option of fediod" in err
    assert "put it under [fediod]" in err


def test_a_misspelt_top_level_key_keeps_its_did_you_mean(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--algorithm", "fedavg", "--set", "lrr=0.1")
    assert "unknown config key 'lrr'; did you mean 'lr'?" in err


def test_the_python_api_names_the_table_too(tmp_path):
    with pytest.raises(ConfigError, match=r"write fediod\.teacher_epochs=1 or put it under \[fediod\]"):
        fedistill.run(algorithm="fediod", teacher_epochs=1, out=tmp_path, name="a", quiet=True)
    assert not (tmp_path / "a").exists()


def test_flower_s_run_config_names_the_table_too():
    pytest.importorskip("flwr")
    from fedistill.engine.flower.apps import config_from_run_config

    with pytest.raises(ConfigError, match=r"write fediod\.teacher_epochs=1 or put it under \[fediod\]"):
        config_from_run_config({"algorithm": "fediod", "set": "teacher_epochs=1"})


# --- an option in another algorithm's table ---------------------------------------------------------------
def test_an_option_in_another_algorithm_s_table_names_the_table_that_takes_it(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--algorithm", "fedavg,fediod", "--set", "fedavg.teacher_epochs=1")
    assert err.endswith(
        "unknown config key 'fedavg.teacher_epochs': fedavg has no option teacher_epochs; it is an option of "
        "fediod (and of fedkd, dense, fedavg-oneshot and 2 more): write fediod.teacher_epochs=1 or put it "
        "under [fediod]"
    )


def test_a_wrong_table_in_a_config_file_names_the_right_one(tmp_path, capsys):
    config = tmp_path / "experiment.toml"
    config.write_text('algorithm = "fedavg,fediod"\n[fedavg]\npreset = "paper"\n')
    err = _refused(tmp_path, capsys, "--config", str(config))
    assert "fedavg has no option preset; it is an option of fediod" in err
    assert 'write fediod.preset="paper" or put it under [fediod]' in err


def test_a_dataset_option_in_an_algorithm_s_table_names_the_dataset(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--algorithm", "fedavg", "--set", "fedavg.crop_padding=2")
    assert "fedavg has no option crop_padding; it is an option of digits" in err
    assert "put it under [digits]" in err


def test_a_misspelt_table_key_keeps_its_did_you_mean(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--algorithm", "fedavg", "--set", "fedavg.lrr=0.1")
    assert "unknown config key 'fedavg.lrr'; did you mean 'fedavg.lr'?" in err


def test_the_python_api_names_the_right_table_for_a_table_key(tmp_path):
    with pytest.raises(ConfigError, match=r"fedavg has no option teacher_epochs; it is an option of fediod"):
        fedistill.run(algorithm="fedavg", fedavg={"teacher_epochs": 1}, out=tmp_path, name="a", quiet=True)
    assert not (tmp_path / "a").exists()


# --- an algorithm's option or a common key in the dataset's table -------------------------------------------
def test_an_algorithm_option_in_the_dataset_s_table_names_the_algorithm(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--algorithm", "fediod", "--set", "digits.teacher_epochs=1")
    assert err.endswith(
        "unknown config key 'digits.teacher_epochs': dataset digits has no option teacher_epochs; it is an "
        "option of fediod (and of fedkd, dense, fedavg-oneshot and 2 more): write fediod.teacher_epochs=1 or "
        "put it under [fediod]"
    )


def test_a_common_key_in_the_dataset_s_table_is_sent_to_the_top_level(tmp_path, capsys):
    config = tmp_path / "experiment.toml"
    config.write_text('algorithm = "fedavg"\n[digits]\nrounds = 3\n')
    err = _refused(tmp_path, capsys, "--config", str(config))
    assert err.endswith(
        "digits.rounds: rounds is a common key, not an option of dataset digits: write rounds=3 at the top "
        "level, outside [digits]"
    )


def test_an_unknown_key_of_the_dataset_s_table_keeps_the_dataset_s_message(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "--algorithm", "fedavg", "--set", "digits.nosuch=1")
    assert "dataset 'digits' does not take option(s) nosuch; it takes crop_padding" in err
