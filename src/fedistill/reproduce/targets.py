"""The registry of reproducible results: every target `fedistill reproduce` knows, by name.

Each family declares its targets in its own module (`targets_fedmdcg`, `targets_one_shot`, `targets_gap`,
`targets_medical`, `targets_papers`); `target_spec` says what a target is. The registry is built on first
use: the config-based scales read configs/ and configs/expected.toml (of the checkout, or as the installed
package carries them: reproduce/paths.py).
"""

from __future__ import annotations

from functools import cache

from fedistill.errors import ConfigError, unknown_name
from fedistill.reproduce.target_spec import SCALES, Target
from fedistill.reproduce.targets_fedmdcg import fedmdcg_target
from fedistill.reproduce.targets_gap import gap_target
from fedistill.reproduce.targets_medical import nuclei_targets, reconstruction_target, segmentation_target
from fedistill.reproduce.targets_one_shot import one_shot_target
from fedistill.reproduce.targets_papers import paper_targets


@cache
def all_targets() -> dict[str, Target]:
    """Every target, in the order `--list` prints them."""
    targets = [
        fedmdcg_target(),
        one_shot_target(),
        gap_target(),
        segmentation_target(),
        reconstruction_target(),
        *nuclei_targets(),
        *paper_targets(),
    ]
    return {t.name: t for t in targets}


def target_names() -> list[str]:
    return list(all_targets())


def get_target(name: str, scale: str | None = None) -> Target:
    """The target `name`, which must have `scale` when one is given; ConfigError listing the valid ones."""
    targets = all_targets()
    if name not in targets:
        raise unknown_name("target", name, list(targets))
    target = targets[name]
    if scale is not None and scale not in target.scales:
        valid = [s for s in SCALES if s in target.scales]
        raise ConfigError(f"target {name!r} has no scale {scale!r}; valid: {', '.join(valid)}")
    return target
