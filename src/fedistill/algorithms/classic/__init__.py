"""The classic baselines: FedAvg (with FedProx and FedAvgM), Standalone and Centralized."""

from fedistill.algorithms.classic import standalone  # noqa: F401  (registers standalone, centralized)
from fedistill.algorithms.classic.fedavg import FedAvgClient, FedAvgOptions, FedAvgServer, PrivacyReport

__all__ = ["FedAvgClient", "FedAvgOptions", "FedAvgServer", "PrivacyReport"]
