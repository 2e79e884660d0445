"""Algorithms: importing this package registers every one of them by name."""

from fedistill.algorithms import (  # noqa: F401
    asyndgan,
    coboosting,
    dense,
    fedavg,
    fedcg,
    feddf,
    fedgen,
    fediod,
    fedkd,
    fedmd,
    fedmdcg,
    fedper,
    flmrcm,
    lgfedavg,
    one_shot,
    standalone,
)
from fedistill.algorithms.base import ALGORITHMS, Algorithm, algorithm_names, get_algorithm

__all__ = ["ALGORITHMS", "Algorithm", "algorithm_names", "get_algorithm"]
