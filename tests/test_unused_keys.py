"""A common key an algorithm never reads is refused in that algorithm's own table, named with what decides
it instead, before the run folder exists; set at the top level it serves the suite's other algorithms."""

import logging
import re
from pathlib import Path

import pytest

from fedistill.algorithms.registry import algorithm_names, get_algorithm
from fedistill.cli import main
from fedistill.config import PER_ALGORITHM_KEYS, RunConfig, build_config
from fedistill.engine.rundir import read_jsonl
from fedistill.engine.setup import check_sections, validate_setup
from fedistill.errors import ConfigError

COMMON = {name for name in RunConfig.__dataclass_fields__ if name != "options"}
DECLARED = [
    (name, key)
    for name in algorithm_names()
    for key in get_algorithm(name).unused_keys
    if key in PER_ALGORITHM_KEYS
]


def test_every_declared_key_is_a_common_key_with_a_reason():
    for name in algorithm_names():
        for key, why in get_algorithm(name).unused_keys.items():
            assert key in COMMON, (name, key)
            assert why.format(name=name).strip(), (name, key)


def test_the_one_shot_methods_and_the_classic_baselines_declare_what_they_ignore():
    for name in ("fediod", "dense", "coboosting", "fedavg-oneshot", "feddf-oneshot", "fedkd", "asyndgan"):
        assert {"local_epochs", "local_steps", "fraction"} <= set(get_algorithm(name).unused_keys), name
    for name in ("standalone", "centralized"):
        assert set(get_algorithm(name).unused_keys) == {"fraction"}, name
    for name in ("fedavg", "fedprox", "feddf", "fedmd", "fedmdcg", "fedper", "lgfedavg", "fedgen", "flmrcm"):
        assert not get_algorithm(name).unused_keys, name


@pytest.mark.parametrize(("name", "key"), DECLARED)
def test_an_unused_key_in_the_algorithms_own_table_is_refused(name, key):
    config = build_config(RunConfig(), {"algorithm": name, name: {key: 5}})
    with pytest.raises(ConfigError, match=rf"^{re.escape(name)}\.{key} is not used by {re.escape(name)}: "):
        check_sections(config)


def test_an_unused_key_is_refused_even_in_the_table_of_an_algorithm_that_does_not_run():
    config = build_config(RunConfig(), {"algorithm": "fedavg", "dense": {"local_epochs": 5}})
    with pytest.raises(
        ConfigError, match=r"dense\.local_epochs is not used by dense: .*dense\.teacher_epochs"
    ):
        check_sections(config)


def test_the_same_key_at_the_top_level_serves_the_other_algorithms(caplog):
    config = build_config(RunConfig(), {"algorithm": "fedavg,dense", "local_epochs": 2, "clients": 2})
    with caplog.at_level(logging.INFO, logger="fedistill.engine.setup"):
        validate_setup(config)
    notes = [r.getMessage() for r in caplog.records if "is not read by" in r.getMessage()]
    assert notes == [
        "local_epochs = 2 is not read by dense (its sites train their stage-1 models once, for "
        "dense.teacher_epochs epochs)"
    ]


def test_a_key_an_algorithm_reads_stays_allowed_in_its_table():
    config = build_config(
        RunConfig(), {"algorithm": "fediod,fedavg", "fediod": {"lr": 0.01, "batch_size": 16}}
    )
    config = build_config(config, {"fedavg": {"local_epochs": 2}, "standalone": {"local_steps": 3}})
    check_sections(config)


def test_the_cli_refuses_it_in_one_line_before_the_run_folder(tmp_path, capsys):
    argv = ["run", "--algorithm", "dense", "--clients", "2", "--rounds", "1", "--quiet"]
    assert main([*argv, "--set", "dense.local_epochs=5", "--out", str(tmp_path), "--name", "a"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedistill: error: dense.local_epochs is not used by dense")
    assert "dense.teacher_epochs" in err[0]
    assert not (tmp_path / "a").exists()


#: Tiny settings of each algorithm that declares unused keys (AsynDGAN, a segmentation method, has its
#: refusal tests above), so a run takes seconds.
DENSE = {
    "teacher_epochs": 1,
    "g_steps": 1,
    "synthetic_batch_size": 8,
    "kd_batch_size": 8,
    "latent_dim": 8,
    "generator_width": 8,
    "samples_every": 0,
}
TINY = {
    "fediod": {"teacher_epochs": 1, "iters_per_epoch": 1, "synthetic_batch_size": 8, "student_steps": 1,
               "generator_width": 8, "discriminator_width": 8, "latent_dim": 8},
    "dense": DENSE,
    "coboosting": DENSE,
    "fedavg-oneshot": {"teacher_epochs": 1},
    "feddf-oneshot": {"teacher_epochs": 1, "steps": 2, "eval_every_steps": 1},
    "fedkd": {"teacher_epochs": 1, "public_size": 32},
    "standalone": {},
    "centralized": {},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(TINY))
def test_a_declared_key_changes_nothing_in_a_real_run(tmp_path, name):
    """The declaration holds: the run with every declared key changed at the top level ends exactly as
    the run without, while a key the algorithm reads (`lr`) changes it."""
    base = {"algorithm": name, "clients": 2, "rounds": 1, "model": "mlp", "threads": 1, name: TINY[name],
            "out": str(tmp_path), "stage1_cache": False}  # fmt: skip
    changed = {"local_epochs": 3, "local_steps": 2, "fraction": 0.5}
    declared = {k: v for k, v in changed.items() if k in get_algorithm(name).unused_keys}
    assert declared
    rows = []
    for run, extra in (("a", {}), ("b", declared), ("c", {"lr": 0.2})):
        path = _write(tmp_path / f"{run}.toml", base | extra)
        assert main(["run", "--quiet", "--config", str(path), "--name", run]) == 0
        metrics = read_jsonl(tmp_path / run / name / "metrics.jsonl")
        rows.append([{k: v for k, v in r.items() if not k.endswith("_s")} for r in metrics])
    assert rows[0] and rows[0] == rows[1]
    assert rows[0] != rows[2]


def _write(path: Path, layers: dict) -> Path:
    import tomli_w

    path.write_text(tomli_w.dumps(layers))
    return path


def test_a_run_folder_from_before_the_refusal_still_resumes_and_loads(tmp_path, monkeypatch, caplog):
    """A run begun before unused keys were refused, with one in its algorithm's table, could not resume:
    its config.toml was refused, and removing the key changed the settings its checkpoint was written under.
    It resumes with a warning, and its algorithm's config still resolves (for inference, a model card)."""
    from algorithm_helpers import run_until_crash
    from fedistill.algorithms.fedmd.fedkd import FedKDServer
    from fedistill.engine import setup
    from fedistill.engine.launch import resume_suite

    config = build_config(
        RunConfig(),
        {"algorithm": "fedkd", "clients": 2, "rounds": 2, "model": "mlp", "stage1_cache": False},
        {"fedkd": {**TINY["fedkd"], "local_epochs": 3}},
    )
    with monkeypatch.context() as older_code:  # the code that began the run did not refuse it
        older_code.setattr(setup, "refuse_unused", lambda *args, **kwargs: None)
        run_until_crash(config, FedKDServer, tmp_path, crash_round=2)
    assert setup.resolve(config, "fedkd").config.local_epochs == 3
    with caplog.at_level(logging.WARNING):
        assert resume_suite(tmp_path, progress=False)[0]["rounds_done"] == 2
    assert "fedkd.local_epochs is not used by fedkd" in caplog.text
