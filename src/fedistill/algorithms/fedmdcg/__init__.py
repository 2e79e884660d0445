"""FedMD-CG (paper 002) and the baselines of its table: FedPer, LG-FedAvg, FedGen and FedCG.
`personalized` holds the model split into a shared and a private part that they all build on."""

from fedistill.algorithms.fedmdcg import fedcg, fedgen, fedmdcg, fedper, lgfedavg  # noqa: F401
from fedistill.algorithms.fedmdcg.fedmdcg_options import FedMDCGOptions, resolve_options  # noqa: F401
