"""The package's layers point one way (ARCHITECTURE.md): every import of `src/fedistill`, lazy ones
inside functions included, is read from the source and checked against the table of what each layer
may import; no circle of files exists; an algorithm family reaches another only through its package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "fedistill"

#: The ground floor: what a run is (config), the protocol (federation), errors, seeds, devices, figures.
GROUND = {"errors", "devices", "seeding", "interrupt", "config", "plots", "federation", "version"}
GROUND |= {"machine"}  # which CPU, kernel path and GPU a run's numbers came from
GROUND |= {"disk", "checksums"}  # atomic writes, and the sha256 manifests that verify them
GROUND |= {"plugins"}  # the modules installed packages declare (their algorithms, datasets)
LIBRARY = {"data", "models", "metrics", "tasks", "privacy", "algorithms", "analysis"}
BELOW_ENGINE = GROUND | LIBRARY | {"transports"}
#: What each top-level module or package of fedistill may import, besides itself.
ALLOWED: dict[str, set[str]] = {
    "version": set(),
    "errors": set(),
    "disk": set(),
    "checksums": set(),
    "plots": {"disk"},
    "interrupt": set(),
    "plugins": set(),
    "devices": {"errors"},
    "machine": {"devices"},
    "seeding": {"errors", "devices"},
    "config": {"errors", "disk"},
    "federation": {"errors", "devices"},
    "data": GROUND,
    "models": GROUND | {"data"},
    "metrics": GROUND | {"data", "models"},
    "tasks": GROUND | {"data", "models", "metrics"},
    "privacy": GROUND | {"data", "models", "metrics"},
    "algorithms": GROUND | {"data", "models", "metrics", "tasks", "privacy"},
    "transports": GROUND,
    "analysis": GROUND | {"data", "models", "metrics", "tasks", "privacy", "algorithms"},
    "engine": BELOW_ENGINE,
    "reproduce": BELOW_ENGINE | {"engine"},
    "inference": BELOW_ENGINE | {"engine"},
}
# what users call, and the docs made from it: anything
TOP = {"cli", "__main__", "api", "reference", "__init__"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The fedistill modules `name` imports; `from package import module` counts as the module."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {  # `if TYPE_CHECKING:` imports never run
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    targets = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {t for t in targets if t in MODULES and t != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_top_level_unit_has_a_rule():
    units = {_unit(m) for m in MODULES}
    assert units - set(ALLOWED) - TOP == set(), "a new layer needs a row in ALLOWED and ARCHITECTURE.md"


def test_layers_point_one_way():
    wrong = sorted(
        f"{source} imports {target}"
        for source, targets in GRAPH.items()
        for target in targets
        if _unit(source) not in TOP
        and _unit(target) != _unit(source)
        and _unit(target) not in ALLOWED[_unit(source)]
    )
    assert wrong == []


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    return found


def test_no_circle_of_files():
    assert _cycles() == []


def _family(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 3 or parts[1] != "algorithms" or parts[2] in ("base", "registry"):
        return None
    return parts[2]


def test_a_family_reaches_another_only_through_its_package():
    wrong = []
    for source, targets in GRAPH.items():
        own = _family(source)
        for target in targets:
            other = _family(target)
            if other is None or other == own:
                continue
            if own == "shared" or (other != "shared" and target != f"fedistill.algorithms.{other}"):
                wrong.append(f"{source} imports {target}")
    assert sorted(wrong) == []


def test_transports_never_name_an_algorithm_or_the_run_loop():
    transports = {source: targets for source, targets in GRAPH.items() if _unit(source) == "transports"}
    assert "fedistill.transports.flower.grid_fleet" in transports  # the rule reads the real modules
    for source, targets in transports.items():
        assert not {t for t in targets if _unit(t) in ("algorithms", "engine")}, source


@pytest.mark.parametrize("limit", [450])
def test_every_file_is_short(limit):
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in MODULES.values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > limit
    }
    assert long == {}


def test_architecture_md_names_every_top_level_unit():
    """The layer map is only a contract if it shows every package and top-level module of fedistill."""
    text = (PACKAGE.parents[1] / "ARCHITECTURE.md").read_text(encoding="utf-8")
    units = {_unit(m) for m in MODULES} - {"__init__", "__main__"}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    spelt = {unit: f"{unit}/" if unit in packages else unit for unit in units}  # `data/`, `config.py`
    unnamed = [unit for unit, name in spelt.items() if f"`{name}" not in text and f" {name} " not in text]
    assert sorted(unnamed) == [], "name these in ARCHITECTURE.md's layer map and table"
