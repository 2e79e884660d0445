"""fedistill: federated learning by distillation (FedIOD, FedDF, FedMD-CG and their baselines)."""

__version__ = "0.1.0"
