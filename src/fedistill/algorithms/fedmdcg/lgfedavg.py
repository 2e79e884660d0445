"""LG-FedAvg (Liang et al. 2020): FedPer's mirror image, sharing the head and keeping the base private.

Each client keeps its own feature extractor (``extractor.*``, the "local representation") and the
server averages only the classifiers (``classifier.*``, the global head). The round and the metrics
are FedPer's (see fedper.py); only the shared prefix differs.

Not reproduced: the authors' code starts every client from a FedAvg-trained model; here every client
starts from the run's seeded initialisation, like the other methods of the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedistill.algorithms.base import Algorithm, register
from fedistill.algorithms.fedmdcg.fedper import SharedPartClient, SharedPartOptions, SharedPartServer
from fedistill.algorithms.shared.oracle import average_local_models
from fedistill.models.base import CLASSIFIER_PREFIX


@dataclass(frozen=True)
class LGFedAvgOptions(SharedPartOptions):
    """`[lgfedavg]` options: FedPer's, under their own section name."""

    section: ClassVar[str] = "lgfedavg"


class LGFedAvgClient(SharedPartClient):
    """Trains its private extractor under the received global classifier; returns the classifier."""

    shared_prefix = CLASSIFIER_PREFIX


class LGFedAvgServer(SharedPartServer):
    """Averages the clients' classifiers; never sees an extractor."""

    shared_prefix = CLASSIFIER_PREFIX


register(
    Algorithm(
        "lgfedavg",
        "LG-FedAvg: average the classifiers, keep each extractor private (local accuracy; no global model)",
        LGFedAvgClient,
        LGFedAvgServer,
        LGFedAvgOptions,
        oracle=average_local_models,
    )
)
