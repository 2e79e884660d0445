"""Every algorithm by name. Importing this module imports each family, whose modules register their
algorithms (`base.register`), and every module an installed package declares in the entry-point group
`fedistill.algorithms`; lookups go through here so that the registry is always complete.

The entry points are what lets an algorithm of one's own run from the command line, resume, and run on
Flower, whose nodes build their client logic in processes of their own: each of them imports the registry,
and with it the declared modules."""

from __future__ import annotations

import difflib

from fedistill.algorithms import classic, feddf, fediod, fedmd, fedmdcg, medical, one_shot  # noqa: F401
from fedistill.algorithms.base import ALGORITHMS, Algorithm
from fedistill.errors import UserError, unknown_name
from fedistill.plugins import import_declared

__all__ = ["ALGORITHMS", "PLUGIN_GROUP", "algorithm_names", "for_task", "get_algorithm", "load_plugins"]

#: The entry-point group whose modules register algorithms when imported (a package's pyproject.toml:
#: `[project.entry-points."fedistill.algorithms"] my-method = "my_package.my_method"`)
PLUGIN_GROUP = "fedistill.algorithms"
#: Entry points whose module failed to import: their name -> why, said when that name is asked for
PLUGIN_ERRORS: dict[str, str] = {}


def load_plugins() -> None:
    """Import each module declared in `PLUGIN_GROUP` (`plugins.import_declared`), remembering which failed."""
    PLUGIN_ERRORS.update(import_declared(PLUGIN_GROUP))


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as `name`; a UserError with the closest name when none is, else with how one's
    own algorithm gets here (a name nothing resembles is most often one whose module was never imported)."""
    if name not in ALGORITHMS and name in PLUGIN_ERRORS:
        raise UserError(f"algorithm {name!r} is declared by an installed package, but {PLUGIN_ERRORS[name]}")
    if name not in ALGORITHMS:
        error = unknown_name("algorithm", name, sorted(ALGORITHMS))
        if difflib.get_close_matches(str(name), list(ALGORITHMS), n=1):
            raise error
        raise UserError(
            f"{error}; an algorithm of your own is registered by importing its module, or in every process "
            f"(the command line, Flower's nodes) by declaring it in the entry-point group {PLUGIN_GROUP!r} "
            "of an installed package (see the guide 'Write an algorithm')"
        )
    return ALGORITHMS[name]


def for_task(task: str) -> list[str]:
    """The registered algorithms that run on `task`."""
    return sorted(name for name, algorithm in ALGORITHMS.items() if task in algorithm.tasks)


def algorithm_names() -> list[str]:
    """Every registered algorithm's name, sorted."""
    return sorted(ALGORITHMS)


# last, so that a plugin may import this module's names (get_algorithm, to build on a built-in method)
load_plugins()
