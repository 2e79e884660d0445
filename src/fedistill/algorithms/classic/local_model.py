"""A client's local model, built when a round needs it and released when the round is done.

Why: a site that is not sampled holds no model. With 1,000 sites and 10% sampled per round, keeping
every site's model alive between rounds made memory grow with the idle sites (and building them all
up front cost seconds). A round always loads the received global weights into the model before
training, and `new_model` initialises from the run seed alone, so a model built afresh each round
trains to exactly the weights the kept one did.
"""

from __future__ import annotations

from torch import nn

from fedistill.algorithms.shared.training import new_model
from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo
from fedistill.federation.messages import state_specs


class LocalModel:
    """The run's model for one site (`new_model`), built on first use, dropped by `release`."""

    def __init__(self, config: RunConfig, info: DatasetInfo, name: str | None = None) -> None:
        self.config, self.info, self.name = config, info, name
        self._model: nn.Module | None = None
        self._specs: dict | None = None

    @property
    def model(self) -> nn.Module:
        """The model, built (from the run seed) if the site holds none now."""
        if self._model is None:
            self._model = new_model(self.config, self.info, self.name)
            if self._specs is None:
                self._specs = state_specs(self._model.state_dict())
        return self._model

    @property
    def specs(self) -> dict:
        """The names, shapes and dtypes of the model's state, which the received parameters must match."""
        if self._specs is None:
            self.model  # noqa: B018 - building it records the specs
        assert self._specs is not None
        return self._specs

    @property
    def held(self) -> bool:
        """Whether the site holds a built model now."""
        return self._model is not None

    def release(self) -> None:
        """Drop the model (and its gradients); the next use builds it again."""
        self._model = None
