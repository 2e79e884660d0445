"""The package version, in a module of its own so that any layer may read it, and the fingerprint of the
code a run was made by (its summary records it; `--reuse` keeps only runs with this code's)."""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

__version__ = "0.1.0"

#: The package's own folder: the code the fingerprint covers.
PACKAGE = Path(__file__).parent


def _without_docstrings(tree: ast.Module) -> ast.Module:
    """`tree` with the docstring of its module, classes and functions removed (a lone one becomes `pass`)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        first = node.body[0] if node.body else None
        value = first.value if isinstance(first, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            node.body = node.body[1:] or [ast.Pass()]
    return tree


def fingerprint_of(root: Path) -> str:
    """A digest of the Python code under `root`, 12 hex digits: each file's path and syntax tree, so that
    comments, docstrings and layout leave it unchanged and any change to what the code does changes it.

    The syntax tree is Python's own, so one code base may read differently under two Python versions.
    Hidden files and folders (an editor's lock or backup, `.ipynb_checkpoints`) are no modules: left out."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue
        tree = _without_docstrings(ast.parse(path.read_bytes(), filename=str(path)))
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(ast.dump(tree).encode() + b"\0")
    return digest.hexdigest()[:12]


@functools.cache
def code_fingerprint() -> str:
    """This installation's `fingerprint_of` the package (about a second, once per process)."""
    return fingerprint_of(PACKAGE)
