"""The benchmark scripts replace their result files whole (`fedistill.disk.write_text`: written beside the
file, then renamed over it), as the reproductions' tables do: a script stopped while writing, or two writing
one record at once, leaves the previous file, never half of one that the docs are then generated from."""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
#: Scripts whose writes are the inputs of the cases they stage in a scratch folder, never a result.
SCRATCH_ONLY = {"fault_cases.py", "fault_harness.py"}


def plain_writes(path: Path) -> list[str]:
    """`<path>:<line>` of every `x.write_text(...)` / `x.write_bytes(...)` call in one script."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("write_text", "write_bytes")
            and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "disk")
        ):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_benchmark_script_writes_a_file_in_place():
    scripts = [p for p in sorted(BENCHMARKS.glob("*.py")) if p.name not in SCRATCH_ONLY]
    assert scripts
    assert [hit for script in scripts for hit in plain_writes(script)] == []


def test_no_reproduction_writes_a_result_file_in_place():
    """The tables the scripts hand their rows to (fedistill.reproduce) replace their files whole too."""
    modules = sorted((BENCHMARKS.parent / "src" / "fedistill" / "reproduce").glob("*.py"))
    assert modules
    assert [hit for module in modules for hit in plain_writes(module)] == []


def test_every_benchmark_script_finds_its_data_where_the_reproductions_do():
    """A script's `--data-dir` default is the project's data folder (`FEDISTILL_DATA`, else the shared one
    beside the checkout, else data/: `fedistill.reproduce.paths.DATA`), not a folder it names itself, which
    ignored `FEDISTILL_DATA`."""
    scripts = sorted(BENCHMARKS.glob("*.py"))
    own = [p.name for p in scripts if '"shared" / "data"' in p.read_text(encoding="utf-8")]
    assert own == []
