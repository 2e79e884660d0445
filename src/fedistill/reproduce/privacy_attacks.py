"""Gradient inversion against what each method's client actually sends (FedMD-CG's Table 2, and FedIOD):
every threat model of `fedistill.analysis.threat_models` on one dataset and model variant, over the
in-process transport.

Settings, one row each: ``fedavg-1step`` (one local step on a batch of 1), ``fedavg-multistep`` (one
epoch of several batch-1 steps), the partial-sharing methods with their private part ``known`` (rebuilt
from the run seed) and ``unknown``, FedIOD's D-step inversion and the server's own synthetic inputs, and
``reference/mean-image``: the training split's mean image against each attacked image, the PSNR an
attacker gets by knowing only the data distribution. Scores at or below it mean nothing was recovered.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fedistill.analysis.inversion_scores import Score, merge, score, to_unit
from fedistill.analysis.similarity import to_unit as images_to_unit
from fedistill.analysis.threat_models import Setup, fedavg_setting, fediod_setting, partial_setting
from fedistill.federation.client import ClientLogic
from fedistill.federation.ledger import Ledger
from fedistill.metrics.image_quality import save_image_grid
from fedistill.reproduce.paths import CHECKOUT
from fedistill.transports.inprocess import InProcessFleet

#: FedMD-CG's Table 2 (DLG PSNR in dB, mean over seeds; the paper has no MNIST column).
PAPER_TABLE2 = {
    "fashion-mnist": {"fedavg": 22.63, "fedper": 19.66, "lgfedavg": 6.33, "fedmdcg": 7.02},
    "emnist": {"fedavg": 24.54, "fedper": 23.55, "lgfedavg": 6.78, "fedmdcg": 6.95},
}


def in_process(clients: Mapping[int, ClientLogic]) -> InProcessFleet:
    """The transport the attacks run over: clients in this process, a ledger kept in memory only."""
    return InProcessFleet(clients, Ledger(None))


#: The methods ``args.methods`` may name, in the order the table runs them.
METHODS = ("fedavg", "fedper", "lgfedavg", "fedmdcg", "fediod")


def check_methods(methods: str) -> set[str]:
    """The comma-separated method names, each one of `METHODS`: a misspelt one would leave its rows out."""
    wanted = set(methods.split(","))
    unknown = sorted(wanted - set(METHODS))
    if unknown:
        names = ", ".join(repr(m) for m in unknown)
        raise ValueError(f"unknown method {names} in methods {methods!r}; choose from {', '.join(METHODS)}")
    return wanted


SETTINGS = [
    "fedavg-1step",
    "fedavg-multistep",
    "fedper/known-head",
    "fedper/unknown-head",
    "lgfedavg/known-extractor",
    "lgfedavg/unknown-extractor",
    "fedmdcg/known-extractor",
    "fedmdcg/unknown-extractor",
    "fediod/dstep-inversion",
    "fediod/server-inputs",
    "reference/mean-image",
]


OBSERVED = {
    "fedavg-1step": "whole-model update (1 step, batch 1)",
    "fedavg-multistep": "whole-model update (one epoch of batch-1 steps)",
    "fedper/known-head": "extractor update; head rebuilt from the seed",
    "fedper/unknown-head": "extractor update; head unknown",
    "lgfedavg/known-extractor": "classifier update; extractor rebuilt from the seed",
    "lgfedavg/unknown-extractor": "classifier update; extractor unknown",
    "fedmdcg/known-extractor": (
        "classifier update (+ generator, counts), batch 2; extractor rebuilt from the seed"
    ),
    "fedmdcg/unknown-extractor": "classifier update (+ generator, counts), batch 2; extractor unknown",
    "fediod/dstep-inversion": (
        "class counts (stage 1), logits, density ratios, input-gradients; T_k granted, D_k init from the seed"
    ),
    "fediod/server-inputs": "the server's own synthetic inputs x",
    "reference/mean-image": "nothing: the training split's mean image",
}


def run_dataset_variant(setup: Setup) -> dict[str, Any]:
    """Every asked setting on one dataset and variant (`setup.args`: `images`, `multi_steps`, `methods`),
    each on private images of its own, then the mean-image reference against every attacked image.

    Each attacked setting records ``images``, the number it attacked: fewer than ``images`` where whole
    clients do not fit (multi-step FedAvg: clients of ``multi_steps`` images; FedMD-CG: batches of 2), more
    for FedIOD on one image (its D-step needs a batch of 2)."""
    args = setup.args
    n = args.images
    steps = max(1, min(args.multi_steps, n))
    wanted = check_methods(args.methods)
    results: dict[str, Any] = {}
    offset = 0

    def keep(setting: str, entries: list[dict[str, Any]]) -> None:
        scores = {a: merge([e["scores"][a] for e in entries]) for a in ("dlg", "idlg")}
        checks = [e["gradient_check"] for e in entries if e.get("gradient_check") is not None]
        results[setting] = {
            "scores": scores,
            "truth": torch.cat([e["truth"] for e in entries]),
            "images": sum(len(e["truth"]) for e in entries),
            "gradient_check_max": max(checks) if checks else None,
            "kinds": entries[0]["kinds"],
        }

    if "fedavg" in wanted:
        single, offset = fedavg_setting(setup, 1, n, offset)
        keep("fedavg-1step", single[""])
        multi, offset = fedavg_setting(setup, steps, max(1, n // steps), offset)
        keep("fedavg-multistep", multi[""])
    for algorithm, private_part in (("fedper", "head"), ("lgfedavg", "extractor"), ("fedmdcg", "extractor")):
        if algorithm in wanted:
            # FedMD-CG's generator has BatchNorm1d and trains on the cached real batches: batch >= 2
            batch = 2 if algorithm == "fedmdcg" and n >= 2 else 1
            if algorithm == "fedmdcg" and n < 2:
                note = "n/a: FedMD-CG's setting needs images >= 2 (a batch of 2)"
                for knowledge in ("known", "unknown"):
                    scores = {a: Score([], [], note=note) for a in ("dlg", "idlg")}
                    results[f"{algorithm}/{knowledge}-{private_part}"] = {
                        "scores": scores,
                        "images": 0,
                        "kinds": [],
                    }
                continue
            out, offset = partial_setting(setup, algorithm, n // batch, batch, offset)
            for knowledge in ("known", "unknown"):
                keep(f"{algorithm}/{knowledge}-{private_part}", out[knowledge])
    if "fediod" in wanted:
        out, offset = fediod_setting(setup, max(2, n), offset)
        for name, entry in out.items():
            results[f"fediod/{name}"] = {
                "scores": {"attack": entry["score"]},
                "truth": entry["truth"],
                "images": len(entry["truth"]),
                "replay_error": entry.get("replay_error"),
                "kinds": entry["kinds"],
            }
    # reference: the mean training image against every image attacked above, once each (the known and
    # unknown rows of a method attack the same images, as do FedIOD's two)
    truths = [r["truth"] for r in results.values() if "truth" in r]
    if truths:
        mean01 = images_to_unit(setup.train).mean(0, keepdim=True)  # uint8 / 255, or [0, 1] floats
        truth01 = to_unit(torch.unique(torch.cat(truths), dim=0), setup.info)
        psnrs, ssims = [], []
        for t in truth01:
            p, s, _ = score(t[None], mean01)
            psnrs += p
            ssims += s
        results["reference/mean-image"] = {"scores": {"attack": Score(psnrs, ssims)}, "kinds": []}
    return results


def save_grids(setup: Setup, results: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """One image grid per setting (top row: the client's batch; then each attack's reconstruction); each
    grid's path, from the checkout where it lies inside it. An attack without a reconstruction (FedPer's
    iDLG: no last layer in the reply) has no row, and the grid's title says why."""
    paths = {}
    for setting, entry in results.items():
        if "truth" not in entry:
            continue
        truth01 = to_unit(entry["truth"], setup.info)
        rows, titles, missing = [truth01], ["client"] * len(truth01), []
        for attack, sc in entry["scores"].items():
            if sc.reconstruction is None or len(sc.reconstruction) != len(truth01):
                missing.append(f"; no {attack} row ({sc.note or 'not every image was reconstructed'})")
            else:
                rows.append(sc.reconstruction)
                titles += (
                    [f"{attack} {p:.1f}dB" for p in sc.psnr]
                    if len(sc.psnr) == len(truth01)
                    else [attack] * len(truth01)
                )
        if len(rows) == 1:
            continue
        name = f"{setup.dataset}_{setup.variant}_{setting.replace('/', '_')}.png"
        path = save_image_grid(
            torch.cat(rows),
            out_dir / name,
            nrow=len(truth01),
            titles=titles,
            title=f"{setup.dataset}, {setup.variant}: {setting}" + "".join(missing),
        )
        paths[setting] = str(path.relative_to(CHECKOUT)) if path.is_relative_to(CHECKOUT) else str(path)
    return paths
