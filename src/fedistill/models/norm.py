"""The 2-d normalisation layer every convolutional model uses, chosen by name.

FedDF's code switches BatchNorm for GroupNorm(g, ·) with ``--group_norm_num_groups g``; GroupNorm keeps
no running statistics, which matters when client data are non-IID and models are averaged.
"""

from __future__ import annotations

from torch import nn

from fedistill.errors import ConfigError
from fedistill.models.base import unknown_choice

NORMS = ("batch", "group", "none")


def check_norm(norm: str) -> None:
    """Raise ConfigError unless ``norm`` is one of NORMS."""
    if norm not in NORMS:
        raise unknown_choice("norm", norm, NORMS)


def make_norm2d(norm: str, channels: int, *, groups: int) -> nn.Module:
    """BatchNorm2d (``"batch"``), GroupNorm(groups, channels) (``"group"``) or Identity (``"none"``)."""
    check_norm(norm)
    if norm == "batch":
        return nn.BatchNorm2d(channels)
    if norm == "group":
        if groups < 1 or channels % groups != 0:
            raise ConfigError(
                f"group norm needs a group count that divides every layer's channels: "
                f"{channels} channels cannot be split into {groups} groups"
            )
        return nn.GroupNorm(groups, channels)
    return nn.Identity()
