"""FedDF's fusion: distil the weighted ensemble of the received models into one student per group.

Adam (or SGD) with a cosine schedule, gradient clipping, validation every `eval_every_steps` steps and
early stopping after `patience` evaluations without improvement; the best-on-validation student is
kept. The one-shot baselines reuse `distill` as their server-side step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from fedistill import devices
from fedistill.algorithms.base import clone_state
from fedistill.algorithms.feddf.options import DISTILL_CHOICES, LOSSES, FedDFOptions
from fedistill.algorithms.shared.distillation_data import DistillationSource
from fedistill.algorithms.shared.option_checks import check_choices
from fedistill.errors import ConfigError, FederationError
from fedistill.seeding import derive_seed, global_rng


def ensemble_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    weights: torch.Tensor,
    *,
    mode: str = "avg-logits",
    temperature: float = 1.0,
    t_squared: bool = False,
) -> torch.Tensor:
    """KL(target || softmax(student / T)), batch mean, for teacher logits (K, B, C) and weights (K,).

    avg-logits: target = softmax(sum_k w_k z_k / T) (AVGLOGITS). avg-probs: target = sum_k w_k
    softmax(z_k / T) (the released code applies T to the student only here; at T = 1 they agree).
    avg-losses: sum_k w_k KL(softmax(z_k / T) || softmax(student / T)).
    """
    log_student = F.log_softmax(student_logits / temperature, dim=-1)
    w = weights.to(teacher_logits.dtype).view(-1, 1, 1)
    if mode == "avg-logits":
        target = F.softmax((w * teacher_logits).sum(0) / temperature, dim=-1)
        loss = F.kl_div(log_student, target, reduction="batchmean")
    elif mode == "avg-probs":
        target = (w * F.softmax(teacher_logits / temperature, dim=-1)).sum(0)
        loss = F.kl_div(log_student, target, reduction="batchmean")
    elif mode == "avg-losses":
        targets = F.softmax(teacher_logits / temperature, dim=-1)
        loss = sum(
            float(w[k]) * F.kl_div(log_student, targets[k], reduction="batchmean")
            for k in range(teacher_logits.shape[0])
        )
    else:
        raise ConfigError(f"unknown FedDF loss {mode!r}; choose one of {', '.join(LOSSES)}")
    return loss * temperature**2 if t_squared else loss  # type: ignore[return-value]


@dataclass
class DistillationReport:
    """What one distillation did: evaluations as (step, validation accuracy); step 0 is the start."""

    steps: int = 0
    evaluations: list[tuple[int, float]] = field(default_factory=list)
    selected_step: int = -1  # the step whose student was kept (0: the averaged model itself)
    selected_accuracy: float = float("nan")
    stopped_early: bool = False
    losses: list[float] = field(default_factory=list)


def distill(
    student: nn.Module,
    teachers: Sequence[nn.Module],
    weights: Sequence[float],
    source: DistillationSource,
    validate: Callable[[nn.Module], float],
    options: FedDFOptions,
    generator: torch.Generator,
) -> DistillationReport:
    """Distil the weighted ensemble of `teachers` into `student` in place; leave the best-on-validation
    student in it (the averaged start competes only with `fallback_to_average`). Teachers run in eval
    mode; the student in train mode with its BatchNorm layers frozen by default (`student_bn =
    "adapt"`, the released code, lets their statistics follow the distillation data). The last step
    is always evaluated."""
    check_choices(options.section, options, DISTILL_CHOICES)  # no silent fallback below
    if not teachers:
        raise FederationError("FedDF has no teacher to distil from (every received model was dropped)")
    for teacher in teachers:
        teacher.eval()
    w = torch.tensor(list(weights), dtype=torch.float32, device=devices.current())
    w = w / w.sum()
    if options.distill_optimizer == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(
            student.parameters(), lr=options.distill_lr, momentum=0.9
        )
    else:
        optimizer = torch.optim.Adam(student.parameters(), lr=options.distill_lr)
    report = DistillationReport()
    start = validate(student)
    report.evaluations.append((0, start))
    best_accuracy, best_state = (start, clone_state(student)) if options.fallback_to_average else (-1.0, None)
    best_step, since_best = 0, 0
    for step in range(1, options.steps + 1):
        _train_mode(student, options.student_bn)
        if options.schedule == "cosine":
            lr = 0.5 * options.distill_lr * (1.0 + math.cos(math.pi * (step - 1) / options.steps))
            for group in optimizer.param_groups:
                group["lr"] = lr
        x = source.batch(options.distill_batch_size, generator)
        with torch.no_grad():
            targets = torch.stack([teacher(x) for teacher in teachers])
        with global_rng(derive_seed(generator.initial_seed(), "student-dropout", step)):
            outputs = student(x)
        loss = ensemble_loss(
            outputs,
            targets,
            w,
            mode=options.loss,
            temperature=options.temperature,
            t_squared=options.t_squared,
        )
        if not torch.isfinite(loss):
            if not torch.isfinite(targets).all():
                cause = "the ensemble's logits are not finite (a received model or the source is broken)"
            elif not torch.isfinite(outputs).all() and step == 1:
                cause = "the student's starting logits are not finite"
            else:
                cause = f"lower {options.section}.distill_lr"
            raise FederationError(f"FedDF's distillation loss is {loss.item()} at step {step}: {cause}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if options.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(student.parameters(), options.clip_grad_norm)
        optimizer.step()
        report.losses.append(loss.item())
        report.steps = step
        if step % options.eval_every_steps and step != options.steps:
            continue
        score = validate(student)
        report.evaluations.append((step, score))
        if score > best_accuracy:
            best_accuracy, best_state, best_step, since_best = score, clone_state(student), step, 0
        else:
            since_best += 1
            if since_best >= options.patience:
                report.stopped_early = step < options.steps
                break
    if best_state is not None:
        student.load_state_dict(best_state)
    report.selected_step, report.selected_accuracy = best_step, best_accuracy
    return report


def _train_mode(student: nn.Module, bn: str) -> None:
    """Train mode; with `bn = "frozen"` the BatchNorm layers stay in eval mode (running statistics)."""
    student.train()
    if bn == "frozen":
        for module in student.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()
