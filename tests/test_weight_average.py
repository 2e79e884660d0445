"""The moving average of a model's weights, on a hand-computed case."""

import pytest
import torch
from torch import nn

from fedistill.algorithms.shared.weight_average import WeightAverage


def test_the_average_moves_one_minus_decay_towards_the_trained_weights():
    trained = nn.Sequential(nn.Linear(1, 1, bias=False), nn.BatchNorm1d(1))
    with torch.no_grad():
        trained[0].weight.fill_(0.0)
    average = WeightAverage(trained, decay=0.9)
    with torch.no_grad():
        trained[0].weight.fill_(1.0)
        trained[1].running_mean.fill_(2.0)
        trained[1].num_batches_tracked.fill_(7)
    average.update(trained)
    assert float(average.model[0].weight) == pytest.approx(0.1)
    assert float(average.model[1].running_mean) == pytest.approx(0.2)  # 0.9 * 0 + 0.1 * 2
    assert int(average.model[1].num_batches_tracked) == 7  # counters are copied, not averaged
    average.update(trained)
    assert float(average.model[0].weight) == pytest.approx(0.19)  # 0.9 * 0.1 + 0.1 * 1
    assert not any(p.requires_grad for p in average.model.parameters())
    assert float(trained[0].weight.detach()) == 1.0  # the trained model is left as it is


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5])
def test_a_decay_outside_the_open_unit_interval_is_refused(decay):
    with pytest.raises(ValueError, match="decay"):
        WeightAverage(nn.Linear(1, 1), decay)
