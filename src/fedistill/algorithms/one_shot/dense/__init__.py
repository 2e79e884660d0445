"""DENSE (Zhang et al., NeurIPS 2022, "DENSE: Data-Free One-Shot Federated Learning").

One-shot: each client trains its local model once, exactly as FedIOD's client trains its teacher (same
architecture rule, epochs, random stream and stage-1 cache entry, so the two distil the same models),
and uploads its parameters in the only `train` exchange. Everything else happens at the server: a
generator learns to produce inputs the ensemble of the local models classifies as sampled labels, whose
batch-norm statistics match the teachers' and on which the student disagrees with the ensemble; the
student distils the ensemble on a pool of every synthetic batch so far. Model selection sends the
student down to the clients, which return validation metrics only (`selection = "clients"`, as FedIOD)
or uses the server's held-out split (`"server"`).

The package: `options.py` (the released code's defaults), `client.py` (the site, shared with
Co-Boosting), `server.py` (synthesis, distillation, selection, checkpoints), `losses.py` (the terms).
"""

from fedistill.algorithms.base import Algorithm, register
from fedistill.algorithms.one_shot.dense.client import OneShotClient
from fedistill.algorithms.one_shot.dense.options import DenseOptions
from fedistill.algorithms.one_shot.dense.server import DenseServer
from fedistill.algorithms.shared.stage1 import STAGE1_UNUSED_KEYS

__all__ = ["DenseOptions", "DenseServer", "OneShotClient"]

register(
    Algorithm(
        "dense",
        "DENSE: one-shot; clients upload their local models once, the server distils them data-free",
        OneShotClient,
        DenseServer,
        DenseOptions,
        unused_keys=STAGE1_UNUSED_KEYS,
    )
)
