"""One-shot federated learning: one upload of local models or answers, no later rounds. DENSE,
Co-Boosting, and one-shot FedAvg/FedDF over the same stage-1 models (`shared/stage1.py`)."""

from fedistill.algorithms.one_shot import baselines, coboosting, dense  # noqa: F401
from fedistill.algorithms.one_shot.coboosting import CoBoostingOptions, resolve_options  # noqa: F401
