"""Modules that installed packages declare in an entry-point group, imported so that what they register
(an algorithm, a dataset) is known in every process: the command line, a resume, Flower's nodes.

A package declares one in its pyproject.toml, e.g. `[project.entry-points."fedistill.algorithms"]
my-method = "my_package.my_method"`; the module registers itself when imported."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

log = logging.getLogger("fedistill")


def import_declared(group: str) -> dict[str, str]:
    """Import each module declared in entry-point `group`; one that fails is logged and returned (its name
    -> why), so that the others still load and asking for the broken one can say why it is missing."""
    failed: dict[str, str] = {}
    for point in entry_points(group=group):
        try:
            point.load()
        except Exception as exc:  # a plugin's own bug must not take every other name down with it
            failed[point.name] = f"{point.value} failed to import ({type(exc).__name__}: {exc})"
            log.warning("%s plugin %r: %s", group, point.name, failed[point.name])
    return failed
