"""fedistill: federated learning by distillation (FedIOD, FedDF, FedMD-CG and their baselines).

The Python API (`fedistill.api`): `run`, `summary`, `load_model`, `export`, and the `RunResult` and
`TrainedModel` they return. They are imported on first use, so `import fedistill` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedistill.version import __version__

if TYPE_CHECKING:
    from fedistill.api import RunResult, TrainedModel, load_model, run, summary
    from fedistill.inference.export import export

#: Public name -> the module that defines it.
_LAZY = {
    "run": "fedistill.api",
    "summary": "fedistill.api",
    "load_model": "fedistill.api",
    "RunResult": "fedistill.api",
    "TrainedModel": "fedistill.api",
    "export": "fedistill.inference.export",
}

__all__ = ["RunResult", "TrainedModel", "__version__", "export", "load_model", "run", "summary"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'fedistill' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, the lazy ones included."""
    return sorted(__all__)
