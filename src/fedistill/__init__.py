"""fedistill: federated learning by distillation (FedIOD, FedDF, FedMD-CG and their baselines)."""

from fedistill.version import __version__

__all__ = ["__version__"]
