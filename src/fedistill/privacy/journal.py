"""A DP site's spending kept after every message it answers, for in-process runs.

A checkpoint holds each site's privacy budget as of its round. The releases a site made after it and
before the run stopped reached the server all the same; restoring the checkpoint alone would make them
again with the same noise and count them once (where the replay is not bit-identical, the difference of
two releases is free of noise). So each in-process site with secret noise keeps its budget (accountant,
noise seed and count of noise streams) in `<run>/privacy/` after every message, and a resumed run takes
that newer record: the accountant counts the releases made since the checkpoint and their repeats draw
fresh noise. A resumed run that never wrote a checkpoint starts over with new sites, and they take the
kept records too. A Flower node needs none of this: it commits its whole state after every message. With
`dp_noise_seed = "run"` nothing is kept: the server can regenerate that noise anyway, and a resumed run
stays equal to an uninterrupted one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedistill.disk import write_text

log = logging.getLogger(__name__)

FOLDER = "privacy"


def journal_file(run_dir: Path, client_id: int) -> Path:
    return run_dir / FOLDER / f"client_{client_id:03d}.json"


def _secret_budget(client: Any) -> Any:
    """The client's `ClientBudget` when it noises its releases from a secret, else None."""
    budget = getattr(client, "budget", None)
    return budget if budget is not None and budget.secret is not None else None


def keep(run_dir: Path, client_id: int, client: Any) -> None:
    """Write the client's budget as it is now (after answering a message); nothing without secret DP."""
    budget = _secret_budget(client)
    if budget is not None:
        path = journal_file(run_dir, client_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(budget.state_dict()))


def catch_up(run_dir: Path, clients: Mapping[int, Any], *, restarted: bool = False) -> dict[int, int]:
    """After a checkpoint was restored: each client whose kept budget is ahead of it takes the kept one.
    Returns, per such client, how many noise streams it had drawn since the checkpoint.

    ``restarted``: the run is resumed but never wrote a checkpoint, so it starts over with new clients
    (each with a new secret). Their earlier releases reached the server all the same, so every kept record
    is taken whatever its secret: its phases and its secret with the count of streams drawn from it. The
    noise multiplier stays the client's own (configured, or calibrated again from the same settings).
    """
    ahead: dict[int, int] = {}
    for client_id, client in clients.items():
        budget, path = _secret_budget(client), journal_file(run_dir, client_id)
        if budget is None or not path.is_file():
            continue
        kept = json.loads(path.read_text())
        if restarted:  # the phases are facts of what was released, whatever accountant reads them
            accountant = {**kept["accountant"], "accountant": budget.accountant.accountant}
            kept = {**kept, "accountant": accountant, "noise": budget.noise}
        elif kept.get("secret") != budget.secret:  # another run's record (the secret is the run's own)
            continue
        since = int(kept.get("releases", 0)) - budget.releases
        steps = sum(int(phase[2]) for phase in kept["accountant"].get("history", []))
        if since > 0 or steps > budget.accountant.steps:
            budget.load_state_dict(kept)
            ahead[client_id] = since
    if ahead:
        log.warning(
            "sites %s released %s; their accountants count those releases and the repeats take fresh noise",
            ", ".join(map(str, sorted(ahead))),
            "before the run started over" if restarted else "after the checkpoint",
        )
    return ahead
