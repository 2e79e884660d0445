"""What a researcher's own algorithm gets from the run's checks by declaring it, without writing the check:
a misspelt model in an option its `model_keys` names, and a registration that names a key that does not
exist, are each named clearly instead of surfacing as a misleading message or a traceback."""

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import pytest

from fedistill.algorithms.base import ALGORITHMS, Algorithm, register
from fedistill.algorithms.registry import get_algorithm
from fedistill.cli import main


@dataclass(frozen=True)
class StudentOptions:
    """An options class that names a model and checks nothing itself."""

    student: str = ""
    """The student's model ('' = the run's model)."""

    model_keys: ClassVar[str] = "student"


@pytest.fixture
def restore_registry():
    before = dict(ALGORITHMS)
    yield
    ALGORITHMS.clear()
    ALGORITHMS.update(before)


def _fedavg_with(options: type = StudentOptions, **changes) -> Algorithm:
    return dataclasses.replace(get_algorithm("fedavg"), name="own", options=options, **changes)


def test_a_misspelt_model_in_an_own_algorithms_model_key_is_named_as_unknown(
    tmp_path, capsys, restore_registry
):
    register(_fedavg_with())
    argv = [
        "run",
        "--algorithm",
        "own",
        "--clients",
        "2",
        "--rounds",
        "1",
        "--quiet",
        "--set",
        "own.student=lenett",
    ]
    assert main([*argv, "--out", str(tmp_path), "--name", "a"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "own.student names an unknown model 'lenett'; did you mean 'lenet5'?" in line
    assert not (tmp_path / "a").exists()


def test_registering_an_unused_key_that_is_no_common_key_names_it(restore_registry):
    with pytest.raises(
        ValueError, match=r"own: unused_keys names 'fractoin', not a common key; did you mean 'fraction'"
    ):
        register(_fedavg_with(unused_keys={"fractoin": "every site trains every round"}))
    assert "own" not in ALGORITHMS


def test_registering_a_model_key_that_is_no_option_names_it(restore_registry):
    @dataclass(frozen=True)
    class Misspelt:
        """Its model_keys names an option it does not have."""

        student: str = ""
        """The student's model."""

        model_keys: ClassVar[str] = "studnet"

    with pytest.raises(ValueError, match=r"own: Misspelt.model_keys names 'studnet', not one of its options"):
        register(_fedavg_with(Misspelt))
    assert "own" not in ALGORITHMS


def test_a_handler_for_a_message_type_no_message_may_have_is_refused_where_it_is_declared():
    from fedistill.errors import FederationError
    from fedistill.federation.client import handles

    with pytest.raises(FederationError, match=r"@handles\('mystep'\): a message type is 'train', 'evaluate'"):
        handles("mystep")
    assert handles("query.logits") and handles("train")


def test_an_unknown_algorithm_with_no_close_name_says_how_an_own_one_is_registered():
    from fedistill.errors import UserError

    with pytest.raises(
        UserError, match=r"unknown algorithm 'toy-avg'.*registered by importing its module"
    ) as exc:
        get_algorithm("toy-avg")
    assert "did you mean" not in str(exc.value)
    with pytest.raises(UserError, match=r"did you mean 'fedavg'\?") as exc:
        get_algorithm("fedavgg")
    assert "importing" not in str(exc.value)  # a typo needs no lecture


def test_a_task_no_algorithm_runs_on_says_so_and_where_methods_name_their_tasks(
    tmp_path, capsys, monkeypatch
):
    """A new task runs no method until the methods name it; the refusal listed 'algorithms for it: ' and
    nothing after it."""
    from fedistill.data.catalog import DATASETS, DatasetEntry
    from fedistill.data.digits import load_digits_dataset
    from fedistill.tasks import TASKS
    from fedistill.tasks.classification import Classification

    @dataclass(frozen=True)
    class Smooth(Classification):
        """Classification under another name."""

        name: ClassVar[str] = "smooth-classification"

    def load(folder, download, verify, **options):
        data = load_digits_dataset()
        return dataclasses.replace(data, info=dataclasses.replace(data.info, task=Smooth.name))

    monkeypatch.setitem(TASKS, Smooth.name, Smooth)
    monkeypatch.setitem(DATASETS, "smooth-digits", DatasetEntry(None, load, lambda folder: "no files"))
    argv = ["run", "--dataset", "smooth-digits", "--algorithm", "fedavg", "--clients", "2", "--rounds", "1"]
    assert main([*argv, "--quiet", "--out", str(tmp_path), "--name", "a"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "is a smooth-classification task, which no registered algorithm runs on" in line
    assert "Algorithm.tasks" in line and "algorithms for it: ;" not in line and not line.endswith(": ")


def test_an_algorithm_an_installed_package_declares_is_registered_in_every_process(tmp_path, monkeypatch):
    """The entry-point group `fedistill.algorithms` is imported with the registry, so the command line and
    Flower's node processes know an algorithm of one's own without importing it themselves."""
    import os
    import subprocess
    import sys
    from importlib.metadata import EntryPoint

    from fedistill import plugins
    from fedistill.algorithms import registry
    from fedistill.errors import UserError

    (tmp_path / "plugin_avg.py").write_text(
        "from fedistill.algorithms.base import register\n"
        "from fedistill.algorithms.registry import get_algorithm\n"
        "fedavg = get_algorithm('fedavg')\n"
        "register(type(fedavg)('plugin-avg', 'FedAvg under another name', fedavg.client, fedavg.server,\n"
        "                      fedavg.options))\n"
    )
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('its own bug')\n")
    points = [
        EntryPoint("plugin-avg", "plugin_avg", registry.PLUGIN_GROUP),
        EntryPoint("broken", "broken_plugin", registry.PLUGIN_GROUP),
    ]
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(
        plugins, "entry_points", lambda group: points if group == registry.PLUGIN_GROUP else []
    )
    monkeypatch.setattr(registry, "PLUGIN_ERRORS", {})
    monkeypatch.delitem(ALGORITHMS, "plugin-avg", raising=False)
    registry.load_plugins()
    try:
        assert registry.get_algorithm("plugin-avg").server is ALGORITHMS["fedavg"].server
        broken = r"'broken' is declared by an installed package, but broken_plugin failed to import"
        with pytest.raises(UserError, match=broken + r" \(RuntimeError: its own bug\)"):
            registry.get_algorithm("broken")
        assert registry.get_algorithm("fedavg")  # the others still run
    finally:
        ALGORITHMS.pop("plugin-avg", None)
    # a real installed declaration: a fresh process (as a Flower node is) finds it by the registry alone
    dist = tmp_path / "site" / "plugin_avg-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin-avg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{registry.PLUGIN_GROUP}]\nplugin-avg = plugin_avg\n")
    (tmp_path / "site" / "plugin_avg.py").write_text((tmp_path / "plugin_avg.py").read_text())
    code = "from fedistill.algorithms.registry import get_algorithm; print(get_algorithm('plugin-avg').name)"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}:{':'.join(sys.path)}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "plugin-avg"


def test_a_dataset_an_installed_package_declares_is_known_in_a_fresh_process(tmp_path):
    """The entry-point group `fedistill.datasets` is imported with the dataset registry, as a Flower node's
    process does; a declared module that fails to import is named when its dataset is asked for."""
    import os
    import subprocess
    import sys

    site = tmp_path / "site"
    dist = site / "my_scans-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-scans\nVersion: 1.0\n")
    declared = "[fedistill.datasets]\nmy-digits = my_digits\nbroken = broken_scans\n"
    (dist / "entry_points.txt").write_text(declared)
    (site / "my_digits.py").write_text(
        "from fedistill.data.catalog import DATASETS\nDATASETS['my-digits'] = DATASETS['digits']\n"
    )
    (site / "broken_scans.py").write_text("raise ImportError('no scanner driver')\n")
    code = (
        "from fedistill.data.registry import canonical_dataset_name\n"
        "print(canonical_dataset_name('my-digits'))\n"
        "try:\n    canonical_dataset_name('broken')\nexcept Exception as exc:\n    print(exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    found, broken = out.stdout.strip().splitlines()
    assert found == "my-digits"
    assert broken == (
        "dataset 'broken' is declared by an installed package, but broken_scans failed to import "
        "(ImportError: no scanner driver)"
    )
