"""Sites answering a G-step together (`fediod.sites_together`): the same-architecture sites of one process
compute their `query.generate` and `query.backprop` answers in one batched call, `torch.func.vmap` over
their stacked teachers and discriminators, instead of one after another.

Why: K sites' teachers and discriminators evaluated one after another on small batches are K small
kernels per layer; stacked, they are one kernel per layer. Nothing about the protocol changes: each site
still gets its own request, answers with its own message (checked and written to the ledger as its own),
keeps its own D_k, Adam state, real batch and pending graph; the numbers equal answering alone up to float
rounding (a batched kernel sums in another order), which tests/test_fediod_sites_together.py bounds.

Batched: classification without DP, the per-client mixture or `recompute_graphs` (`together_key` says
None otherwise, and those sites answer alone, as on Flower).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from fedistill.algorithms.fediod import losses as L
from fedistill.algorithms.fediod.generate_request import GenerateRequest, generate_reply, read_generate
from fedistill.algorithms.fediod.options import set_lr
from fedistill.algorithms.shared.bn_matching import batchnorm_statistics_loss
from fedistill.errors import FederationError
from fedistill.federation.messages import ArraySpec, Message, expect_arrays

if TYPE_CHECKING:
    from fedistill.algorithms.fediod.client import FedIODClient

Tensors = dict[str, torch.Tensor]


@dataclass
class SharedGraph:
    """The G-step terms of sites that answered together: `x` (sites, B, ...), each site's own leaf row,
    their teachers' `logits` and their `local` terms (one per site), with the graph back to `x`."""

    x: torch.Tensor
    logits: torch.Tensor
    local: torch.Tensor

    def gradients(
        self, rows: Sequence[int], output_grads: Sequence[torch.Tensor], keep: bool
    ) -> torch.Tensor:
        """d/dx_k [local_k + <g_k, T_k(x_k)>] for the sites at `rows`, as (len(rows), B, ...)."""
        index = torch.as_tensor(list(rows))
        linearised = self.local[index].sum() + (self.logits[index] * torch.stack(list(output_grads))).sum()
        (grad,) = torch.autograd.grad(linearised, self.x, retain_graph=keep)
        return grad[index]


@dataclass
class TogetherPending:
    """What a site that answered together holds until `query.backprop`: the shared graph and its row."""

    graph: SharedGraph
    row: int

    @property
    def logits(self) -> torch.Tensor:
        return self.graph.logits[self.row]

    def gradient(self, output_grad: torch.Tensor) -> torch.Tensor:
        """This site's input-gradient alone (the other sites' rows may still be asked for)."""
        return self.graph.gradients([self.row], [output_grad], keep=True)[0]


def together_key(client: FedIODClient, message: Message) -> Hashable | None:
    """Requests with equal keys may be answered together: same message type, same teacher architecture,
    same shapes and real-batch size, same loss settings. None: this site answers alone."""
    options, view = client.options, client.view
    if (
        not options.sites_together
        or client.budget is not None
        or view.per_pixel
        or view.conditional
        or options.recompute_graphs
    ):
        return None
    if message.type == "query.backprop":
        pending = client.pending
        return ("query.backprop", id(pending.graph)) if isinstance(pending, TogetherPending) else None
    if message.type != "query.generate":
        return None
    inputs = message.arrays.get("synthetic-inputs", {})
    if "x" not in inputs or "own" in inputs:
        return None
    config = message.scalars.get("config", {})
    if float(config.get("c_perceptual", 0.0)):
        return None
    carried = inputs.get("student_x")
    batch = int(inputs["x"].shape[0])
    settings = tuple(config.get(key) for key in ("gan_loss", "tau", "want_ratio", "index", "student_index"))
    return (
        "query.generate",
        client.architecture,
        tuple(inputs["x"].shape),
        None if carried is None else tuple(carried.shape),
        min(batch, len(client.ctx.train)),  # the real batch D_k is stepped on
        float(config.get("c_bn", 0.0)) > 0,
        settings,
    )


def stacked(modules: Sequence[nn.Module], *, grad: bool) -> tuple[Tensors, Tensors]:
    """The modules' parameters and buffers stacked along a new first dimension (copies), in the default
    memory layout: stage 2 keeps single modules channels-last, and CUDA's kernels under `vmap` cannot ask a
    batched tensor whether it is channels-last (PyTorch raises "NYI: querying is_contiguous inside of
    vmap")."""
    params, buffers = stack_module_state(list(modules))
    params = {name: p.detach().contiguous().requires_grad_(grad) for name, p in params.items()}
    return params, {name: b.contiguous() for name, b in buffers.items()}


def _call(module: nn.Module) -> Any:
    """`module` as a function of (parameters, buffers, input) for `vmap`."""
    return lambda params, buffers, x: functional_call(module, (params, buffers), (x,))


def _write_back_buffers(modules: Sequence[nn.Module], buffers: Tensors) -> None:
    """Each module's running statistics from its row of the stacked buffers the batched calls updated."""
    for row, module in enumerate(modules):
        for name, buffer in module.named_buffers():
            buffer.copy_(buffers[name][row])


def generate_together(clients: Sequence[FedIODClient], messages: Sequence[Message]) -> list[Message]:
    """`FedIODClient.generate` for several sites in one batched pass (see the module docstring)."""
    requests = [read_generate(m, c.view, c.ctx.info) for c, m in zip(clients, messages, strict=True)]
    first, view = clients[0], clients[0].view
    teachers = [c.teacher for c in clients]
    discriminators = [c.discriminator for c in clients]
    t_params, t_buffers = stacked(teachers, grad=False)
    teacher = _call(first.teacher)
    judge = _call(first.discriminator)
    # the previous step's S-step targets first: with every D_k as it was before this step's D-step
    students = _student_answers(clients, requests, t_params, t_buffers, discriminators)
    # (1) the D-steps: every site's D_k on its own real batch and on G's batch, each with its own Adam
    d_params, d_buffers = stacked(discriminators, grad=True)
    real = torch.stack(
        [c._real_batch(r.step, r.real_batch)[0] for c, r in zip(clients, requests, strict=True)]
    ).contiguous()
    x = torch.stack([r.x for r in requests]).contiguous()
    real_logits = vmap(judge)(d_params, d_buffers, real)
    d_loss = vmap(L.discriminator_loss)(real_logits, vmap(judge)(d_params, d_buffers, x))
    grads = torch.autograd.grad(d_loss.sum(), list(d_params.values()))
    for row, (client, request) in enumerate(zip(clients, requests, strict=True)):
        set_lr(client.d_optimizer, request.lr_discriminator)
        client.d_optimizer.zero_grad(set_to_none=True)
        for p, g in zip(client.discriminator.parameters(), grads, strict=True):
            p.grad = g[row].clone()
        client.d_optimizer.step()
    real_means = vmap(lambda logits: L.patch_scores(logits).mean())(real_logits.detach()).tolist()
    # (2) the terms each site computes alone, on its updated D_k, with the graph back to its row of x
    d_params = stacked(discriminators, grad=False)[0]
    pending = [r.pending for r in requests]
    coefficient = {
        key: torch.tensor([float(p[key]) for p in pending], device=x.device)
        for key in ("c_gan", "c_conf", "c_bn")
    }
    tau, mode = float(pending[0]["tau"]), str(pending[0]["gan_loss"])
    index = int(pending[0]["index"])
    with_bn = bool(coefficient["c_bn"][0] > 0)
    leaf = x.detach().clone().requires_grad_(True)

    def teacher_terms(
        params: Tensors, buffers: Tensors, xk: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with batchnorm_statistics_loss(first.teacher if with_bn else nn.Identity()) as bn_terms:
            logits = teacher(params, buffers, view.model_input(xk, index))
        return logits, torch.stack(bn_terms).sum() if bn_terms else torch.zeros((), device=xk.device)

    logits, bn = vmap(teacher_terms)(t_params, t_buffers, leaf)
    fake_logits = vmap(judge)(d_params, d_buffers, leaf)
    gan = vmap(lambda f: L.generator_gan_loss(f, mode=mode))(fake_logits)
    conf = vmap(lambda z: L.entropy(view.rows(z), tau).mean())(logits)
    local = coefficient["c_gan"] * gan + coefficient["c_conf"] * conf
    if with_bn:
        local = local + coefficient["c_bn"] * bn
    _write_back_buffers(discriminators, d_buffers)
    graph = SharedGraph(leaf, logits, local)
    answers = []
    metrics = zip(gan.tolist(), conf.tolist(), d_loss.tolist(), strict=True)
    for row, (client, request, (g, c, d)) in enumerate(zip(clients, requests, metrics, strict=True)):
        client.real_mean = float(real_means[row])
        client.pending_inputs = request.pending
        client.pending = TogetherPending(graph, row)
        ratio = None
        if request.want_ratio:
            ratio = view.pixel_ratio(fake_logits[row].detach(), client.real_mean)
        metrics_k = {"gan_loss": g, "entropy": c, "d_loss": d}
        answers.append(generate_reply(logits[row], ratio, students[row], metrics_k, client.wire))
    return answers


def _student_answers(
    clients: Sequence[FedIODClient],
    requests: Sequence[GenerateRequest],
    t_params: Tensors,
    t_buffers: Tensors,
    discriminators: Sequence[nn.Module],
) -> list[dict[str, Tensors]]:
    """Each site's targets for the S-step inputs that rode along (`FedIODClient._student_answer`): its
    teacher's logits and, when asked, Eq. 8's ratios from its D_k on copies of its running statistics."""
    if requests[0].student_x is None:
        return [{} for _ in clients]
    first, view = clients[0], clients[0].view
    x = torch.stack([r.student_x for r in requests]).contiguous()  # type: ignore[misc]
    index = requests[0].student_index
    with torch.no_grad():
        logits = vmap(
            lambda p, b, xk: functional_call(first.teacher, (p, b), (view.model_input(xk, index),))
        )(t_params, t_buffers, x)
        scores = None
        if requests[0].want_ratio:
            d_params, d_buffers = stacked(discriminators, grad=False)
            scores = vmap(_call(first.discriminator))(d_params, d_buffers, x)  # d_buffers are copies
    answers = []
    for row, client in enumerate(clients):
        answer: dict[str, Tensors] = {"logits": {"z": logits[row]}}
        if scores is not None:
            answer["discriminator-outputs"] = {"ratio": view.pixel_ratio(scores[row], client.real_mean)}
        answers.append(answer)
    return answers


def backprop_together(clients: Sequence[FedIODClient], messages: Sequence[Message]) -> list[Message]:
    """`FedIODClient.backprop` for sites that answered `query.generate` together: one backward pass."""
    pendings = [c.pending for c in clients]
    if not all(isinstance(p, TogetherPending) for p in pendings):
        raise FederationError("query.backprop arrived before query.generate")
    graph = pendings[0].graph  # type: ignore[union-attr]
    rows = [p.row for p in pendings]  # type: ignore[union-attr]
    output_grads = []
    for pending, message in zip(pendings, messages, strict=True):
        expect_arrays(message, "output-gradients", {"z": ArraySpec("float32", tuple(pending.logits.shape))})
        output_grads.append(message.tensor("output-gradients", "z"))
    everyone = len(set(rows)) == graph.local.shape[0]
    grads = graph.gradients(rows, output_grads, keep=not everyone)
    answers = []
    for client, grad in zip(clients, grads, strict=True):
        client.pending, client.pending_inputs = None, {}
        answers.append(
            Message.build("query.backprop", arrays={"input-gradients": {"x": grad}}, encodings=client.wire)
        )
    return answers
