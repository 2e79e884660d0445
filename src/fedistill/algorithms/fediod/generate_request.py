"""What a site reads from a `query.generate` request, checked on receipt, and the reply it builds: one
place for the site that answers alone (client.py) and for sites answering together (sites_together.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fedistill.algorithms.fediod.task_view import TaskView
from fedistill.data.base import DatasetInfo
from fedistill.errors import FederationError
from fedistill.federation.messages import ArraySpec, Message, expect_arrays


def input_spec(info: DatasetInfo) -> ArraySpec:
    """The spec of a batch of synthetic images of the run's dataset."""
    return ArraySpec("float32", (None, info.channels, info.image_size, info.image_size))


def condition_masks(
    message: Message, name: str, batch: int, view: TaskView, info: DatasetInfo
) -> torch.Tensor | None:
    """The conditioning masks of a batch of synthetic images (per-pixel tasks), checked on receipt."""
    if not view.conditional:
        return None
    size = info.image_size
    expect_arrays(message, "label-masks", {name: ArraySpec("uint8", (batch, size, size))}, exact=False)
    masks = message.tensor("label-masks", name).to(torch.int64)
    classes = view.condition_classes
    if masks.numel() and int(masks.max()) >= classes:
        raise FederationError(
            f"{message.type}: label-masks {name!r} hold the value {int(masks.max())}, but the condition has "
            f"{classes} classes (0..{classes - 1})"
        )
    return masks


@dataclass
class GenerateRequest:
    """One site's `query.generate`: G's batch `x` (with its masks and, for the per-client mixture, which
    samples are the site's: `own`), the previous step's S-step inputs that ride along (`student_x`), and
    `pending`: what rebuilds the site's G-step terms in another process (its `pending_inputs`)."""

    x: torch.Tensor
    masks: torch.Tensor | None
    own: torch.Tensor | None
    step: int
    want_ratio: bool
    lr_discriminator: float
    real_batch: int = 0  # real samples of the D-step: the batch's size unless the server names it
    student_x: torch.Tensor | None = None
    student_masks: torch.Tensor | None = None
    student_index: int = 0
    pending: dict[str, Any] = field(default_factory=dict)


def read_generate(message: Message, view: TaskView, info: DatasetInfo) -> GenerateRequest:
    """Check a `query.generate` request's arrays and read it."""
    inputs = message.arrays.get("synthetic-inputs", {})
    carried, mixture = "student_x" in inputs, "own" in inputs
    specs = {"x": input_spec(info)} | ({"student_x": input_spec(info)} if carried else {})
    x_payload = inputs.get("x")
    batch = int(x_payload.shape[0]) if x_payload is not None and len(x_payload.shape) >= 1 else 0
    if mixture:  # which of the batch's samples G drew for this site
        specs["own"] = ArraySpec("float32", (batch,))
        if "pair" in inputs:
            specs["pair"] = ArraySpec("int64", (batch,))
    expect_arrays(message, "synthetic-inputs", specs)
    x = message.tensor("synthetic-inputs", "x")
    masks = condition_masks(message, "m", batch, view, info)
    own = message.tensor("synthetic-inputs", "own") > 0.5 if mixture else None
    step = int(message.scalar("config", "step"))
    config = lambda key, default=None: message.scalar("config", key, default)  # noqa: E731
    request = GenerateRequest(
        x=x,
        masks=masks,
        own=own,
        step=step,
        want_ratio=bool(config("want_ratio")),
        lr_discriminator=float(config("lr_discriminator")),
        # owner_queries: the site sees its own samples only, and D_k still learns from the whole batch's
        # worth of real ones
        real_batch=int(config("real_batch", batch)),
    )
    if carried:
        request.student_x = message.tensor("synthetic-inputs", "student_x")
        request.student_masks = condition_masks(message, "student_m", len(request.student_x), view, info)
        request.student_index = int(config("student_index", 0))
    request.pending = {
        "x": x.detach().clone(),
        "step": step,
        "index": int(config("index", 0)),
        **{key: config(key) for key in ("c_gan", "c_conf", "tau", "gan_loss")},
        "c_bn": float(config("c_bn", 0.0)),
        "c_perceptual": float(config("c_perceptual", 0.0)),
        **({"own": own.clone()} if own is not None else {}),
        **({"masks": masks.clone()} if masks is not None else {}),
        **({"pair": message.tensor("synthetic-inputs", "pair").clone()} if "pair" in inputs else {}),
    }
    return request


def generate_reply(
    logits: torch.Tensor,
    ratio: torch.Tensor | None,
    student: dict[str, dict[str, torch.Tensor]],
    metrics: dict[str, float],
    encodings: dict[str, str],
) -> Message:
    """A site's answer to `query.generate`: its teacher's logits on G's batch, Eq. 8's ratios when asked
    for, and the targets of the S-step inputs that rode along (their names prefixed `student_`)."""
    arrays: dict[str, dict[str, torch.Tensor]] = {"logits": {"z": logits.detach()}}
    if ratio is not None:
        arrays["discriminator-outputs"] = {"ratio": ratio}
    for kind, named in student.items():
        arrays.setdefault(kind, {}).update({f"student_{name}": value for name, value in named.items()})
    return Message.build("query.generate", arrays=arrays, scalars={"metrics": metrics}, encodings=encodings)
