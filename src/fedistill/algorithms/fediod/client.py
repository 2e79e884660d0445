"""FedIOD's client: one site. It trains its teacher T_k once, then answers the server's queries
with its frozen T_k and its patch discriminator D_k; it never sends a parameter.

Differential privacy (``dp_enabled = true``; the paper's "Privacy Analysis" appendix, Table 5)
------------------------------------------------------------------------------------------
*What is sanitised.* The paper "adopt[s] the DP analysis in DP-CGAN and GS-WGAN to measure the
privacy cost of the gradients used to train the generator. By clipping and adding Gaussian noise to
these gradients, it satisfies (eps, delta)-DP". The gradients used to train G that leave client k are
its `query.backprop` reply: for every synthetic sample x_i, the gradient with respect to x_i of
``c_gan L_gan^k(D_k(x)) + c_conf H(T_k(x)) + <dL_server/dz_k, T_k(x)>``, that is GS-WGAN's upstream
gradient (what D_k sends back towards G) plus the two terms that flow through T_k. That whole
per-sample input-gradient is sanitised at the client, after its backward pass and before the reply is
built: scaled to L2 norm <= ``dp_clip_norm``, then N(0, (dp_noise_multiplier * dp_clip_norm)^2) added
to every coordinate (`sanitize_per_sample`). Clipping only the D_k term and adding the T_k terms
unclipped would leave the released tensor unbounded, so the sum is clipped. D_k's parameter gradient
is not sanitised (that would be DP-CGAN's DP-SGD on D): D_k never leaves the client, the paper
sanitises the generator's gradients, and D_k's BatchNorm mixes the samples of a batch, so per-sample
clipping of its parameter gradients would bound nothing. The norm bound applies to the returned
tensor, the gradient of batch-mean losses (about 1/B of a per-sample loss gradient): choose
``dp_clip_norm`` on that scale.

*Accounting* (``dp_accounting``), per client, on its own `ClientAccountant`:

* ``"d-step"`` (default): DP-CGAN's accounting, which the paper cites: the D-step's use of real data as
  a subsampled Gaussian mechanism at sample rate ``q_k = B / n_k`` (real batch over data size) with the
  applied noise multiplier, one step per G-step. Here the D-step is not noised, D_k carries its state, T_k
  is trained without DP and the real batch is a fixed-size draw from a stream the server can derive: the
  figure measures the cost as the paper reports it and is no differential-privacy bound on what is sent.
* ``"release"``: the worst case for the gradient channel (GS-WGAN's bound without discriminator
  subsampling). Each `query.backprop` releases B clipped per-sample gradients; removing one real record
  may change D_k and so every one of them, each by up to 2C: an L2 sensitivity of ``2 C sqrt(B)``,
  accounted as a Gaussian mechanism with noise multiplier ``sigma / (2 sqrt(B))`` at sample rate 1.

Neither covers T_k's logits (`query.generate`, `query.student`; the paper applies PATE to local
outputs, `fedistill.privacy.pate`), Eq. 8's density ratios, the G-loss and entropy in `query.generate`'s
metrics, stage 1 (teacher training, label and sample counts), a per-pixel site's training label masks
(`query.masks` under ``mask_source = "clients"``) or the validation accuracies used for selection. With
DP on, clients leave their real-batch D-loss out of their metrics.

*Noise.* Drawn from the client's secret seed (`dp_noise_seed = "secret"`, the default: the server cannot
regenerate it) or from the run seed (`"run"`: reproducible, and removable by the server); see
`fedistill.privacy.budget.ClientBudget`.

*Budget.* ``dp_target_epsilon`` with no noise multiplier calibrates the noise once per client
(`calibrate_noise`) for the planned G-steps, which the server sends (under ``"release"``, for the
largest release a step can make). A client whose next step would exceed the target refuses it
(`PrivacyBudgetExceeded`); the server then ends the run cleanly: the partial epoch evaluated, the best
student kept, the summary written with every client's epsilon (``epsilon_client_<k>``, ``epsilon_max``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from fedistill import devices
from fedistill.algorithms.base import ClientContext, clone_state
from fedistill.algorithms.fediod import losses as L
from fedistill.algorithms.fediod.generate_request import (
    condition_masks,
    generate_reply,
    input_spec,
    read_generate,
)
from fedistill.algorithms.fediod.options import (
    network_widths,
    resolve_for_task,
    set_lr,
    teacher_name,
)
from fedistill.algorithms.fediod.site_discriminator import SiteDiscriminator
from fedistill.algorithms.fediod.sites_together import (
    TogetherPending,
    backprop_together,
    generate_together,
    together_key,
)
from fedistill.algorithms.fediod.task_view import TaskView
from fedistill.algorithms.fediod.wire import evaluation_encodings, wire_encodings
from fedistill.algorithms.shared.bn_matching import batchnorm_statistics_loss
from fedistill.algorithms.shared.decision_threshold import ThresholdCounts
from fedistill.algorithms.shared.mask_upload import site_masks
from fedistill.algorithms.shared.stage1 import train_teacher
from fedistill.algorithms.shared.training import evaluate_model, new_model, task_of
from fedistill.data.transforms import to_float
from fedistill.errors import FederationError
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.messages import ArraySpec, Message, expect_arrays, state_specs
from fedistill.models.discriminator import build_discriminator
from fedistill.models.perceptual import PerceptualLoss, encoder_features
from fedistill.models.pix2pix import build_conditional_discriminator
from fedistill.privacy.accounting import PrivacyBudgetExceeded
from fedistill.privacy.budget import (
    ClientBudget,
    refusal,
)
from fedistill.privacy.sanitize import sanitize_per_sample
from fedistill.seeding import torch_generator

log = logging.getLogger(__name__)


class FedIODClient(ClientLogic, ThresholdCounts):
    """One site: trains T_k once, then answers the server's queries with its frozen T_k and D_k."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        view = TaskView(task_of(ctx.config, ctx.info), ctx.info, ctx.config.seed)
        self.options, self.view = resolve_for_task(ctx.config, ctx.options, view)
        self.architecture = teacher_name(self.options, ctx.config, ctx.client_id)
        self.teacher = new_model(ctx.config, ctx.info, self.architecture)
        # D_k and its Adam are built when the site is first asked (site_discriminator.py)
        options = self.options
        self.site_d = SiteDiscriminator(
            ctx.config.seed, self._build_discriminator, options.lr_discriminator, options.channels_last
        )
        self.uploaded = torch.zeros(0, dtype=torch.int64)  # training indices of the masks sent (query.masks)
        self.features: nn.Module | None = None  # T_k's frozen encoder, for the perceptual term
        self.real_mean = 0.5  # running E_{x' in X'_k}[D_k(x')], refreshed at every D-step
        # (x, T_k(x), local loss) of this G-step, or its row of the graph of sites that answered together
        self.pending: tuple[torch.Tensor, ...] | TogetherPending | None = None
        self.pending_inputs: dict[str, Any] = {}  # what rebuilds `pending` in another process
        self.student_specs: dict[str, ArraySpec] | None = None  # what evaluate.student must carry
        self.budget = (
            ClientBudget(self.options.dp, ctx.client_id, ctx.config.seed) if self.options.dp_enabled else None
        )
        self.wire = wire_encodings(self.options.wire)  # stage 2's replies: the encoding of each kind
        self.evaluation_wire = evaluation_encodings(self.options.wire)  # the teachers' test outputs

    @property
    def discriminator(self) -> nn.Module:
        """D_k (built on first use)."""
        return self.site_d.module

    @property
    def d_optimizer(self) -> torch.optim.Optimizer:
        """D_k's Adam (built with D_k)."""
        return self.site_d.optimizer

    def _freeze_teacher(self) -> None:
        """T_k after stage 1: eval mode, no parameter gradients, and stage 2's memory layout."""
        self.teacher.eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        if self.options.channels_last:
            self.teacher.to(memory_format=torch.channels_last)

    def _build_discriminator(self) -> nn.Module:
        options, info = self.options, self.ctx.info
        width = network_widths(options, info.image_size)[1]
        if self.view.conditional:
            return build_conditional_discriminator(
                info,
                self.view.condition_classes,
                width=width,
                layers=options.discriminator_layers,
            )
        return build_discriminator(info, width=width)

    def _judge(self, x: torch.Tensor, masks: torch.Tensor | None) -> torch.Tensor:
        """D_k's patch logits of images (with their masks for a conditional D_k)."""
        if masks is None:
            return self.discriminator(x)
        return self.discriminator(self.view.one_hot(masks), x)

    # --- stage 1 -------------------------------------------------------------------------------
    @handles("train")
    def train(self, message: Message) -> Message:
        """Stage 1: train this site's teacher on its private data, freeze it, and report its validation
        score."""
        architecture = teacher_name(self.options, self.ctx.config, self.ctx.client_id)
        metrics = train_teacher(self.teacher, self.ctx, architecture, self.options.teacher_epochs)
        self._freeze_teacher()
        metrics["num_samples"] = len(self.ctx.train)
        headline = self.view.task.headline
        val = evaluate_model(self.teacher, self.ctx.val, self.ctx.info, task=self.view.task)
        metrics[f"teacher_val_{headline}"] = val[headline] if val["count"] else -1.0
        arrays = {}
        if message.scalar("config", "send_label_counts", False):
            arrays["label-statistics"] = {"class_counts": self.view.label_counts(self.ctx.train)}
        return Message.build("train", arrays=arrays, scalars={"metrics": metrics})

    @handles("query.masks")
    def masks(self, message: Message) -> Message:
        """The label masks G is conditioned on (per-pixel tasks, `mask_source = "clients"`): those of this
        site's training samples in a seeded order, at most `limit` of them (0: all). The site keeps the
        order, so a synthetic image can later be paired with the real image of its mask."""
        limit = int(message.scalar("config", "limit", 0))
        self.uploaded, masks = site_masks(self.ctx, limit, self.view.condition_of)
        return Message.build("query.masks", arrays={"label-masks": {"masks": masks}}, encodings=self.wire)

    # --- stage 2: one G-step ---------------------------------------------------------------------
    def _real_batch(self, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A batch of this site's images for D_k, with their masks when D_k is conditional."""
        generator = torch_generator(self.ctx.config.seed, "real-batch", self.ctx.client_id, step)
        n = len(self.ctx.train)
        index = torch.randperm(n, generator=generator)[: min(size, n)]
        masks = self.view.condition_of(self.ctx.train.y[index]) if self.view.conditional else None
        real = devices.on_device(to_float(self.ctx.train.x[index], self.ctx.info))
        return real, None if masks is None else devices.on_device(masks)

    def _density_ratio(self, x: torch.Tensor, masks: torch.Tensor | None) -> torch.Tensor:
        """Eq. 8's D_k(x) / E[D_k(x')] for S-step inputs (per pixel on per-pixel tasks). D_k's BatchNorm runs
        on batch statistics; its running statistics are scored on copies, so answering leaves the client
        state as it was."""
        buffers = {name: b.clone() for name, b in self.discriminator.named_buffers()}
        args = (x,) if masks is None else (self.view.one_hot(masks), x)
        with torch.no_grad():
            scores = functional_call(
                self.discriminator, (dict(self.discriminator.named_parameters()), buffers), args
            )
        return self.view.pixel_ratio(scores, self.real_mean)

    @handles("query.generate")
    def generate(self, message: Message) -> Message:
        """One generator step at this site: a D-step of its discriminator on the synthetic batch and its
        own data, then the teacher's outputs on the batch (with Eq. 8's density ratios when the server asks
        for them: `want_ratio`); with DP the step is accounted first."""
        request = read_generate(message, self.view, self.ctx.info)
        x, masks, own = request.x, request.masks, request.own
        dp_metrics: dict[str, float] = {}
        if self.budget is not None:  # the step's privacy first: a refused step touches no data
            try:
                dp_metrics = self._spend(
                    request.real_batch, x.shape[0], int(message.scalar("config", "total_steps"))
                )
            except PrivacyBudgetExceeded as exc:
                return refusal("query.generate", exc, self.budget.epsilon())
        # the previous step's S-step targets first: with D_k as it was before this step's D-step
        student = {}
        if request.student_x is not None:
            student = self._student_answer(
                request.student_x, request.student_masks, request.want_ratio, request.student_index
            )
        # (1) D-step on (x, a batch of this site's data); a conditional D_k judges (mask, image) pairs
        set_lr(self.d_optimizer, request.lr_discriminator)
        real, real_masks = self._real_batch(request.step, request.real_batch)
        real_logits = self._judge(real, real_masks)
        d_loss = None
        if own is None or bool(own.any()):  # a site G drew nothing for this step has nothing to judge
            mine = slice(None) if own is None else own
            d_loss = L.discriminator_loss(
                real_logits, self._judge(x[mine], None if masks is None else masks[mine])
            )
            self.d_optimizer.zero_grad(set_to_none=True)
            d_loss.backward()
            self.d_optimizer.step()
        # E_{x' in X'_k}[D_k(x')] of Eq. 8, from this step's real batch (scored before the update)
        self.real_mean = float(L.patch_scores(real_logits.detach()).mean())
        # (2) the terms this site computes alone, and their gradient with respect to x
        self.pending_inputs = request.pending
        x, logits, fake_logits, local, gan, conf = self._local_terms(self.pending_inputs)
        # keep the graph (or only its inputs: `recompute_graphs`): query.backprop differentiates the local
        # terms and the server's terms together
        self.pending = None if self.options.recompute_graphs else (x, logits, local)
        ratio = self.view.pixel_ratio(fake_logits.detach(), self.real_mean) if request.want_ratio else None
        # with DP on, the loss on the real batch stays here (it is not sanitised)
        metrics = {"gan_loss": gan.item(), "entropy": conf.item()} if d_loss is not None else {}
        if self.budget is not None:
            metrics |= dp_metrics
        elif d_loss is not None:
            metrics["d_loss"] = d_loss.item()
        return generate_reply(logits, ratio, student, metrics, self.wire)

    def _spend(self, real_batch: int, released: int, planned_steps: int) -> dict[str, float]:
        """Record this G-step on the accountant (refusing it past the target): the D-step samples
        `real_batch` private samples, and `released` per-sample input-gradients leave; see the module
        docstring."""
        assert self.budget is not None
        n = len(self.ctx.train)
        if self.options.dp_accounting == "d-step":
            rate, scale, widest = min(real_batch, n) / n, 1.0, 1.0
        else:  # release: B per-sample gradients, each may move by 2C: L2 sensitivity 2C sqrt(B)
            rate, scale = 1.0, 2.0 * math.sqrt(released)
            # a noise calibrated once must cover the largest release of any step: a site asked about its
            # own rows only (`owner_queries`) releases fewer than the batch's `real_batch` on some steps
            widest = 2.0 * math.sqrt(max(released, real_batch))
        noise = self.budget.noise_multiplier(rate, planned_steps, widest)
        epsilon = self.budget.spend(noise / scale, rate)
        return {"epsilon": epsilon, "noise_multiplier": noise}

    def _local_terms(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, ...]:
        """pi_k L_gan^k + pi_k H(T_k(x)) (+ pi_k w_bn L_bn(T_k, x), + pi_k w_perc L_perc) on the current
        D_k, with the graph back to x, and T_k's logits as the site sends them (`TaskView.sent_logits`).
        On per-pixel tasks H is the mean per-pixel entropy."""
        x = inputs["x"].clone().requires_grad_(True)
        c_bn = float(inputs.get("c_bn", 0.0))
        own, masks = inputs.get("own"), inputs.get("masks")  # a site's terms see its own samples only
        owns_none = own is not None and not bool(own.any())  # then it only labels: its terms are 0
        mine = slice(None) if own is None else own
        matching = self.teacher if c_bn and not owns_none else nn.Identity()
        with batchnorm_statistics_loss(matching, own) as bn_terms:
            logits = self.teacher(self.view.model_input(x, int(inputs.get("index", 0))))
        fake_logits = self._judge(x, masks)
        if owns_none:
            gan = conf = x.new_zeros(())
        else:
            gan = L.generator_gan_loss(fake_logits[mine], mode=str(inputs["gan_loss"]))
            conf = L.entropy(self.view.rows(logits[mine]), float(inputs["tau"])).mean()
        local = float(inputs["c_gan"]) * gan + float(inputs["c_conf"]) * conf
        if bn_terms:
            local = local + c_bn * torch.stack(bn_terms).sum()
        c_perceptual = float(inputs.get("c_perceptual", 0.0))
        if c_perceptual and "pair" in inputs:
            local = local + c_perceptual * self._perceptual(x, inputs["pair"])
        return x, self.view.sent_logits(logits), fake_logits, local, gan, conf

    def _perceptual(self, x: torch.Tensor, pair: torch.Tensor) -> torch.Tensor:
        """Johnson et al.'s perceptual loss between each own synthetic image and the real image of the mask
        it was drawn from, on features of this site's own T_k encoder (nothing new leaves the site)."""
        paired = pair >= 0
        if not bool(paired.any()):
            return torch.zeros(())
        if self.features is None:
            self.features = encoder_features(self.teacher)
        index = self.uploaded[pair[paired].cpu()]
        real = devices.on_device(to_float(self.ctx.train.x[index], self.ctx.info))
        return PerceptualLoss(self.features)(x[paired], real)

    @handles("query.backprop")
    def backprop(self, message: Message) -> Message:
        """The gradient of this site's terms with respect to the synthetic inputs, given the server's
        gradient on its teacher's outputs; with DP clipped and noised per sample."""
        if self.pending is None and self.pending_inputs:
            # this process did not answer query.generate (a Flower deployment starts one process per
            # message), or dropped its graph (`recompute_graphs`): rebuild it from the saved inputs and D_k
            x, logits, _, local, _, _ = self._local_terms(self.pending_inputs)
            self.pending = (x, logits, local)
        if self.pending is None:
            raise FederationError("query.backprop arrived before query.generate")
        if isinstance(self.pending, TogetherPending):  # answered query.generate together with other sites
            logits = self.pending.logits
            expect_arrays(message, "output-gradients", {"z": ArraySpec("float32", tuple(logits.shape))})
            grad = self.pending.gradient(message.tensor("output-gradients", "z"))
        else:
            x, logits, local = self.pending
            expect_arrays(message, "output-gradients", {"z": ArraySpec("float32", tuple(logits.shape))})
            # d/dx [local terms + <dL_server/dz_k, T_k(x)>]: one backward pass through T_k and D_k
            linearised = local + (logits * message.tensor("output-gradients", "z")).sum()
            (grad,) = torch.autograd.grad(linearised, x)
        if self.budget is not None:  # the sanitisation point: every per-sample gradient that leaves
            assert self.budget.noise is not None
            noise = self.budget.noise_generator("dp-input-gradients", self.pending_inputs["step"])
            grad = sanitize_per_sample(grad, self.options.dp_clip_norm, self.budget.noise, noise)
        self.pending, self.pending_inputs = None, {}
        return Message.build("query.backprop", arrays={"input-gradients": {"x": grad}}, encodings=self.wire)

    # --- stage 2: the S-steps ---------------------------------------------------------------------
    @handles("query.student", read_only=True)
    def student_targets(self, message: Message) -> Message:
        """Stage 2: the teacher's targets for the student on a synthetic batch."""
        expect_arrays(message, "synthetic-inputs", {"x": input_spec(self.ctx.info)})
        x = message.tensor("synthetic-inputs", "x")
        answer = self._student_answer(
            x,
            condition_masks(message, "m", len(x), self.view, self.ctx.info),
            bool(message.scalar("config", "want_ratio", False)),
            int(message.scalar("config", "index", 0)),
        )
        return Message.build("query.student", arrays=answer, encodings=self.wire)

    def _student_answer(
        self, x: torch.Tensor, masks: torch.Tensor | None, want_ratio: bool, index: int
    ) -> dict[str, dict[str, torch.Tensor]]:
        with torch.no_grad():
            logits = self.view.sent_logits(self.teacher(self.view.model_input(x, index)))
        arrays: dict[str, dict[str, torch.Tensor]] = {"logits": {"z": logits}}
        if want_ratio:
            arrays["discriminator-outputs"] = {"ratio": self._density_ratio(x, masks)}
        return arrays

    # --- evaluation ------------------------------------------------------------------------------
    @handles("evaluate.student", read_only=True)
    def evaluate_student(self, message: Message) -> Message:
        """Score the received student on this site's validation split."""
        # the student is built for the evaluation and dropped after it: an idle site holds no copy of S
        student = new_model(self.ctx.config, self.ctx.info, self.options.student or self.ctx.config.model)
        if self.student_specs is None:
            self.student_specs = state_specs(student.state_dict())
        expect_arrays(message, "parameters", self.student_specs)
        student.load_state_dict(message.tensors("parameters"))
        headline = self.view.task.headline
        val = evaluate_model(student, self.ctx.val, self.ctx.info, task=self.view.task)
        return Message.build(
            "evaluate.student",
            scalars={
                "metrics": {
                    f"val_{headline}": val[headline] if val["count"] else 0.0,
                    "val_count": val["count"],
                }
            },
        )

    @handles("evaluate.teachers", read_only=True)
    def evaluate_teacher(self, message: Message) -> Message:
        """Evaluation only (not part of the protocol): the teacher's logits on the shared test set,
        so the report can state the standalone accuracies and the ensemble's one-shot ceiling."""
        if not self.view.per_pixel:  # the first `samples` test images (all unless the server limits them)
            count = int(message.scalar("config", "samples", len(self.ctx.global_test)))
            x = devices.on_device(to_float(self.ctx.global_test.x[:count], self.ctx.info))
            with torch.no_grad():
                logits = torch.cat([self.teacher(chunk) for chunk in x.split(512)])
            return Message.build(
                "evaluate.teachers", arrays={"logits": {"z": logits}}, encodings=self.evaluation_wire
            )
        samples = int(message.scalar("config", "samples", len(self.ctx.global_test)))
        test = self.ctx.global_test.subset(torch.arange(samples))
        outputs = self.view.task.outputs(self.teacher, test, self.ctx.info)
        return Message.build(
            "evaluate.teachers", arrays={"logits": {"z": outputs}}, encodings=self.evaluation_wire
        )

    # --- answering together with the other sites of this process (sites_together.py) -------------------
    def together_key(self, message: Message) -> Hashable | None:
        return together_key(self, message)

    @classmethod
    def handle_together(cls, clients: Sequence[ClientLogic], messages: Sequence[Message]) -> list[Message]:
        sites = [client for client in clients if isinstance(client, FedIODClient)]
        if messages and messages[0].type == "query.backprop":
            return backprop_together(sites, messages)
        return generate_together(sites, messages)

    def state_dict(self) -> dict:
        return {
            "teacher": clone_state(self.teacher),
            **dict(zip(("discriminator", "d_optimizer"), self.site_d.state_dict(), strict=True)),
            "real_mean": self.real_mean,
            "pending": dict(self.pending_inputs),  # between query.generate and query.backprop
            "uploaded": self.uploaded,
            **({"dp": self.budget.state_dict()} if self.budget is not None else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        self.teacher.load_state_dict(state["teacher"])
        self._freeze_teacher()
        self.site_d.load_state_dict(state["discriminator"], state["d_optimizer"])
        self.real_mean = float(state["real_mean"])
        self.pending, self.pending_inputs = None, dict(state.get("pending") or {})
        self.uploaded = state.get("uploaded", torch.zeros(0, dtype=torch.int64))
        if self.budget is not None and "dp" in state:
            self.budget.load_state_dict(state["dp"])
