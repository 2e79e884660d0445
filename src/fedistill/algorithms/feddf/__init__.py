"""FedDF (paper 004): FedAvg's local training, then the server fuses the received models (of any
architectures) by ensemble distillation on unlabeled or generated data."""

from fedistill.algorithms.feddf.feddf import FedDFOptions, distill

__all__ = ["FedDFOptions", "distill"]
