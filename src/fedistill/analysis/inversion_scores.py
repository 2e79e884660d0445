"""Scoring gradient inversion: DLG and iDLG on an intercepted gradient (FedMD-CG's Table 2's measure).

A reconstruction is scored against the batch the client really trained on (captured inside the client
as ground truth only): the PSNR and SSIM of the best one-to-one match, images in [0, 1].
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedistill.data.base import DatasetInfo
from fedistill.metrics.image_quality import best_match_psnr, ssim
from fedistill.privacy.attacks import AttackResult, NoLastLayerError, dlg_attack, idlg_attack


def to_unit(x: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    """Model inputs (normalised with the dataset's mean and std) back to images in [0, 1], on the CPU."""
    mean = torch.tensor(info.mean).view(1, -1, 1, 1)
    std = torch.tensor(info.std).view(1, -1, 1, 1)
    return (x.detach().cpu().float() * std + mean).clamp(0, 1)


@dataclass
class Score:
    """One attack's scores over the images it was run on, and how it went: per-image values and the
    reconstruction in the order of the batch they were matched to."""

    psnr: list[float]
    ssim: list[float]
    label_accuracy: float | None = None
    distance: float | None = None
    seconds: float = 0.0
    note: str = ""
    reconstruction: torch.Tensor | None = field(default=None, repr=False)  # in [0, 1], in truth's order

    def summary(self) -> dict[str, Any]:
        """Means, spreads (population standard deviations over the images, ddof 0) and the per-image
        values, as the result files hold them; ``None`` for the means and spreads of an attack that ran
        on no image. An exact reconstruction's PSNR (infinite) is written as ``None``, counted in
        ``psnr_infinite`` and said in the note, so the file stays JSON (no ``Infinity``); its PSNR mean and
        spread are then ``None`` too."""
        exact = sum(math.isinf(v) for v in self.psnr)
        finite = bool(self.psnr) and not exact
        out: dict[str, Any] = {
            "psnr_mean": float(np.mean(self.psnr)) if finite else None,
            "psnr_std": float(np.std(self.psnr)) if finite else None,
            "ssim_mean": float(np.mean(self.ssim)) if self.ssim else None,
            "ssim_std": float(np.std(self.ssim)) if self.ssim else None,
            "psnr": [None if math.isinf(v) else v for v in self.psnr],
            "ssim": self.ssim,
            "seconds": self.seconds,
        }
        if self.label_accuracy is not None:
            out["label_accuracy"] = self.label_accuracy
        if self.distance is not None:
            out["final_distance"] = self.distance
        notes = [self.note] if self.note else []
        if exact:
            out["psnr_infinite"] = exact
            notes.append(
                f"{exact} of {len(self.psnr)} images reconstructed exactly: infinite PSNR, written as null"
            )
        if notes:
            out["note"] = "; ".join(notes)
        return out


def score(truth01: torch.Tensor, rec01: torch.Tensor) -> tuple[list[float], list[float], torch.Tensor]:
    """Best one-to-one match (lowest MSE): per-reconstruction PSNR and SSIM, and the matched truth index."""
    values, index = best_match_psnr(truth01, rec01)
    side = min(truth01.shape[-2:])
    # SSIM's 11-pixel window (sigma 1.5) needs 11 pixels; smaller images (8x8 digits) get the widest that fits
    sigma = 1.5 if side >= 11 else ((side - 1) // 2 - 0.01) / 3.5
    return values.tolist(), ssim(truth01[index], rec01, sigma=sigma).tolist(), index


def matched(
    truth01: torch.Tensor, rec01: torch.Tensor
) -> tuple[list[float], list[float], torch.Tensor, torch.Tensor]:
    """`score`'s PSNR and SSIM and the reconstructions, all in the order of their matched truths (entry
    ``j`` of each is the reconstruction of image ``j``, as the grids and results show them), and the
    matched truth index of each reconstruction in its own order."""
    psnrs, ssims, index = score(truth01, rec01)
    ordered = torch.empty_like(rec01)
    ordered[index] = rec01
    by_truth = index.argsort().tolist()  # truth j was matched by reconstruction by_truth[j]
    return [psnrs[i] for i in by_truth], [ssims[i] for i in by_truth], ordered, index


def merge(scores: list[Score]) -> Score:
    """Pool several clients' scores of one setting (images in the order of their truths)."""
    labelled = [s for s in scores if s.label_accuracy is not None]
    weights = [len(s.psnr) for s in labelled]
    recs = [s.reconstruction for s in scores if s.reconstruction is not None]
    return Score(
        [v for s in scores for v in s.psnr],
        [v for s in scores for v in s.ssim],
        float(np.average([s.label_accuracy for s in labelled], weights=weights)) if labelled else None,
        float(np.mean([s.distance for s in scores if s.distance is not None]))
        if any(s.distance is not None for s in scores)
        else None,
        sum(s.seconds for s in scores),
        "; ".join(sorted({s.note for s in scores if s.note})),
        torch.cat(recs) if len(recs) == len(scores) and recs else None,
    )


# --- DLG / iDLG on an observed gradient -------------------------------------------------------------------


def attack_gradient(
    model: nn.Module,
    observed: dict[str, torch.Tensor],
    truth: torch.Tensor,
    labels: torch.Tensor,
    info: DatasetInfo,
    *,
    iterations: int,
    seed: int,
) -> dict[str, Score]:
    """DLG and iDLG against ``observed`` (a gradient keyed by parameter name); ``truth`` is the client's
    batch in model-input space. iDLG needs the last layer's gradient and reads one label per class; without
    that layer, or for a batch larger than the classes, it is reported as n/a with the reason. Any other
    error (a bad argument) is raised."""
    truth01 = to_unit(truth, info)
    out: dict[str, Score] = {}
    for name, attack in (("dlg", dlg_attack), ("idlg", idlg_attack)):
        start = time.perf_counter()
        if name == "idlg" and len(truth) > info.num_classes:
            note = f"the batch of {len(truth)} exceeds the {info.num_classes} classes"
            out[name] = Score([], [], note=f"n/a: iDLG reads one label per class, and {note}")
            continue
        try:
            result: AttackResult = attack(
                model,
                observed,
                tuple(truth.shape),
                info.num_classes,
                iterations=iterations,
                generator=torch.Generator().manual_seed(seed),
                mode="train",
            )
        except NoLastLayerError:
            out[name] = Score([], [], note="n/a: the reply holds no last layer to read labels from")
            continue
        rec01 = to_unit(result.reconstruction, info)
        psnrs, ssims, ordered, index = matched(truth01, rec01)
        out[name] = Score(
            psnrs,
            ssims,
            float((result.labels.cpu() == labels[index]).float().mean()),
            result.final_distance,
            time.perf_counter() - start,
            "diverged" if result.diverged else "",
            ordered,
        )
    return out


def gradient_check(
    model: nn.Module, observed: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
) -> float:
    """Relative error between the observed gradient and the true one of the captured batch (1-step cases)."""
    model = copy.deepcopy(model).train()
    params = dict(model.named_parameters())
    names = list(observed)
    true = torch.autograd.grad(F.cross_entropy(model(x), y), [params[n] for n in names])
    num = sum(float(((observed[n] - t) ** 2).sum()) for n, t in zip(names, true, strict=True))
    den = sum(float((t**2).sum()) for t in true)
    return math.sqrt(num / max(den, 1e-30))
