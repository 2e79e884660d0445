"""The medical baselines: AsynDGAN (a central generator trained by the sites' discriminators) and
FL-MRCM (federated MR reconstruction with cross-site feature alignment)."""

from fedistill.algorithms.medical import asyndgan, flmrcm  # noqa: F401
