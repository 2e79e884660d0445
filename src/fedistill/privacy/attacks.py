"""Gradient-inversion attacks: DLG (Zhu et al. 2019) and iDLG (Zhao et al. 2020).

Threat model. An honest-but-curious server: it follows the protocol, and it holds exactly what crossed
the message boundary from one client, namely

* the model the client trained (architecture and the weights it was sent, so the server can rebuild it),
* the client's reply: a gradient, or new weights after local training (turned into a gradient estimate
  by `update_to_gradient`),
* the input shape and the number of classes, which are part of the task definition.

It never sees the client's data, labels or optimiser state. The attacks below search for inputs (and, for
DLG, soft labels) whose gradient on that model matches the observed one; a good match on a small model is
a near-copy of the private batch. Methods that send no parameters and no gradients (FedIOD, FedMD-CG's
generators) give this attacker nothing to match, which is the claim these attacks let us measure.

Assumptions shared by both attacks: the client's loss is the batch mean of the cross-entropy (the
library's default), and the model is twice differentiable where it matters (the DLG paper replaces ReLU
by Sigmoid; with ReLU the attack still runs but converges worse). Observed gradients are given in
``model.parameters()`` order, or as a dict ``name → tensor`` keyed by ``model.named_parameters()`` names;
a dict may cover only part of the model (e.g. when a method shares only some layers), and only those
parameters are matched.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "AttackResult",
    "Gradients",
    "NoLastLayerError",
    "dlg_attack",
    "idlg_attack",
    "infer_labels",
    "match_distance",
    "update_to_gradient",
]

Gradients = Sequence[torch.Tensor] | Mapping[str, torch.Tensor]
Mode = Literal["train", "eval"]


class NoLastLayerError(ValueError):
    """The observed gradients hold no last layer, so iDLG has no label to read (e.g. FedPer keeps its
    head private). Kept apart from other ValueErrors so a caller can report iDLG as not applicable
    without hiding a bad argument."""


@dataclass
class AttackResult:
    """What an attack recovered.

    ``reconstruction`` has the attacked input shape, e.g. ``(B, C, H, W)``, in the model's input space
    (denormalise before comparing with images in [0, 1]). ``labels`` are ``(B,)`` class indices: the argmax
    of the optimised soft labels (DLG) or the labels inferred from the last layer (iDLG). ``soft_labels``
    are the optimised label distributions ``(B, num_classes)`` for DLG, None for iDLG. ``loss_history``
    holds the gradient-matching distance at the start and after each L-BFGS step; the reconstruction is the
    iterate with the lowest distance seen. ``diverged`` is True when the distance became non-finite and
    the attack stopped early.
    """

    method: str
    reconstruction: torch.Tensor
    labels: torch.Tensor
    soft_labels: torch.Tensor | None
    loss_history: list[float] = field(default_factory=list)  # at the start, then after each step
    diverged: bool = False

    @property
    def final_distance(self) -> float:
        """The lowest gradient-matching distance reached (the one of ``reconstruction``)."""
        return min(self.loss_history) if self.loss_history else float("inf")


def match_distance(dummy: Sequence[torch.Tensor], observed: Sequence[torch.Tensor]) -> torch.Tensor:
    """DLG's objective: the squared L2 distance between two gradients, summed over all tensors."""
    if len(dummy) != len(observed):
        raise ValueError(f"cannot match {len(dummy)} gradient tensors against {len(observed)}")
    total = torch.zeros((), dtype=dummy[0].dtype, device=dummy[0].device) if dummy else torch.zeros(())
    for d, o in zip(dummy, observed, strict=True):
        total = total + ((d - o) ** 2).sum()
    return total


def update_to_gradient(
    old_state: Mapping[str, torch.Tensor],
    new_state: Mapping[str, torch.Tensor],
    lr: float,
    steps: int,
    *,
    names: Sequence[str] | None = None,
) -> dict[str, torch.Tensor]:
    """The gradient estimate ``(w_old - w_new) / (lr * steps)`` from weights sent after local training.

    This is the standard approximation for attacking a multi-step update: it is exact for one step of plain
    SGD, and for several steps it is the average gradient along the client's path, which DLG then matches as
    if it came from one step on the whole local data. Momentum and weight decay are ignored. Non-floating
    entries (e.g. BatchNorm's ``num_batches_tracked``) are skipped; ``names`` restricts the keys.
    """
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    keys = list(names) if names is not None else [k for k, v in old_state.items() if v.is_floating_point()]
    missing = [k for k in keys if k not in old_state or k not in new_state]
    if missing:
        raise KeyError(f"keys missing from the old or new state: {missing}")
    grads = {}
    for key in keys:
        old, new = old_state[key], new_state[key]
        if old.shape != new.shape:
            raise ValueError(f"{key}: old shape {tuple(old.shape)} != new shape {tuple(new.shape)}")
        grads[key] = (old.detach() - new.detach()) / (lr * steps)
    return grads


def infer_labels(last_weight_grad: torch.Tensor, batch_size: int = 1) -> torch.Tensor:
    """Labels from the sign of the last layer's weight gradient ``(num_classes, features)`` (iDLG).

    With softmax cross-entropy, row ``c`` of that gradient is ``mean_b (p_bc - y_bc) h_b``. For one sample
    every row is a multiple of the same ``h``, with a negative factor only for the true class, so the true
    class's row is the one pointing against all the others, whatever the sign of ``h``: exact for three
    classes or more. (The paper's "the row that sums below zero" assumes ``h >= 0``, after Sigmoid or
    ReLU; a head whose last layer follows a linear one breaks it, and it then names the most likely wrong
    class.) With two classes the two rows are opposite and the paper's rule decides.

    For ``batch_size = B > 1`` this returns ``B`` distinct classes, the most negative row sums first: the
    labels `idlg_attack` gives its ``B`` dummies. With ``h >= 0`` a negative row sum means the class is in
    the batch, so the negative rows come first; where fewer than ``B`` rows are negative (repeated labels,
    or a class outweighed by the other samples' predictions) the rest are the least positive rows, guesses.
    One label per class: ``B`` may not exceed the classes.
    """
    if last_weight_grad.dim() != 2:
        raise ValueError(f"expected a 2-D weight gradient, got shape {tuple(last_weight_grad.shape)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    row_sums = last_weight_grad.detach().sum(dim=1)
    if batch_size == 1:
        rows = last_weight_grad.detach().to(torch.float64)
        along = rows @ rows[rows.norm(dim=1).argmax()]  # the sign of each row's factor, up to one flip
        alone = [side for side in (along < 0, along > 0) if int(side.sum()) == 1]
        if len(alone) == 1:
            return alone[0].nonzero().reshape(1)
        return row_sums.argmin().reshape(1)
    if batch_size > last_weight_grad.shape[0]:
        raise ValueError(
            f"iDLG reads at most one label per class: a batch of {batch_size} is larger than the "
            f"{last_weight_grad.shape[0]} classes; pass labels="
        )
    return row_sums.argsort()[:batch_size]


def dlg_attack(
    model: nn.Module,
    observed: Gradients,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    iterations: int = 300,
    generator: torch.Generator | None = None,
    mode: Mode = "train",
    lr: float = 1.0,
    max_iter_per_step: int = 20,
) -> AttackResult:
    """DLG: optimise a dummy input and soft label so that their gradient matches ``observed``.

    ``input_shape`` is the full batch shape ``(B, ...)``. ``iterations`` counts L-BFGS steps, each running up
    to ``max_iter_per_step`` inner iterations with a strong-Wolfe line search (the DLG reference code runs
    300 steps of torch's default 20 iterations, without line search); the loop stops early once L-BFGS no
    longer moves. ``mode`` puts the model in train mode (BatchNorm on batch statistics, as the client
    computed the gradient; dropout then draws fresh masks) or eval mode; the model's mode and buffers are
    restored afterwards. The dummies start from ``randn`` drawn with ``generator``.
    """
    batch = _batch_size(input_shape)
    like = _align(model, observed)[1][0]
    dummy_x = _dummy(input_shape, generator, like)
    dummy_y = _dummy((batch, num_classes), generator, like)

    def loss_fn(out: torch.Tensor) -> torch.Tensor:
        _check_outputs(out, num_classes)
        return -(F.softmax(dummy_y, dim=-1) * F.log_softmax(out, dim=-1)).sum(dim=-1).mean()

    best_x, history, diverged = _run_lbfgs(
        model, observed, [dummy_x, dummy_y], loss_fn, iterations, mode, lr, max_iter_per_step
    )
    soft = F.softmax(best_x[1], dim=-1)
    return AttackResult("dlg", best_x[0], soft.argmax(dim=-1), soft, history, diverged)


def idlg_attack(
    model: nn.Module,
    observed: Gradients,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    iterations: int = 300,
    generator: torch.Generator | None = None,
    mode: Mode = "train",
    lr: float = 1.0,
    max_iter_per_step: int = 20,
    labels: torch.Tensor | None = None,
    last_weight: str | None = None,
) -> AttackResult:
    """iDLG: read the label off the last layer's gradient, then optimise only the input.

    The last layer is the ``nn.Linear`` whose output is the model's output (found by running the model once
    on a zero input in eval mode), or the parameter named ``last_weight``. A reply without that layer's
    gradient raises `NoLastLayerError`. Where no ``nn.Linear`` gives the output (a functional head), the
    one observed 2-D gradient with ``num_classes`` rows is used, and several are refused by name. For
    ``B > 1`` the ``B`` classes with the most negative row sums are used (`infer_labels`; ``B`` may not
    exceed the classes); pass ``labels`` to skip inference. Other arguments as in `dlg_attack`.
    """
    batch = _batch_size(input_shape)
    if labels is None:
        labels = _labels_from_gradient(model, observed, num_classes, input_shape, last_weight)
    elif labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integer class indices, got {labels.dtype}")
    like = _align(model, observed)[1][0]
    labels = labels.reshape(-1).long().to(like.device)
    if labels.numel() != batch:
        raise ValueError(f"got {labels.numel()} labels for a batch of {batch}")
    if bool(((labels < 0) | (labels >= num_classes)).any()):
        raise ValueError(f"labels must be class indices in [0, {num_classes}), got {labels.tolist()}")
    dummy_x = _dummy(input_shape, generator, like)

    def loss_fn(out: torch.Tensor) -> torch.Tensor:
        _check_outputs(out, num_classes)
        return F.cross_entropy(out, labels)

    best_x, history, diverged = _run_lbfgs(
        model, observed, [dummy_x], loss_fn, iterations, mode, lr, max_iter_per_step
    )
    return AttackResult("idlg", best_x[0], labels.clone(), None, history, diverged)


def _batch_size(input_shape: Sequence[int]) -> int:
    if len(input_shape) < 2 or any(int(s) < 1 for s in input_shape):
        raise ValueError(f"input_shape must be (B, ...) with positive sizes, got {tuple(input_shape)}")
    return int(input_shape[0])


def _check_outputs(out: torch.Tensor, num_classes: int) -> None:
    if out.dim() != 2 or out.shape[1] != num_classes:
        raise ValueError(
            f"the model gives {out.shape[-1]} outputs per input, but num_classes is {num_classes} "
            f"(outputs of shape {tuple(out.shape)})"
        )


def _dummy(shape: Sequence[int], generator: torch.Generator | None, like: torch.Tensor) -> torch.Tensor:
    """A standard-normal leaf drawn on the CPU (so one generator serves any device), then moved."""
    values = torch.randn(tuple(int(s) for s in shape), generator=generator)
    return values.to(like.device, like.dtype).requires_grad_(True)


def _align(model: nn.Module, observed: Gradients) -> tuple[list[str], list[nn.Parameter], list[torch.Tensor]]:
    """The (name, parameter, observed gradient) triples to match, checked for count and shape."""
    named = list(model.named_parameters())
    if isinstance(observed, Mapping):
        params = dict(named)
        buffers = {name for name, _ in model.named_buffers()}
        unknown = [k for k in observed if k not in params and k not in buffers]
        if unknown:
            raise KeyError(f"observed gradients name no parameter of the model: {unknown}")
        # Buffers (BatchNorm statistics, e.g. from `update_to_gradient` on a state dict) have no gradient.
        chosen = [(name, p) for name, p in named if name in observed]
        grads = [observed[name] for name, _ in chosen]
    else:
        if len(observed) != len(named):
            raise ValueError(f"got {len(observed)} gradient tensors for a model with {len(named)} parameters")
        chosen, grads = named, list(observed)
    if not chosen:
        raise ValueError("no observed gradient matches a model parameter")
    for (name, p), g in zip(chosen, grads, strict=True):
        if tuple(g.shape) != tuple(p.shape):
            raise ValueError(
                f"{name}: observed gradient shape {tuple(g.shape)} != parameter {tuple(p.shape)}"
            )
    params_out = [p for _, p in chosen]
    target = [g.detach().to(p.device, p.dtype) for p, g in zip(params_out, grads, strict=True)]
    return [name for name, _ in chosen], params_out, target


def _labels_from_gradient(
    model: nn.Module,
    observed: Gradients,
    num_classes: int,
    input_shape: Sequence[int],
    last_weight: str | None,
) -> torch.Tensor:
    names, params, grads = _align(model, observed)
    if last_weight is not None and last_weight not in names:
        raise KeyError(f"last_weight {last_weight!r} is not among the observed gradients")
    if last_weight is None:
        last_weight = _output_layer_weight(model, input_shape, params[0])
    if last_weight is None:
        candidates = [
            n for n, p in zip(names, params, strict=True) if p.dim() == 2 and p.shape[0] == num_classes
        ]
        if not candidates:
            raise NoLastLayerError(
                f"no last layer: no observed 2-D gradient has {num_classes} rows to read labels from; "
                "pass labels= or last_weight="
            )
        if len(candidates) > 1:
            raise ValueError(
                "cannot tell the last layer: no nn.Linear gives the model's output, and the observed "
                f"gradients of {', '.join(repr(n) for n in candidates)} all have {num_classes} rows; "
                "pass last_weight= or labels="
            )
        last_weight = candidates[0]
    elif last_weight not in names:
        raise NoLastLayerError(
            f"no last layer: the observed gradients hold none of the model's output layer {last_weight!r} "
            "to read labels from; pass labels="
        )
    return infer_labels(grads[names.index(last_weight)], _batch_size(input_shape))


def _output_layer_weight(model: nn.Module, input_shape: Sequence[int], like: torch.Tensor) -> str | None:
    """The parameter name of the weight of the ``nn.Linear`` whose output is the model's output, or None
    when no ``nn.Linear`` gives it. The model runs once on one zero input, in eval mode (its mode restored;
    eval leaves BatchNorm's statistics alone)."""
    outputs: list[tuple[nn.Linear, torch.Tensor]] = []

    def hook(module: nn.Module, _inputs: object, out: torch.Tensor) -> None:
        outputs.append((module, out))  # type: ignore[arg-type]

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Linear)]
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros((1, *input_shape[1:]), dtype=like.dtype, device=like.device))
    finally:
        for m, training in modes:
            m.training = training
        for handle in handles:
            handle.remove()
    if not isinstance(out, torch.Tensor):
        return None
    # the same storage and size: the layer's output itself, or a view of it (a reshape, an identity)
    last = [m for m, o in outputs if o.data_ptr() == out.data_ptr() and o.numel() == out.numel()]
    if not last:
        return None
    return next((name for name, p in model.named_parameters() if p is last[-1].weight), None)


@contextlib.contextmanager
def _attack_state(model: nn.Module, params: list[nn.Parameter], mode: Mode) -> Iterator[None]:
    """Set the requested mode and make ``params`` differentiable; restore mode, flags and buffers after."""
    if mode not in ("train", "eval"):
        raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
    was_training = model.training
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    flags = [p.requires_grad for p in params]
    model.train(mode == "train")
    for p in params:
        p.requires_grad_(True)
    try:
        yield
    finally:
        model.train(was_training)
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        for p, flag in zip(params, flags, strict=True):
            p.requires_grad_(flag)


def _run_lbfgs(
    model: nn.Module,
    observed: Gradients,
    variables: list[torch.Tensor],
    loss_fn: Callable[[torch.Tensor], torch.Tensor],
    iterations: int,
    mode: Mode,
    lr: float,
    max_iter_per_step: int,
) -> tuple[list[torch.Tensor], list[float], bool]:
    """Minimise the matching distance over ``variables`` (the input first); return best iterate, history,
    divergence. The history holds the distance at the start and after each step."""
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if max_iter_per_step < 2:
        # torch gives the line search max_iter * 5 // 4 evaluations: one is not enough to move.
        raise ValueError(f"max_iter_per_step must be >= 2, got {max_iter_per_step}")
    _, params, target = _align(model, observed)
    dummy_x = variables[0]
    optimizer = torch.optim.LBFGS(
        variables, lr=lr, max_iter=max_iter_per_step, history_size=100, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        dummy_grads = torch.autograd.grad(loss_fn(model(dummy_x)), params, create_graph=True)
        distance = match_distance(dummy_grads, target)
        # Gradients for the dummies only: `backward()` would also accumulate into the model's `.grad`.
        for v, g in zip(variables, torch.autograd.grad(distance, variables), strict=True):
            v.grad = g
        return distance.detach()

    best: list[torch.Tensor] = [v.detach().clone() for v in variables]
    history: list[float] = []
    with _attack_state(model, params, mode):
        for _ in range(iterations):
            before = [v.detach().clone() for v in variables]
            # LBFGS returns the closure's first value: the distance of `before`.
            distance = float(optimizer.step(closure))
            if not math.isfinite(distance):
                break
            if distance < min(history, default=math.inf):
                best = before
            history.append(distance)
            if all(torch.equal(b, v) for b, v in zip(before, variables, strict=True)):
                break  # L-BFGS met its tolerances and no longer moves
        else:
            distance = _distance(model, params, target, dummy_x, loss_fn)
            if math.isfinite(distance) and distance < min(history, default=math.inf):
                best = [v.detach().clone() for v in variables]
            history.append(distance)
    if not history:
        raise FloatingPointError("the gradient-matching distance is not finite at the start of the attack")
    diverged = not math.isfinite(distance)
    return best, [h for h in history if math.isfinite(h)], diverged


def _distance(
    model: nn.Module,
    params: list[nn.Parameter],
    target: list[torch.Tensor],
    dummy_x: torch.Tensor,
    loss_fn: Callable[[torch.Tensor], torch.Tensor],
) -> float:
    grads = torch.autograd.grad(loss_fn(model(dummy_x)), params)
    return float(match_distance(grads, target).item())
