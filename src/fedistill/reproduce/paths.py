"""Where a reproduction reads and writes, in a source checkout or installed from a wheel.

In a checkout the paper-scale configs and their expected values (configs/, configs/expected.toml) sit
beside the package, as do the benchmark runs and result tables, and the dataset files beside the
checkout. An installed wheel carries the configs inside the package (configs/ is mapped to
`fedistill/paper_configs` when the wheel is built) and found through `importlib.resources`; its outputs go
to the current folder (runs/), and its dataset folder is `FEDISTILL_DATA` or `--data-dir`, never a folder
inside the installed package.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from fedistill.errors import UserError

#: The environment variable that names the dataset folder (`--data-dir` overrides it).
DATA_ENV = "FEDISTILL_DATA"
#: The folder inside the installed package that holds the checkout's configs/.
PACKAGED_CONFIGS = "paper_configs"


@dataclass(frozen=True)
class Layout:
    """The folders a reproduction uses: `checkout` is None outside a source checkout, where `root` (the
    folder result files cite paths from) is the current folder."""

    checkout: Path | None
    root: Path
    configs: Path
    runs: Path
    results: Path
    data: Path

    @property
    def expected(self) -> Path:
        return self.configs / "expected.toml"


def find_checkout(package_dir: Path) -> Path | None:
    """The source checkout `package_dir` (the `fedistill` folder) is imported from: src/fedistill with
    configs/ beside src/; None for an installed package."""
    root = package_dir.parent.parent
    return root if package_dir.parent.name == "src" and (root / "configs").is_dir() else None


def packaged_configs(package: str = "fedistill") -> Path:
    """configs/ as the installed package carries it, through the package resources API."""
    return Path(str(resources.files(package).joinpath(PACKAGED_CONFIGS)))


def layout(
    package_dir: Path, environ: Mapping[str, str], package: str = "fedistill", cwd: Path | None = None
) -> Layout:
    """The checkout's folders when `package_dir` lies in one, else the packaged configs and the current
    folder; the dataset folder is `environ[DATA_ENV]` when set."""
    checkout = find_checkout(package_dir)
    named_data = environ.get(DATA_ENV)
    if checkout is not None:
        data = Path(named_data) if named_data else checkout.parent / "shared" / "data"
        runs, results = checkout / "benchmarks" / "runs", checkout / "benchmarks" / "results"
        return Layout(checkout, checkout, checkout / "configs", runs, results, data)
    data = Path(named_data) if named_data else Path("data")
    root = cwd if cwd is not None else Path.cwd()
    return Layout(None, root, packaged_configs(package), Path("runs"), Path("runs") / "results", data)


LAYOUT = layout(Path(__file__).resolve().parents[1], os.environ)

#: The checkout this package is imported from; installed from a wheel, the current folder.
CHECKOUT = LAYOUT.root
CONFIGS = LAYOUT.configs
EXPECTED = LAYOUT.expected
RESULTS = LAYOUT.results
RUNS = LAYOUT.runs
#: Dataset files: FEDISTILL_DATA, else those shared between checkouts (beside the checkout), else data/.
DATA = LAYOUT.data


def relative_to_checkout(path: str | Path) -> str:
    """``path`` as written from the checkout (``..`` where it lies outside): a user's own output folders.
    A result file we publish cites its runs with `display_path` instead, which names no machine folder."""
    return os.path.relpath(path, CHECKOUT)


def display_path(path: Path, out: Path | None = None) -> str:
    """A run's folder as a result file cites it: relative to the repository when it lies inside it, else
    `OUT/...` under the runs folder the command was given (`out`; without it the last two parts,
    `OUT/<run>/<algorithm>`), so that no record names a folder of the machine that made it."""
    try:
        return str(path.resolve().relative_to(CHECKOUT))
    except ValueError:
        pass
    if out is not None:
        try:
            return str(Path("OUT") / path.resolve().relative_to(Path(out).resolve()))
        except ValueError:
            pass
    return f"OUT/{path.parent.name}/{path.name}"


def recorded_path(text: str, runs: Path) -> Path:
    """The inverse of `display_path`: `OUT/...` under `runs` (the command's `--out`), a relative path under
    the repository."""
    path = Path(text)
    if path.parts and path.parts[0] == "OUT":
        return Path(runs).joinpath(*path.parts[1:])
    return path if path.is_absolute() else CHECKOUT / path


def require_configs(configs: Path = CONFIGS) -> None:
    """A one-line UserError when the targets' configs are not at hand (a wheel built without them)."""
    if not (configs / "expected.toml").is_file():
        raise UserError(
            f"the reproducible targets' configs are not installed ({configs} has no expected.toml): "
            "install a fedistill wheel built with its configs, or run from a source checkout"
        )
