"""A finished FedIOD run's clients as PATE teachers: their frozen stage-1 models, their votes on samples
of the run's generator, and a fresh student trained on the released labels alone (FedIOD's Table 5).

A teacher is trained on one client's whole data set, so one vote moving is one *client* changing
anything in its data: the privacy accounting on these votes is client-level.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedistill.algorithms.fediod import FedIODOptions, teacher_name
from fedistill.algorithms.shared.distillation_data import GeneratorSource, load_generator
from fedistill.algorithms.shared.training import new_model
from fedistill.config import options_for
from fedistill.engine.checkpoint import latest_checkpoint, load_state
from fedistill.seeding import torch_generator


@dataclass
class Queries:
    """The synthetic inputs, every client's vote on each, and the teachers' mean logits (no-DP rows)."""

    x: torch.Tensor
    votes: np.ndarray  # (N, C) vote counts
    mean_logits: torch.Tensor


def load_teachers(run: Path, config: Any, info: Any) -> list[nn.Module]:
    """Every client's frozen teacher as saved in the run's last checkpoint."""
    checkpoint = latest_checkpoint(run / "checkpoints")
    if checkpoint is None:
        sys.exit(f"{run} has no checkpoint; FedIOD runs save one at the end (checkpoints/round_*)")
    options = options_for(config, "fediod", FedIODOptions)
    teachers = []
    for k in range(config.clients):
        state = load_state(checkpoint / f"client_{k:03d}")
        teacher = new_model(config, info, teacher_name(options, config, k))
        teacher.load_state_dict(state["teacher"])
        teachers.append(teacher.eval())
    return teachers


@torch.no_grad()
def make_queries(run: Path, teachers: list[nn.Module], info: Any, n: int, seed: int) -> Queries:
    """`n` samples of the run's generator (eval mode), the teachers' votes and mean logits on them."""
    source = GeneratorSource(load_generator(run / "models" / "generator.safetensors"), info, "fediod")
    x = torch.cat(
        [source.batch(500, torch_generator(seed, "pate-queries", i)) for i in range(math.ceil(n / 500))]
    )[:n]
    votes = np.zeros((n, info.num_classes))
    logits_sum = torch.zeros(n, info.num_classes)
    for teacher in teachers:
        logits = torch.cat([teacher(chunk) for chunk in x.split(500)])
        votes[np.arange(n), logits.argmax(1).numpy()] += 1
        logits_sum += logits
    return Queries(x, votes, logits_sum / len(teachers))


def train_student(
    config: Any, info: Any, x: torch.Tensor, target: torch.Tensor, soft: bool, steps: int, seed: int
) -> nn.Module:
    """A fresh student of the run's architecture on the released labels (or, `soft`, logits: KD)."""
    student = new_model(config, info)
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-3)
    generator = torch_generator(seed, "pate-student")
    student.train()
    done = 0
    while done < steps:
        for idx in torch.randperm(len(x), generator=generator).split(64)[: steps - done]:
            out = student(x[idx])
            # soft: FedIOD's logit mimicry (tau -> infinity: L2 between logits)
            loss = F.mse_loss(out, target[idx]) if soft else F.cross_entropy(out, target[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
    return student.eval()
