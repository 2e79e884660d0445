"""FedMD-CG: model decoupling; a client shares a conditional feature generator instead of its extractor.

Each client i holds a model F_i (``extractor.*``) → C_i (``classifier.*``) and a generator G_i(y, ε)
that imitates F_i's features. One round t (t = round − 1 of R):

1. server → sampled clients ``train``: from t = 1 on, the global pair (C_g, G_g) and the global label
   distribution of the previous round.
2. Client, stage 1 (local model): C_i := C_g, then SGD steps on
   CE + λ1(t)·KL(D_i(Ĝ(y))/T_c ‖ D_i(F_i(x))/T_c) + λ2(t)·CE(D_i(Ĝ(ŷ)), ŷ) + λ3(t)·MSE(F_i(x), Ĝ(y)),
   with Ĝ = G_g frozen, ŷ drawn from the global label distribution and λ(t) ramped from 0 (round 0:
   CE only). Stage 2 (local generator, which persists across rounds): Adam steps over the round's
   cached real batches on CE + KL from the local model + feature MSE to F_i + diversity.
3. Client → server: C_i, G_i and its label counts. F_i never leaves the client.
4. Server (it holds no data): (C_g, G_g) := the sample-weighted average of the received pairs, then
   the crossed data-free distillation Σ_i w_{i,y}·(L1 + L2 + L3) (see :mod:`losses`).

Metrics. ``local_accuracy`` is the paper's "local accuracy": each client's full model on its own IID
test shard, sample-weighted (personalized.py). The paper's "global accuracy" averages the *full*
local models, extractors included, which the protocol never moves; the in-process runner reports it
as ``global_accuracy_oracle``, computed from the clients' own states outside the protocol and the
ledger (algorithms/shared/oracle.py); :func:`oracle_global_accuracy` does the same from saved client states.

Where the paper and the released code differ, ``preset = "official-code"`` switches to the code:
uniform noise, the batch cache that is never cleared (with its label-sum de-duplication), label
counts taken from that cache, and the softmax fed to the server's L3 (reference notes §4.7). Two more
of the code's behaviours are options the preset leaves off, so that its recorded benchmark stays as it
was: ``generator_grads = "accumulated"`` (stage 2 clears G_i's gradients once per pass over the cache,
so each Adam step follows the sum of the gradients of every batch before it in that pass; by default
each step follows its own batch's) and ``batch_order = "cycled"`` (one data order drawn once and read
on from round to round, as the code's persistent loader does; by default each round reshuffles).

Files: the options and the preset in fedmdcg_options.py, the client in fedmdcg_client.py, the server
in fedmdcg_server.py, the loss terms in losses.py; here the registration and the oracle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedistill.algorithms.base import Algorithm, register
from fedistill.algorithms.fedmdcg.fedmdcg_client import FedMDCGClient
from fedistill.algorithms.fedmdcg.fedmdcg_options import FedMDCGOptions, resolve_options
from fedistill.algorithms.fedmdcg.fedmdcg_server import FedMDCGServer
from fedistill.algorithms.fedmdcg.personalized import decoupled_model
from fedistill.algorithms.shared.oracle import ORACLE_LABEL, ORACLE_METRIC, average_local_models
from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.errors import ConfigError


def oracle_global_accuracy(
    client_states: Sequence[Mapping[str, Any]], config: RunConfig, info: DatasetInfo, test: ImageSet
) -> dict[str, float]:
    """The paper's "global accuracy", as an evaluation-only oracle outside the protocol.

    It averages the *full* local models (extractors included, weighted by n_i) and scores the average
    on the whole test set, as the released code does. The protocol never moves an extractor, so this
    reads each site's own state (``client.state_dict()`` in one process, or a checkpoint's client
    parts) and nothing of it appears in the ledger. Report it under :data:`ORACLE_LABEL`.
    """
    if not client_states:
        raise ConfigError("the global-accuracy oracle needs at least one client state")
    decoupled_model(config, info, "FedMD-CG")  # the model must split into extractor and classifier
    weights = [float(s["num_samples"]) for s in client_states]
    return {ORACLE_METRIC: average_local_models(client_states, weights, config, info, test)}


register(
    Algorithm(
        "fedmdcg",
        "FedMD-CG: clients share a classifier and a feature generator (never the extractor); the "
        "server aggregates them by crossed data-free distillation. local_accuracy is the paper's local "
        "accuracy. Its global accuracy averages the full local models, which the protocol never "
        f"sends: global_accuracy_oracle, the {ORACLE_LABEL}",
        FedMDCGClient,
        FedMDCGServer,
        FedMDCGOptions,
        oracle=average_local_models,
        resolve_options=resolve_options,
    )
)
