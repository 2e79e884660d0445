"""The 2-d normalisation layer every convolutional model uses, chosen by name.

FedDF's code switches BatchNorm for GroupNorm(g, ·) with ``--group_norm_num_groups g``; GroupNorm keeps
no running statistics, which matters when client data are non-IID and models are averaged.

The classifiers offer ``NORMS``; the dense-prediction nets also offer ``"instance"`` (InstanceNorm2d
without affine parameters or running statistics), the norm of fastMRI's U-Net and of CycleGAN's nets.
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedistill.errors import ConfigError
from fedistill.models.base import unknown_choice
from fedistill.models.checks import positive_int

NORMS = ("batch", "group", "none")
DENSE_NORMS = ("batch", "group", "instance", "none")


def check_norm(norm: str, valid: tuple[str, ...] = NORMS) -> None:
    """Raise ConfigError unless ``norm`` is one of ``valid`` (by default NORMS)."""
    if norm not in valid:
        raise unknown_choice("norm", norm, valid)


def make_norm2d(norm: str, channels: int, *, groups: int) -> nn.Module:
    """BatchNorm2d (``"batch"``), GroupNorm(groups, channels) (``"group"``), InstanceNorm2d
    (``"instance"``) or Identity (``"none"``)."""
    check_norm(norm, DENSE_NORMS)
    if norm == "batch":
        return nn.BatchNorm2d(channels)
    if norm == "group":
        positive_int("group_norm_groups", groups)
        if channels % groups != 0:
            raise ConfigError(
                f"group norm needs a group count that divides every layer's channels: "
                f"{channels} channels cannot be split into {groups} groups"
            )
        return nn.GroupNorm(groups, channels)
    if norm == "instance":
        return nn.InstanceNorm2d(channels)  # affine=False, no running statistics: as pix2pix and fastMRI
    return nn.Identity()


def norm_layers(model: nn.Module) -> dict[str, _BatchNorm]:
    """The model's BatchNorm layers that keep running statistics, by module name: the layers whose
    statistics a synthetic batch is matched to or a federation recomputes."""
    return {n: m for n, m in model.named_modules() if isinstance(m, _BatchNorm) and m.track_running_stats}
