"""Every common config key of a run (`fedistill.config.RunConfig`): its type, default and one-line doc.

The doc is the comment beside the key in config.py; where there is none, the help of the command-line
flag that sets it; where there is neither, `KEY_NOTES` below. A note goes as soon as config.py or the
flag documents the key (tests/test_docs.py fails on a note either already covers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fedistill.config import PER_ALGORITHM_KEYS, RunConfig
from fedistill.reference.field_docs import field_docs, one_line
from fedistill.reference.markdown import code, table
from fedistill.reference.parser import run_flag_help

#: The docs of the keys that neither config.py's comments nor a flag's help describe.
KEY_NOTES = {
    "group_norm_groups": 'groups of each GroupNorm layer when `norm = "group"`',
    "momentum": "momentum of the local optimiser (SGD)",
    "weight_decay": "weight decay of the local optimiser",
    "eval_every": "evaluate every N rounds (and always at the end)",
    "checkpoint_every": "checkpoint every N rounds (and always at the end)",
}


@dataclass(frozen=True)
class ConfigKey:
    """One common key as the reference shows it."""

    name: str
    type: str
    default: Any
    doc: str
    per_algorithm: bool  # an algorithm's table may override it for that algorithm alone


def common_keys() -> list[ConfigKey]:
    """Every common key of `RunConfig`, in declaration order (the `options` tables left out)."""
    flag_help = run_flag_help()
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    types = {f.name: str(f.type) for f in dataclasses.fields(RunConfig)}
    keys = []
    for item in field_docs(RunConfig):
        if item.name == "options":
            continue
        doc = item.text or flag_help.get(item.name, "") or KEY_NOTES.get(item.name, "")
        keys.append(
            ConfigKey(item.name, types[item.name], defaults[item.name], doc, item.name in PER_ALGORITHM_KEYS)
        )
    return keys


def config_markdown() -> str:
    """The page `reference/config.md`."""
    rows = [
        (
            f"`{key.name}`",
            f"`{key.type}`",
            code(key.default),
            one_line(key.doc) + (" ¹" if key.per_algorithm else ""),
        )
        for key in common_keys()
    ]
    return "\n".join(
        [
            "# Config keys",
            "",
            "Generated from `fedistill.config.RunConfig`. Every key can be set in a TOML file (`--config`), "
            "by a [flag](cli.md) where one exists, or with `--set KEY=VALUE`; later sources win. The "
            "options of each algorithm are a table named after it (`[fediod]`, `--set fediod.w_adv=0.5`): "
            "see [algorithm options](options/index.md).",
            "",
            table(("key", "type", "default", "meaning"), rows),
            "",
            "¹ An algorithm's own table may set this key for that algorithm alone (`[fedprox] lr = 0.01`).",
            "",
            "Other tables: `[partition_options]` takes the [partitioner's](partitioners.md) options, "
            "`[task]` the [task's](tasks.md) and `[model_options]` the [model's](models.md); a table named "
            "after the "
            "[dataset](datasets.md) (`[cifar100]`, `--set cifar100.labels=coarse`) takes its options.",
            "",
        ]
    )
