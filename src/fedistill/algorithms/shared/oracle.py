"""The "global accuracy" of the FedMD-CG paper's tables, as an evaluation-only oracle.

The paper scores every method by a *virtual global model*: the sample-weighted average of the
clients' full local models (private extractors and heads included) on the whole test set. Only
FedAvg's protocol builds that model; FedPer, LG-FedAvg, FedGen (sharing classifiers), FedCG,
FedMD-CG and Local Training never move the private parts, so the average cannot come through a
message without breaking what those methods promise.

An algorithm that declares ``Algorithm(oracle=average_local_models)`` lets the run loop compute it
outside the protocol: in one process the runner reads each client object's own ``state_dict()``
(never a message, never the ledger) at every evaluation round and once at the end, and reports it
as :data:`ORACLE_METRIC` under :data:`ORACLE_LABEL`. Where the clients live elsewhere (Flower), the
runner has no client objects and reports that the oracle was not computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedistill.algorithms.shared.training import average_states, evaluate_model, new_model
from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.errors import ConfigError

ORACLE_METRIC = "global_accuracy_oracle"
ORACLE_LABEL = "global accuracy (oracle: averages full local models, outside the protocol)"


def average_local_models(
    client_states: Sequence[Mapping[str, Any]],
    weights: Sequence[float],
    config: RunConfig,
    info: DatasetInfo,
    test: ImageSet,
) -> float:
    """Test accuracy of the ``weights``-weighted average of every client's full model (``state["model"]``).

    Float entries (parameters, BatchNorm statistics) are averaged; integer buffers take the first
    client's value (see :func:`average_states`). The model is the run's ``config.model``.
    """
    if not client_states:
        raise ConfigError("the global-accuracy oracle needs at least one client state")
    missing = [i for i, state in enumerate(client_states) if "model" not in state]
    if missing:
        raise ConfigError(
            f"the global-accuracy oracle reads each client's full model from state['model']; "
            f"client state(s) {missing} have none"
        )
    model = new_model(config, info)
    model.load_state_dict(average_states([s["model"] for s in client_states], weights))
    return evaluate_model(model, test, info)["accuracy"]
