"""configs/expected.toml: the papers' values, our measured values and the tolerances of the ready configs.

A sidecar, because `fedistill run --config FILE.toml` accepts only run keys and algorithm tables. The
file is rewritten whole (`write_expected`), so every entry is written in one format: `source`, the
paper's values, `tolerance`, then the other keys sorted; the comment lines above an entry are kept.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from fedistill import disk
from fedistill.reproduce.paths import EXPECTED


def read_expected(path: Path = EXPECTED) -> dict[str, dict[str, Any]]:
    """Every entry, keyed by the config's path under configs/ (none when the file is missing)."""
    return tomllib.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


EXPECTED_HEADER = """\
# Paper values, our values and tolerances for the ready configs under configs/.
#
# A sidecar, because `fedistill run --config FILE.toml` accepts only run keys and algorithm tables
# (an [expected] table in a config would be rejected as an unknown table).
# Keys: the config's path under configs/. Accuracies in %; paper_*_std: the paper's std over its seeds.
# ours_local / ours_global: our mean over ours_seeds at ours_rounds rounds; absent until measured
# (python benchmarks/fedmdcg_table.py ... --update-expected fills them in).
# tolerance (percentage points): how far a number may lie from the one it is checked against. Below the
# paper's scale (`fedistill reproduce --scale cpu`) ours is checked against ours_*, both ways; at the
# paper's scale against paper_*, where only falling short by more than the tolerance fails.
# Global accuracy: FedAvg's global model; every other method: global_accuracy_oracle, the average of
# the full local models (an evaluation-only oracle outside the protocol).
# The omega order of the paper's columns (10, 1, 0.1) is read from its appendix tables, where accuracy
# falls as heterogeneity grows.
# Reconstruction configs (reconstruction/*.toml, FedIOD's Table 9): paper_ssim_<source> and
# paper_psnr_<source> (dB) per test source (brats, fastmri, ixi), SSIM and PSNR per volume; tolerance_ssim
# and tolerance_psnr are the SSIM and PSNR columns' tolerances, applied in the same way.
"""


def toml_value(value: Any) -> str:
    """A TOML literal of `value`, as the file writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def notes_above(path: Path) -> dict[str, list[str]]:
    """The comment lines written above each entry of the file at `path` (its header aside), by key: the
    notes that introduce a group of entries ("# FedDF's Tables 3-8 ...")."""
    if not path.is_file():
        return {}
    text = path.read_text(encoding="utf-8")
    lines = text.removeprefix(EXPECTED_HEADER).splitlines()
    if not text.startswith(EXPECTED_HEADER):  # an older header: the comment block the file opens with
        while lines and (lines[0].startswith("#") or not lines[0].strip()):
            lines.pop(0)
    notes: dict[str, list[str]] = {}
    pending: list[str] = []
    for line in lines:
        if line.startswith("#"):
            pending.append(line)
        elif line.startswith("[") and line.rstrip().endswith("]"):
            if pending:
                notes[json.loads(line.strip()[1:-1])] = pending
            pending = []
    return notes


def write_expected(entries: dict[str, dict[str, Any]], path: Path = EXPECTED) -> None:
    """configs/expected.toml: the header above, then one table per config (keys in a fixed order), each
    after the comment lines the file had above it."""
    order = ("source", "paper_local", "paper_local_std", "paper_global", "paper_global_std", "tolerance")
    notes = notes_above(path)
    lines = [EXPECTED_HEADER]
    for key, entry in entries.items():
        if key in notes:
            lines += [*notes[key], ""]
        lines.append(f"[{json.dumps(key)}]")
        for name in (*order, *sorted(k for k in entry if k not in order)):
            if name in entry:
                lines.append(f"{name} = {toml_value(entry[name])}")
        lines.append("")
    disk.write_text(path, "\n".join(lines))
