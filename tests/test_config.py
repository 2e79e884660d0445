"""Configuration: layering, types, unknown keys, TOML round trip."""

import pytest

from fedistill.config import (
    RunConfig,
    build_config,
    for_algorithm,
    load_toml,
    options_for,
    parse_assignment,
    read_config,
    write_config,
)
from fedistill.errors import ConfigError


def test_layers_override_in_order_and_coerce_ints_to_floats():
    config = build_config(RunConfig(), {"rounds": 3, "alpha": 1}, {"rounds": 5}, {"fedprox.mu": 0.5})
    assert config.rounds == 5
    assert config.alpha == 1.0 and isinstance(config.alpha, float)
    assert config.options == {"fedprox": {"mu": 0.5}}


def test_set_values_parse_as_toml_literals():
    assert parse_assignment("rounds=3") == ("rounds", 3)
    assert parse_assignment("alpha = 0.1") == ("alpha", 0.1)
    assert parse_assignment("dataset=mnist") == ("dataset", "mnist")
    assert parse_assignment("download=true") == ("download", True)
    assert parse_assignment("lr=1e-3") == ("lr", 0.001)
    assert parse_assignment("seed=-1") == ("seed", -1)
    assert parse_assignment("feddf.groups='resnet8,vgg9'") == ("feddf.groups", "resnet8,vgg9")
    # TOML reads these as a date and a time, which no key takes: they stay the text that was typed
    assert parse_assignment("name=2024-06-01") == ("name", "2024-06-01")
    assert parse_assignment("name=12:30:00") == ("name", "12:30:00")
    assert build_config(RunConfig(), dict([parse_assignment("name=2024-06-01")])).name == "2024-06-01"
    with pytest.raises(ConfigError, match="key=value"):
        parse_assignment("rounds")


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"roundz": 3}, "did you mean 'rounds'"),
        ({"rounds": "three"}, "rounds must be int"),
        ({"rounds": 0}, "rounds must be >= 1"),
        ({"fraction": 1.5}, "fraction must be in"),
        ({"clients": True}, "clients must be an integer"),
        (dict([parse_assignment("download=False")]), r"must be true or false \(lower case.*got 'False'"),
        (dict([parse_assignment("download=0")]), "download must be true or false .*got 0"),
        ({"augment": "maybe"}, "augment must be"),
        ({"momentum": -0.5}, "momentum must be >= 0, got -0.5"),  # torch refuses it only once clients train
        ({"weight_decay": -1}, "weight_decay must be >= 0, got -1.0"),
        ({"algorithm": "fedavg, fedprox,fedavg"}, "names an algorithm twice"),  # one folder, two table rows
        # a TOML list is the natural guess for several algorithms: say how to write them
        ({"algorithm": ["fedavg", "standalone"]}, r"one text value.*: algorithm = 'fedavg,standalone'"),
        ({"track": ["tensorboard", "mlflow"]}, r"track = 'tensorboard,mlflow'"),
    ],
)
def test_bad_keys_and_values_say_what_to_change(layer, message):
    with pytest.raises(ConfigError, match=message):
        build_config(RunConfig(), layer)


@pytest.mark.parametrize(
    ("key", "value"), [("algorithm", []), ("track", []), ("algorithm", ["fedavg", "feddf"])]
)
def test_the_line_a_list_key_written_as_a_list_is_told_to_write_works(key, value):
    """`algorithm = []` was told to write `algorithm = ''`, which is refused in turn: an empty list now
    gets the key's default, which works, as every suggestion must."""
    import re
    import tomllib

    with pytest.raises(ConfigError) as refused:
        build_config(RunConfig(), {key: value})
    line = re.search(rf"{key} = '[^']*'", str(refused.value)).group(0)
    build_config(RunConfig(), tomllib.loads(line))


def test_algorithm_options_are_checked():
    from fedistill.algorithms.classic.fedavg import FedProxOptions

    config = build_config(RunConfig(), {"fedprox": {"mu": 0.2}})
    assert options_for(config, "fedprox", FedProxOptions).mu == 0.2
    with pytest.raises(ConfigError, match=r"did you mean 'fedprox\.mu'"):
        options_for(build_config(RunConfig(), {"fedprox.muu": 1.0}), "fedprox", FedProxOptions)
    with pytest.raises(ConfigError, match="mu must be >= 0"):
        options_for(build_config(RunConfig(), {"fedprox.mu": -1.0}), "fedprox", FedProxOptions)


@pytest.mark.parametrize(
    ("algorithm", "assignment", "message"),
    [
        ("fedprox", "fedprox.mu=-1", r"^fedprox\.mu must be >= 0 and finite, got -1"),
        ("fedavg", "fedavg.mu=-1", r"^fedavg\.mu must be >= 0 and finite, got -1"),
        ("fedavgm", "fedavgm.server_momentum=1", r"^fedavgm\.server_momentum must be in \[0, 1\), got 1"),
        ("fedavgm", "fedavgm.server_lr=0", r"^fedavgm\.server_lr must be > 0 and finite, got 0"),
        ("fedprox", "fedprox.weighting='equal'", r"^fedprox\.weighting must be 'samples' or 'uniform'"),
        ("fedprox", "fedprox.aggregate_trim=0.5", r"^fedprox\.aggregate_trim must be in \[0, 0\.5\)"),
    ],
)
def test_fedavg_family_errors_name_the_section_the_user_wrote(algorithm, assignment, message):
    """FedAvg, FedProx and FedAvgM share one options class; each message names the table it came from."""
    from fedistill.algorithms.registry import get_algorithm

    config = build_config(RunConfig(), dict([parse_assignment(assignment)]))
    with pytest.raises(ConfigError, match=message):
        options_for(config, algorithm, get_algorithm(algorithm).options)


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("feddf-oneshot.steps=0", r"^feddf-oneshot\.steps must be >= 1, got 0"),
        ("fedavg-oneshot.loss='mse'", r"^fedavg-oneshot\.loss = 'mse' is a distillation key"),
        ("feddf-oneshot.teacher_epochs=0", r"^feddf-oneshot\.teacher_epochs must be >= 1, got 0"),
        ("feddf.distill_lr=0", r"^feddf\.distill_lr must be > 0"),
        ("fedavg-oneshot.section='x'", r"unknown config key 'fedavg-oneshot\.section'"),
    ],
)
def test_one_shot_errors_name_the_table_the_user_wrote(assignment, message):
    """The one-shot baselines reuse FedDF's options: their messages name their own table, not [feddf], and
    the table's name is not itself an option."""
    from fedistill.algorithms.registry import get_algorithm

    config = build_config(RunConfig(), dict([parse_assignment(assignment)]))
    algorithm = assignment.partition(".")[0]
    with pytest.raises(ConfigError, match=message):
        options_for(config, algorithm, get_algorithm(algorithm).options)


def test_one_shot_teachers_are_named_under_their_table():
    from fedistill.algorithms.one_shot.dense.options import teacher_of
    from fedistill.algorithms.registry import get_algorithm

    config = build_config(RunConfig(), {"feddf-oneshot": {"teachers": " , "}})
    options = options_for(config, "feddf-oneshot", get_algorithm("feddf-oneshot").options)
    with pytest.raises(ConfigError, match=r"^feddf-oneshot\.teachers names no model"):
        teacher_of(options, config, 1)


def test_a_common_key_no_table_may_set_says_so():
    """`[fediod] seed` is not a typo of a fediod option: the message says seed is shared by the run."""
    from fedistill.algorithms.registry import get_algorithm

    config = for_algorithm(build_config(RunConfig(), {"fediod": {"seed": 3, "lr": 0.01}}), "fediod")
    assert config.lr == 0.01
    with pytest.raises(ConfigError, match=r"^fediod\.seed: seed is a common key .* may set only augment, "):
        options_for(config, "fediod", get_algorithm("fediod").options)


def test_algorithm_tables_override_common_keys_for_that_algorithm_only():
    config = build_config(RunConfig(), {"lr": 0.1, "fedprox": {"lr": 0.01, "mu": 0.5}})
    prox = for_algorithm(config, "fedprox")
    assert prox.lr == 0.01 and prox.options["fedprox"] == {"mu": 0.5} and prox.algorithm == "fedprox"
    assert for_algorithm(config, "fedavg").lr == 0.1
    with pytest.raises(ConfigError, match="lr must be > 0"):
        for_algorithm(build_config(RunConfig(), {"fedavg.lr": -1.0}), "fedavg")
    with pytest.raises(ConfigError, match="momentum must be >= 0"):
        for_algorithm(build_config(RunConfig(), {"fedprox.momentum": -0.9}), "fedprox")


def test_toml_round_trip_and_unreadable_files(tmp_path):
    config = build_config(RunConfig(), {"rounds": 4, "fedavgm": {"server_momentum": 0.5}})
    write_config(config, tmp_path / "config.toml")
    assert read_config(tmp_path / "config.toml") == config
    (tmp_path / "bad.toml").write_text("rounds = [", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(tmp_path / "bad.toml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml(tmp_path / "missing.toml")


def test_a_device_this_machine_lacks_or_a_bad_device_name_is_a_clear_mistake(tmp_path, capsys):
    import torch

    from fedistill.cli import main

    missing = "mps" if torch.cuda.is_available() else "cuda"
    for device, says in ((missing, "this machine has no"), ("gpu", "device must be auto, cpu, cuda")):
        args = ["run", "--out", str(tmp_path), "--name", "x", "--rounds", "1", "--set", f'device="{device}"']
        code = main(args)
        assert code == 2
        assert says in capsys.readouterr().err
        assert not (tmp_path / "x").exists()


def test_devices_resolve_auto_to_something_this_machine_has():
    import torch

    from fedistill import devices

    auto = devices.resolve("auto")
    assert auto.type in ("cpu", "cuda", "mps")
    assert devices.resolve("cpu") == torch.device("cpu")
    assert devices.on_device(torch.zeros(2)).device.type == devices.current().type


def test_decoding_messages_neither_warns_nor_lets_a_repeated_warning_through_again():
    """Decoded arrays are read-only, and torch warns about each; the process-wide filter keeps that quiet
    without a `catch_warnings` block per array, which would reset the registry that shows a repeated
    warning once (torch's determinism warning on CUDA, at every backward pass)."""
    import uuid
    import warnings

    import numpy as np

    from fedistill.federation.messages import Message

    text = f"op_{uuid.uuid4().hex}_cuda does not have a deterministic implementation"
    message = Message.build(
        "query.x",
        arrays={"logits": {"z": np.ones((2, 3), np.float32)}},
        encodings={"logits": "float16-scaled"},
    )
    assert not message.array("logits", "z").flags.writeable
    with warnings.catch_warnings(record=True) as seen:
        warnings.filterwarnings("default", message=text)
        message.tensor("logits", "z")  # a run decodes its first message before its first backward pass
        for _ in range(3):
            warnings.warn(text, UserWarning, stacklevel=1)  # the same line of code each pass
            assert message.tensor("logits", "z").shape == (2, 3)
    assert [str(w.message) for w in seen] == [text]


def test_resume_may_change_only_the_device(tmp_path, capsys):
    from fedistill.cli import main

    base = ["--algorithm", "fedavg", "--rounds", "1", "--model", "mlp", "--out", str(tmp_path), "--name", "r"]
    assert main(["run", "--quiet", *base]) == 0
    assert main(["run", "--quiet", "--resume", str(tmp_path / "r"), "--device", "cpu"]) == 0
    assert main(["run", "--quiet", "--resume", str(tmp_path / "r"), "--rounds", "3"]) == 2
    assert "only --device may change" in capsys.readouterr().err


def test_partitioner_options_have_a_table_that_reaches_the_partitioner_and_survives_config_toml(tmp_path):
    """`partition` names the partitioner, so its options cannot be a `[partition]` table: one TOML file
    cannot hold both, and config.toml holds both. They go in `[partition_options]`."""
    from fedistill.engine.setup import check_sections, prepare_data
    from fedistill.errors import UserError

    (tmp_path / "run.toml").write_text(
        'dataset = "digits"\npartition = "dirichlet"\nclients = 3\n\n'
        "[partition_options]\nshuffle_within_class = false\n",
        encoding="utf-8",
    )
    config = build_config(RunConfig(), load_toml(tmp_path / "run.toml"))
    check_sections(config)
    write_config(config, tmp_path / "config.toml")
    again = read_config(tmp_path / "config.toml")
    assert again == config and again.partition == "dirichlet"
    in_file_order = prepare_data(config).split.client_train
    shuffled = prepare_data(config.replace(options={})).split.client_train
    assert any(a.tolist() != b.tolist() for a, b in zip(in_file_order, shuffled, strict=True))
    with pytest.raises(UserError, match="unknown dirichlet option 'nosuch'"):
        prepare_data(build_config(config, {"partition_options.nosuch": 1}))
    with pytest.raises(ConfigError, match=r"partitioner options go in \[partition_options\]"):
        build_config(RunConfig(), {"partition.shuffle_within_class": False})


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("fedavg.lrr=0.1", r"unknown config key 'fedavg\.lrr'; did you mean 'fedavg\.lr'\?.*fedavg\.lr, "),
        ("fedavg.roundz=2", r"did you mean 'fedavg\.rounds'\?"),
        ("fedavg.lr='abc'", r"^fedavg\.lr must be float, got 'abc'"),
        ("fedavg.rounds=0", r"^fedavg\.rounds = 0: rounds must be >= 1"),
        ("fedavg.optimizer='adamw'", r"^fedavg\.optimizer = 'adamw': optimizer must be sgd or adam"),
    ],
)
def test_a_table_key_error_names_the_table_and_offers_the_common_keys_it_may_set(assignment, message):
    """`fedavg.lr` is a key of [fedavg] like `fedavg.mu`: a typo of it is offered it, and a bad value of it
    is named as the user wrote it, not as the common `lr` they did not set."""
    from fedistill.engine.setup import resolve

    config = build_config(RunConfig(), dict([parse_assignment(assignment)]))
    with pytest.raises(ConfigError, match=message):
        resolve(config, "fedavg")


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"fraction": 1.5}, r"^fraction must be in \(0, 1\], got 1\.5$"),
        ({"val_fraction": 1.0}, r"^val_fraction must be in \[0, 1\), got 1\.0$"),
        ({"clients": 0}, r"^clients must be >= 1, got 0$"),
        ({"rounds": -2}, r"^rounds must be >= 1, got -2$"),
        ({"local_steps": -1}, r"^local_steps must be >= 0, got -1$"),
        ({"batch_size": 0}, r"^batch_size must be >= 1, got 0$"),
        ({"lr": 0}, r"^lr must be > 0, got 0\.0$"),
        ({"eval_every": 0}, r"^eval_every must be >= 1, got 0$"),
        ({"timeout": -1}, r"^timeout must be >= 0, got -1\.0$"),
        ({"optimizer": "adamw"}, r"^optimizer must be sgd or adam, got 'adamw'$"),
        ({"augment": "yes"}, r"^augment must be auto, on or off, got 'yes'$"),
        ({"val_mode": "x"}, r"^val_mode must be auto, random, tail or subjects, got 'x'$"),
        ({"transport": "grpc"}, r"^transport must be inprocess or flower, got 'grpc'$"),
        ({"group_norm_groups": 0}, r"^group_norm_groups must be >= 1, got 0$"),
    ],
)
def test_an_out_of_range_value_is_named_with_what_was_given(layer, message):
    """Every range message says the value it refused, as a typo in a long config file is otherwise hard to
    find; group_norm_groups is checked even when the model's norm does not use it."""
    with pytest.raises(ConfigError, match=message):
        build_config(RunConfig(), layer)


def test_a_text_key_set_to_digits_on_the_command_line_keeps_the_text():
    """`--set name=2024` names a run 2024, as `--name 2024` does: the key takes text, so the digits are
    not read as a number it would then refuse; a number in a config file is still a mistake."""
    assert parse_assignment("name=2024") == ("name", "2024")
    assert parse_assignment("data_dir=1.5") == ("data_dir", "1.5")
    assert build_config(RunConfig(), dict([parse_assignment("name=2024")])).name == "2024"
    assert parse_assignment("rounds=3") == ("rounds", 3)  # a number where the key takes one
    assert parse_assignment("name='quoted'") == ("name", "quoted")
    with pytest.raises(ConfigError, match="name must be str, got 2024"):
        build_config(RunConfig(), {"name": 2024})


@pytest.mark.parametrize("seed", [2**63, 2**64, 10**30, -1])
def test_a_seed_toml_cannot_carry_is_refused_naming_the_range(seed):
    """TOML integers are signed 64-bit: a larger seed was accepted and written to a config.toml that other
    TOML readers refuse (and a resume reads it back); a negative one is outside what a seed means here."""
    with pytest.raises(ConfigError, match=rf"^seed = {seed}: .*0\.\.{2**63 - 1}"):
        build_config(RunConfig(), {"seed": seed})


def test_the_largest_seed_round_trips_through_config_toml(tmp_path):
    config = build_config(RunConfig(), {"seed": 2**63 - 1})
    write_config(config, tmp_path / "config.toml")
    assert read_config(tmp_path / "config.toml").seed == 2**63 - 1


@pytest.mark.parametrize("flags", [["--seed", str(2**64)], ["--set", f"seed={2**64}"]])
def test_a_too_large_seed_is_one_line_from_the_command_line(tmp_path, capsys, flags):
    from fedistill.cli import main

    out = tmp_path / "runs"
    code = main(
        ["run", "--clients", "2", "--rounds", "1", "--model", "mlp", "--quiet", "--out", str(out), *flags]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.splitlines() == [err]
    assert err.startswith(f"fedistill: error: seed = {2**64}")
    assert not out.exists()
