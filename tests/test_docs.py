"""The documentation cannot rot: every public option, flag and registered name has its one line, the
generated results pages and the README's headline match the result files, and the how-to's example
algorithm runs."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedistill.algorithms.registry import ALGORITHMS, algorithm_names
from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import run_suite
from fedistill.federation.ledger import UP, read_ledger
from fedistill.reference import cli_reference, config_keys, options, registries
from fedistill.reference.field_docs import field_docs
from fedistill.reference.pages import reference_pages
from fedistill.reference.parser import run_flag_help
from fedistill.reference.provenance import GIT_COMMIT
from fedistill.reference.results import ROOT, readme_with_headline, results_pages
from fedistill.tasks import TASKS

EXAMPLE = ROOT / "docs" / "examples" / "my_algorithm.py"


def test_every_command_line_argument_is_documented():
    missing = [f"{flag.command} {flag.names}" for flag in cli_reference.flags() if not flag.help.strip()]
    assert missing == [], "give these arguments a help= in cli.py"


def test_every_argument_is_described_in_the_terminal_help_too():
    """`fedistill run --help` is the terminal's reference: a flag whose meaning only the generated page
    gives (from a note or its config key's doc) shows a bare name there."""
    bare = [f"{flag.command} {flag.names}" for flag in cli_reference.flags() if not flag.own_help]
    assert bare == [], "give these arguments a help= in cli.py (and drop their notes)"


def test_every_common_config_key_is_documented():
    missing = [key.name for key in config_keys.common_keys() if not key.doc.strip()]
    assert missing == [], "document these keys with a comment beside them in config.py"


@pytest.mark.parametrize("name", algorithm_names())
def test_every_algorithm_option_is_documented(name):
    missing = [option.name for option in options.options_of(name) if not option.doc.strip()]
    assert missing == [], f"document these [{name}] options (a docstring or a comment beside the field)"


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_option_is_documented(name):
    """The tasks page showed `loss_kind`, `dice_weight`, `acceleration` and others with an empty meaning."""
    missing = [item.name for item in field_docs(TASKS[name]) if not item.text.strip()]
    assert missing == [], f"document these {name} task options (a comment beside the field)"


def test_the_message_cap_is_documented_in_the_unit_it_is_applied_in():
    """max_message_mb caps a message at max_message_mb * 2^20 bytes, while every size the project prints is
    in MB of 10^6 bytes; the reference said 'in MB', so a message printed as 10.4 MB passed a cap of 10."""
    doc = {key.name: key.doc for key in config_keys.common_keys()}["max_message_mb"]
    assert "MiB" in doc and "2^20" in doc


def test_every_registered_name_is_documented():
    found = registries.entries()
    missing = [f"{registry}: {e.name}" for registry, entries in found.items() for e in entries if not e.doc]
    assert missing == [], "give these a docstring (models, partitioners, tasks) or a summary (algorithms)"


def test_notes_are_not_written_twice():
    """The fallback notes hold only what the code does not say yet; once it does, a note must go."""
    commented = {doc.name for doc in field_docs(RunConfig) if doc.text}
    flagged = set(run_flag_help())
    assert sorted(set(config_keys.KEY_NOTES) & (commented | flagged)) == []
    own_help = {f"{flag.command} {flag.dest}" for flag in cli_reference.flags() if flag.own_help}
    assert sorted(set(cli_reference.ARGUMENT_NOTES) & own_help) == []


def test_terminal_options_list_every_key_with_its_default():
    text = options.format_options("fediod")
    for option in options.options_of("fediod"):
        assert re.search(rf"^  {option.name} = ", text, re.MULTILINE), option.name
    assert "no options of its own" in options.format_options("standalone")


def test_reference_pages_cover_every_algorithm():
    pages = reference_pages()
    for name in algorithm_names():
        assert f"reference/options/{name}.md" in pages
        assert f"[`[{name}]`]({name}.md)" in pages["reference/options/index.md"]
    assert "`--set KEY=VALUE`" in pages["reference/cli.md"]
    assert "| `stage1_cache` |" in pages["reference/config.md"]


def _without_git_commits(text: str) -> str:
    """Commits taken from git are left out: committing a result file gives it a new last commit."""
    return GIT_COMMIT.sub("<commit>", text)


def test_results_pages_match_the_result_files():
    stale = []
    for path, text in results_pages().items():
        page = ROOT / "docs" / path
        committed = page.read_text(encoding="utf-8") if page.is_file() else ""
        if _without_git_commits(committed) != _without_git_commits(text):
            stale.append(path)
    assert stale == [], "run `python -m fedistill.reference.results` and commit the pages"


def test_readme_headline_matches_the_result_files_and_the_readme_stays_a_front_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert _without_git_commits(readme_with_headline(readme)) == _without_git_commits(readme), (
        "run `python -m fedistill.reference.results` and commit README.md"
    )
    top = readme.splitlines()[:5]  # the set-up commands stay first: CI runs the README's `make test`
    assert top[2] == "```bash" and top[3].startswith("make demo") and top[4].startswith("make test")
    assert len(readme.encode("utf-8")) <= 20_000


@pytest.fixture
def example_algorithm():
    """The how-to's example, imported as a user would; the registry is restored afterwards."""
    before = dict(ALGORITHMS)
    spec = importlib.util.spec_from_file_location("my_algorithm", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through it
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]
    ALGORITHMS.clear()
    ALGORITHMS.update(before)


def test_example_algorithm_runs_on_digits(tmp_path, example_algorithm):
    config = build_config(
        RunConfig(),
        {"algorithm": "trimmed-mean", "clients": 5, "rounds": 2, "local_epochs": 2, "model": "mlp"},
    )
    (summary,) = run_suite(config, tmp_path / "suite", progress=False)
    assert summary["algorithm"] == "trimmed-mean"
    assert summary["final"]["test_accuracy"] > 0.5  # chance is 0.1
    ledger = read_ledger(tmp_path / "suite" / "trimmed-mean" / "ledger.jsonl")
    sent_up = {kind for record in ledger if record["direction"] == UP for kind in record["kinds"]}
    assert sent_up == {"parameters", "metrics"}


def test_example_refuses_the_common_key_the_guide_says_it_never_reads(example_algorithm):
    from fedistill.engine.setup import validate_setup
    from fedistill.errors import ConfigError

    config = build_config(RunConfig(), {"algorithm": "trimmed-mean", "trimmed-mean": {"fraction": 0.5}})
    with pytest.raises(ConfigError, match=r"trimmed-mean\.fraction is not used by trimmed-mean: every"):
        validate_setup(config)


def test_example_trimmed_mean_is_the_median_at_one_half(example_algorithm):
    import torch

    values = torch.tensor([[1.0], [9.0], [2.0], [3.0]])
    assert example_algorithm.trimmed_mean(values, 0.5).item() == 2.5
    assert example_algorithm.trimmed_mean(values, 0.0).item() == 3.75


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    built = (tmp_path / "site" / "how-to" / "write-algorithm" / "index.html").read_text(encoding="utf-8")
    assert "TrimmedMeanClient" in built  # the example file, pulled in by its snippet line


def test_every_snippet_line_is_one_the_docs_build_reads():
    """A mangled `--8<--` line (a formatter's `--8 < --"x"`) still builds, strictly, into a page that shows
    the line instead of the file; every snippet line must be the exact form, naming a file that exists."""
    for page in ROOT.joinpath("docs").rglob("*.md"):
        for line in page.read_text(encoding="utf-8").splitlines():
            if line.replace(" ", "").startswith("--8<--"):
                found = re.fullmatch(r'--8<-- "([^":]+)(:\w+)?"', line)
                assert found, f"{page}: {line}"
                assert (ROOT / found.group(1)).is_file(), f"{page}: {line}"


def test_every_page_in_docs_is_in_the_nav():
    """mkdocs --strict refuses a page left out of the nav; catch it in the fast suite too."""
    import re

    nav_text = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    in_nav = set(re.findall(r"([\w./-]+\.md)\s*$", nav_text, flags=re.MULTILINE))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert pages - in_nav == set()


def test_the_documented_default_run_name_is_the_one_a_run_gets():
    """`name`'s doc (the config reference) and `--name`'s help spell the folder a run without a name gets."""
    from fedistill.engine.suite import default_name

    config = RunConfig(dataset="mnist", algorithm="fedavg", seed=3)
    made = default_name(config)
    fills = {"dataset": "mnist", "algorithm": "fedavg", "seed": "3", "time": r"\d{8}-\d{6}"}
    docs = [key.doc for key in config_keys.common_keys() if key.name == "name"]
    docs += [flag.help for flag in cli_reference.flags() if flag.command == "run" and flag.dest == "name"]
    assert len(docs) == 2
    for doc in docs:
        spelled = re.search(r"<\w+>[\w<>-]*", doc).group(0)
        pattern = re.sub(r"<(\w+)>", lambda m: fills[m.group(1)], re.sub(r"[^\w<>]", r"\\\g<0>", spelled))
        assert re.fullmatch(pattern, made), f"{doc!r} does not describe {made!r}"


def test_a_missing_result_file_is_one_line_and_writes_nothing(tmp_path, capsys):
    """The pages are built from benchmarks/results/; a file they cite that is missing was a
    FileNotFoundError traceback. Now it names the file, exits 2, and no page is written."""
    import shutil

    from fedistill.reference import results

    root = tmp_path / "repo"
    shutil.copytree(ROOT / "benchmarks" / "results", root / "benchmarks" / "results")
    shutil.copytree(ROOT / "docs", root / "docs")
    shutil.copy(ROOT / "README.md", root / "README.md")
    (root / "benchmarks" / "results" / "demos.json").unlink()
    before = {p: p.read_bytes() for p in (root / "docs" / "results").glob("*.md")}
    assert results.main([str(root)]) == 2
    err = capsys.readouterr().err
    assert "demos.json is missing" in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in (root / "docs" / "results").glob("*.md")} == before


def test_the_privacy_guide_quotes_table_5_of_the_fediod_paper_row_by_row():
    """Table 5 gives FedIOD's accuracy with DP and without it under each epsilon (the no-DP run differs per
    column: 74.31 to 82.69), so the guide quotes both rows and no single no-DP number."""
    from fedistill.reproduce.pate_comparison import PAPER

    rows = [
        line
        for line in (ROOT / "docs" / "how-to" / "privacy.md").read_text(encoding="utf-8").splitlines()
        if "(paper" in line
    ]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert [c[1:] for c in cells] == [
        ["-", *(f"{PAPER[e]:.2f}" for e in (3.5, 6.0, 7.7, 10.0))],
        ["-", "74.31", "80.02", "82.03", "82.69"],
    ]


def test_the_fedmdcg_page_quotes_the_papers_margin_over_local_training():
    """The margin of FedMD-CG's local accuracy over Local Training's in the paper's Fashion-MNIST table
    (configs/expected.toml holds both), at omega 1 and at omega 10, as the page quotes it."""
    import tomllib

    expected = tomllib.loads((ROOT / "configs" / "expected.toml").read_text(encoding="utf-8"))

    def margin(omega: str) -> str:
        cell = "fedmdcg-table/fashion-mnist-{}-omega" + omega + ".toml"
        ours, local_training = (expected[cell.format(m)]["paper_local"] for m in ("fedmdcg", "standalone"))
        return f"{ours - local_training:.1f}"

    page = " ".join((ROOT / "docs" / "methods" / "fedmdcg.md").read_text(encoding="utf-8").split())
    assert (
        f"instead of the paper's {margin('1')} (omega 1) and {margin('10')} (omega 10) points above it"
        in page
    )


def test_fediods_teacher_epochs_says_its_default_is_not_the_papers():
    """FedIOD's option defaults are the paper's unless their doc names another source; stage 1's 30 epochs
    are not (the paper trains each CIFAR teacher 500 epochs), so the doc and the options page say so."""
    doc = {option.name: option.doc for option in options.options_of("fediod")}["teacher_epochs"]
    page = (ROOT / "docs" / "methods" / "fediod" / "options.md").read_text(encoding="utf-8")
    (row,) = [line for line in page.splitlines() if line.startswith("| `teacher_epochs`")]
    assert "the paper: 500" in doc and "the paper: 500" in row


def test_the_python_api_has_a_reference_page_in_the_nav():
    """`import fedistill` users and the guides' extension points (messages, client logic, fleets, tasks,
    models, datasets, partitioners) need their signatures and docstrings on the site, not only in the code."""
    import fedistill

    page = reference_pages().get("reference/api.md", "")
    for name in sorted(set(fedistill.__all__) - {"__version__"}):
        assert re.search(rf"^::: fedistill\.[\w.]+\.{name}$", page, flags=re.MULTILINE), name
    for needed in ("Message", "ClientLogic", "Fleet", "ReplySpec", "ServerLogic", "Task", "register_model"):
        assert re.search(rf"^::: fedistill\.[\w.]+\.{needed}$", page, flags=re.MULTILINE), needed
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^\s+- [^:]+: reference/api\.md$", nav, flags=re.MULTILINE)
