"""Where `fedistill reproduce` finds its configs, expected values, outputs and data: beside the package in a
source checkout, inside it (through importlib.resources) when installed from a wheel; a missing dataset
folder or missing configs stop it with one line."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest

from fedistill.reproduce import paths
from fedistill.reproduce.expected import read_expected
from fedistill.reproduce.needed_data import dataset_folder, named_datasets
from test_reproduce import reproduce

REPOSITORY = Path(__file__).resolve().parents[1]
PACKAGE_DIR = REPOSITORY / "src" / "fedistill"


@pytest.fixture
def installed(tmp_path, monkeypatch) -> tuple[Path, str]:
    """A package laid out as a wheel installs it: site-packages/<package>/paper_configs/ holding configs/."""
    name = "fedistill_wheel_layout"
    package = tmp_path / "site-packages" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    shutil.copytree(REPOSITORY / "configs", package / paths.PACKAGED_CONFIGS)
    monkeypatch.syspath_prepend(str(package.parent))
    return package, name


def test_a_checkout_reads_its_own_configs_and_writes_beside_them():
    layout = paths.layout(PACKAGE_DIR, {})
    assert layout.checkout == layout.root == REPOSITORY
    assert (
        layout.configs == REPOSITORY / "configs" and layout.expected == REPOSITORY / "configs/expected.toml"
    )
    assert (
        layout.runs == REPOSITORY / "benchmarks/runs" and layout.results == REPOSITORY / "benchmarks/results"
    )
    assert layout.data == REPOSITORY.parent / "shared" / "data"
    assert paths.layout(PACKAGE_DIR, {paths.DATA_ENV: "/elsewhere"}).data == Path("/elsewhere")


def test_an_installed_package_finds_configs_and_expected_values_through_its_resources(installed, tmp_path):
    package, name = installed
    layout = paths.layout(package, {}, package=name, cwd=tmp_path / "work")
    assert layout.checkout is None and layout.root == tmp_path / "work"
    assert layout.configs.samefile(package / paths.PACKAGED_CONFIGS)
    assert (layout.configs / "one-shot").is_dir()
    assert read_expected(layout.expected) == read_expected(REPOSITORY / "configs" / "expected.toml") != {}
    # outputs in the current folder, and data never inside the installed package
    assert layout.runs == Path("runs") and layout.results == Path("runs") / "results"
    assert layout.data == Path("data") and not layout.data.is_absolute()
    assert paths.layout(package, {paths.DATA_ENV: "/srv/data"}, package=name).data == Path("/srv/data")


def test_configs_missing_from_an_installation_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(paths.require_configs, "__defaults__", (tmp_path / "paper_configs",))
    code, out, err = reproduce(capsys, "--list")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "configs are not installed" in err


def test_the_datasets_a_run_reads_and_where_they_lie(tmp_path):
    settings = {"dataset": "fmnist", "fedkd": {"public": "dataset:cifar100", "public_size": 10}}
    assert list(named_datasets(settings)) == ["fmnist", "cifar100"]
    assert dataset_folder("fmnist", tmp_path) == tmp_path / "fashion-mnist"
    assert dataset_folder("digits", tmp_path) is None  # embedded: needs no folder
    assert dataset_folder("nuclei-cross-site", tmp_path) == tmp_path  # reads the data folder itself


def test_a_target_whose_data_is_missing_stops_with_one_line_naming_both_ways_to_point_at_it(
    tmp_path, capsys, monkeypatch
):
    from fedistill.reproduce import execute

    monkeypatch.setattr(execute, "execute_all", lambda *a: pytest.fail("a run started"))
    empty = tmp_path / "no-data"
    argv = (
        "one-shot",
        "--scale",
        "cpu",
        "--rows",
        "FedIOD, mnist, alpha 0.1",
        "--out",
        str(tmp_path / "out"),
    )
    code, out, err = reproduce(capsys, *argv, "--data-dir", str(empty))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("fedistill: error: ")
    assert str(empty) in err and "--data-dir" in err and paths.DATA_ENV in err
    assert not (tmp_path / "out").exists()


def test_a_wheel_built_from_an_explicit_package_list_ships_every_package_and_the_configs():
    """Mapping configs/ into the wheel needs `packages` listed by hand: a package missing from the list
    would be missing from the wheel."""
    setuptools = tomllib.loads((REPOSITORY / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]
    listed = setuptools.get("packages")
    if not isinstance(listed, list):
        pytest.skip("pyproject.toml finds its packages: configs/ is not mapped into the wheel")
    configs_package = f"fedistill.{paths.PACKAGED_CONFIGS}"
    found = {
        ".".join(p.parent.relative_to(PACKAGE_DIR.parent).parts) for p in PACKAGE_DIR.rglob("__init__.py")
    }
    assert set(listed) == found | {configs_package}
    assert setuptools["package-dir"][configs_package] == "configs"
    assert any(glob.endswith("*.toml") for glob in setuptools["package-data"][configs_package])


#: What a folder of the machine that made a result looks like in a file (relative links between pages, such
#: as `../../results/index.md`, are not folders of a machine).
MACHINE_FOLDER = re.compile(r"(?<![\w.])/(?:tmp|work|home|root|Users)/|(?:\.\./)+tmp/")


def test_no_published_result_or_page_names_a_folder_of_the_machine_that_made_it():
    """Records cite runs as OUT/<run>/<algorithm> and commands without their folders (`display_path`,
    `shown_arguments`): a record made in a scratch folder must not carry that folder into the repository."""
    results = (REPOSITORY / "benchmarks" / "results").rglob("*")
    published = [REPOSITORY / "README.md", *(REPOSITORY / "docs").rglob("*.md")]
    published += [p for p in results if p.suffix in (".md", ".json")]
    found = {
        str(p.relative_to(REPOSITORY)): MACHINE_FOLDER.search(p.read_text(encoding="utf-8"))
        for p in published
    }
    named = {path: match.group(0) for path, match in found.items() if match}
    assert not named, named


def test_a_run_outside_the_checkout_is_cited_under_out_and_read_back(tmp_path):
    run = tmp_path / "runs" / "t9-x-fedavg" / "fedavg"
    assert paths.display_path(run) == "OUT/t9-x-fedavg/fedavg"
    assert paths.display_path(tmp_path / "runs" / "ttq-a", tmp_path / "runs") == "OUT/ttq-a"
    assert paths.recorded_path("OUT/t9-x-fedavg/fedavg", tmp_path / "runs") == run
    inside = REPOSITORY / "benchmarks" / "runs" / "x" / "fedavg"
    assert paths.display_path(inside) == "benchmarks/runs/x/fedavg"
    assert paths.recorded_path("benchmarks/runs/x/fedavg", tmp_path) == inside


def test_a_record_written_beside_the_default_one_keeps_its_results_folder_in_its_command():
    """`--results benchmarks/results/<sub>` is part of what to type to remake that record (without it the
    command overwrites the default record); any other folder is the machine's and is left out."""
    from fedistill.reproduce.arguments import shown_arguments

    argv = ["--tables", "2", "--out", "runs/x", "--results", "benchmarks/results/segmentation_128px"]
    assert shown_arguments(argv) == ["--tables", "2", "--results", "benchmarks/results/segmentation_128px"]
    assert shown_arguments(["--results=benchmarks/results/sub"]) == ["--results=benchmarks/results/sub"]
    assert shown_arguments(["--results", "/tmp/scratch", "--seed", "1"]) == ["--seed", "1"]
    assert shown_arguments(["--results", "benchmarks/results/../../x"]) == []
