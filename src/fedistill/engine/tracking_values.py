"""What the trackers log, worked out once for both: scalar names and values, the config as text, the
files a finished run attaches."""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from fedistill.config import RunConfig
from fedistill.engine.rundir import read_jsonl

#: Traffic of one round: direction (`client->server`, `server->client`) -> content kind -> bytes.
Communication = dict[str, dict[str, int]]


def row_scalars(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a metrics row (nested tables flattened to `a/b`), without its round; values
    metrics.jsonl writes as null (NaN, infinities) are left out, as they are there."""
    scalars: dict[str, float] = {}
    for key, value in row.items():
        if key == "round" and not prefix:
            continue
        if isinstance(value, dict):
            scalars |= row_scalars(value, f"{prefix}{key}/")
        elif isinstance(value, int | float) and math.isfinite(value):
            scalars[metric_name(prefix + str(key))] = float(value)
    return scalars


def communication_scalars(communication: Communication, prefix: str = "bytes") -> dict[str, float]:
    """`bytes/<direction>/total` and `bytes/<direction>/<kind>`, both directions always present."""
    scalars: dict[str, float] = {}
    for direction in ("client->server", "server->client"):
        kinds = communication.get(direction, {})
        name = direction.replace("->", "_to_")
        scalars[f"{prefix}/{name}/total"] = float(sum(kinds.values()))
        scalars |= {metric_name(f"{prefix}/{name}/{kind}"): float(size) for kind, size in kinds.items()}
    return scalars


def final_scalars(summary: dict[str, Any]) -> dict[str, float]:
    """The final metrics and the run's total traffic per direction and kind (set-up and final
    evaluation included), under `final/`."""
    totals = {d: summary["communication"][d]["per_kind"] for d in ("client->server", "server->client")}
    return row_scalars(summary["final"], "final/") | communication_scalars(totals, "final/bytes")


def metric_name(name: str) -> str:
    """A name both trackers take as is (MLflow allows letters, digits, `_`, `.`, `-`, `/` and spaces)."""
    return re.sub(r"[^/\w.\- ]", "_", name)


def config_markdown(config: RunConfig) -> str:
    """The resolved config as a Markdown table (TensorBoard's text tab renders it)."""
    lines = ["| key | value |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in config_params(config).items()]
    return "\n".join(lines)


def config_params(config: RunConfig) -> dict[str, str]:
    """The resolved config as flat `key -> text` pairs; an algorithm's options as `name.key`."""
    params: dict[str, str] = {}
    for key, value in config.to_dict().items():
        if isinstance(value, dict):
            params |= {f"{key}.{k}": json.dumps(v) for k, v in value.items()}
        else:
            params[key] = str(value)
    return params


def traffic_by_round(lines: list[str]) -> dict[int, Communication]:
    """The bytes sent per round, direction and kind in ledger.jsonl lines (blank ones skipped)."""
    traffic: dict[int, Communication] = {}
    for line in lines:
        if line.strip():
            record = json.loads(line)
            kinds = traffic.setdefault(record["round"], {}).setdefault(record["direction"], {})
            for kind, size in record["kinds"].items():
                kinds[kind] = kinds.get(kind, 0) + size
    return traffic


def history(run_dir: Path) -> list[tuple[dict[str, Any], Communication]]:
    """Each round a resumed run already holds, as the run loop hands it to a tracker: its metrics row (only
    `round` for set-up traffic) and traffic. For a tracker that starts on a resumed run holding none of it
    (`track` added on the resume, an MLflow run that is gone), so its view starts at round 1 too."""
    path = run_dir / "ledger.jsonl"
    ledger = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    traffic = traffic_by_round(ledger)
    path = run_dir / "metrics.jsonl"
    rows = {row["round"]: row for row in (read_jsonl(path) if path.exists() else [])}
    last = max(rows, default=0)  # both files are cut back to the checkpoint: nothing after it
    rounds = sorted(r for r in rows.keys() | traffic.keys() if r <= last)
    return [(rows.get(r, {"round": r}), traffic.get(r, {})) for r in rounds]


def resumed_round(run_dir: Path) -> int:
    """The last round metrics.jsonl holds when tracking starts: 0 for a fresh run, else where a
    resumed run picks up (the loop has already cut the file back to its checkpoint)."""
    path = run_dir / "metrics.jsonl"
    rows = read_jsonl(path) if path.exists() else []
    return int(rows[-1]["round"]) if rows else 0


def artifacts(run_dir: Path) -> dict[str, list[Path]]:
    """What a finished run attaches, by the folder it goes under: its plots and any model card
    (an export writes `export/<file>.card.md` and `.card.json`)."""
    plots = [run_dir / "plots" / name for name in ("learning_curve.png", "partition.png")]
    cards = sorted(p for p in run_dir.rglob("*card*") if p.is_file())
    found: dict[str, list[Path]] = defaultdict(list)
    found["plots"] = [p for p in plots if p.is_file()]
    for card in cards:
        found[card.parent.relative_to(run_dir).as_posix()].append(card)
    return {folder: paths for folder, paths in found.items() if paths}
