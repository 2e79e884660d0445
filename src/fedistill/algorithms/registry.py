"""Every algorithm by name. Importing this module imports each family, whose modules register their
algorithms (`base.register`); lookups go through here so that the registry is always complete."""

from __future__ import annotations

import difflib

from fedistill.algorithms import classic, feddf, fediod, fedmd, fedmdcg, medical, one_shot  # noqa: F401
from fedistill.algorithms.base import ALGORITHMS, Algorithm
from fedistill.errors import UserError, unknown_name

__all__ = ["ALGORITHMS", "algorithm_names", "for_task", "get_algorithm"]


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as `name`; a UserError with the closest name when none is, else with how one's
    own algorithm gets here (a name nothing resembles is most often one whose module was never imported)."""
    if name not in ALGORITHMS:
        error = unknown_name("algorithm", name, sorted(ALGORITHMS))
        if difflib.get_close_matches(str(name), list(ALGORITHMS), n=1):
            raise error
        raise UserError(
            f"{error}; an algorithm of your own is registered by importing its module, in every process "
            "that runs it (see the guide 'Write an algorithm')"
        )
    return ALGORITHMS[name]


def for_task(task: str) -> list[str]:
    """The registered algorithms that run on `task`."""
    return sorted(name for name, algorithm in ALGORITHMS.items() if task in algorithm.tasks)


def algorithm_names() -> list[str]:
    """Every registered algorithm's name, sorted."""
    return sorted(ALGORITHMS)
