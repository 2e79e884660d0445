"""FedMD and FedKD: knowledge transfer through a public dataset (`public_data`)."""

from fedistill.algorithms.fedmd import fedkd, fedmd  # noqa: F401
