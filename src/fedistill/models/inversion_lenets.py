"""FedMD-CG's LeNet in the conditions gradient-inversion attacks are studied in.

``lenet-fedmdcg-sigmoid`` swaps ReLU for Sigmoid and changes nothing else; ``lenet-fedmdcg-dlg`` is the
network in the conditions of the DLG paper: Sigmoid, the max-pools removed (the strided convolutions
stay), meant to run with ``norm="none"``. Both keep ``lenet-fedmdcg``'s parameter names, so a client trains
them unchanged (see `fedistill.analysis.threat_models`). The Sigmoid variant keeps its shapes too; without
the max-pools fc1 reads larger maps (MNIST: 16·7·7 = 784 features, not 16·2·2 = 64; 26,434 parameters with
``norm="none"`` against 3,394 for ``lenet-fedmdcg`` with BatchNorm), so its weights do not load into
``lenet-fedmdcg``.
"""

from __future__ import annotations

from fedistill.data.base import DatasetInfo
from fedistill.models.lenet import LeNetFedMDCG


def lenet_fedmdcg_sigmoid(info: DatasetInfo, norm: str = "batch", groups: int = 2) -> LeNetFedMDCG:
    """FedMD-CG's "Lenet" with Sigmoid activations, max-pools kept."""
    return LeNetFedMDCG(info, norm, groups, activation="sigmoid", pool=True)


def lenet_fedmdcg_dlg(info: DatasetInfo, norm: str = "batch", groups: int = 2) -> LeNetFedMDCG:
    """FedMD-CG's "Lenet" with Sigmoid activations and no max-pool: DLG's setting."""
    return LeNetFedMDCG(info, norm, groups, activation="sigmoid", pool=False)
