"""Algorithms: importing this package registers every one of them by name."""

from fedistill.algorithms import fedavg, feddf, fediod, fedper, lgfedavg, standalone  # noqa: F401
from fedistill.algorithms.base import ALGORITHMS, Algorithm, algorithm_names, get_algorithm

__all__ = ["ALGORITHMS", "Algorithm", "algorithm_names", "get_algorithm"]
