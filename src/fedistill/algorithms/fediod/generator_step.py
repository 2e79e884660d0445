"""One generator step of FedIOD's server (Algorithm 1's inner loop): G draws a batch, every client
updates its discriminator and answers with its logits, and with its density ratios when Eq. 8 weighs the
ensemble (`query.generate`), the server sends each client the gradient of its own terms with respect to
those logits (`query.backprop`), sums the input-gradients the clients return with its own, and updates G.
A mixin of `FedIODServer`, kept apart so each file reads alone; the S-steps that ride along are in
student.py.
"""

from __future__ import annotations

import numpy as np
import torch

from fedistill import devices
from fedistill.algorithms.base import StopRun
from fedistill.algorithms.fediod import draws
from fedistill.algorithms.fediod import losses as L
from fedistill.algorithms.fediod.calibration import calibrated
from fedistill.algorithms.fediod.look_trials import LookTrials
from fedistill.algorithms.fediod.options import cosine_lr, set_lr
from fedistill.algorithms.fediod.owner_split import OwnerSplit
from fedistill.algorithms.fediod.robustness import combined_ensemble, screened_gradients, screened_logits
from fedistill.algorithms.fediod.step_sites import shared_batch_request, step_sites
from fedistill.algorithms.fediod.wire import wire_encodings
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import ArraySpec, Message
from fedistill.federation.reply_spec import ReplySpec
from fedistill.metrics.generation import adapted_inception_score, class_coverage
from fedistill.privacy.budget import epsilons_of, refusal_reason
from fedistill.seeding import torch_generator


class GeneratorStep:
    """The G-steps of `FedIODServer` (the attributes they use are set up there)."""

    @property
    def total_steps(self) -> int:
        """The distillation steps of the whole run, which the learning-rate schedules span."""
        return self.iters * self.ctx.config.rounds

    def _lrs(self) -> tuple[float, float, float]:
        o = self.options
        return tuple(
            cosine_lr(b, self.step, self.total_steps, o.schedule)
            for b in (o.lr_generator, o.lr_discriminator, o.lr_student)
        )  # type: ignore[return-value]

    def _draw(
        self,
        batch: int,
        rng: torch.Generator,
        clients: list[int] | None = None,
        shares_rng: torch.Generator | None = None,
    ) -> draws.Draw:
        """What G draws `batch` samples from (see draws.py): samples owned by `clients` (every site by
        default) in shares pi_k renormalised over them, each owner's slots drawn with `shares_rng`."""
        assert self.federation is not None
        every = self.federation.clients
        clients = every if clients is None else clients
        pi = self.federation.pi(clients)
        # G numbers the sites by their position among all of them (its mixture, the uploaded masks)
        numbering = torch.tensor([every.index(cid) for cid in clients], dtype=torch.int64)
        if not self.view.conditional:
            z = self.generator.sample_latent(batch, rng)
            if self.options.generator_mixture != "per-client":
                return draws.Draw(z, None)
            owner = numbering[draws.owners(pi, batch, shares_rng)]
            onehot = torch.nn.functional.one_hot(owner, self.generator.condition_dim).to(z)
            return draws.Draw(torch.cat([z, onehot], 1), owner)
        owner = numbering[draws.owners(pi, batch, shares_rng)]
        if self.mask_pools:
            masks, pair = draws.from_uploads(self.mask_pools, owner, rng)
        else:
            masks = devices.on_device(draws.prior_masks(self.view, batch, rng))
            pair = torch.full((batch,), -1)
        condition = self.view.one_hot(masks)
        if self.options.generator_mixture == "per-client":
            condition = torch.cat([condition, draws.owner_planes(owner, self.ctx.num_clients, condition)], 1)
        return draws.Draw(condition, owner, masks, pair)

    def step_draw(self, step: int, clients: list[int]) -> tuple[draws.Draw, torch.Generator]:
        """G-step `step`'s draw for the asked `clients`, and its latent stream (G's noise comes next)."""
        seed = self.ctx.config.seed
        latent_gen = torch_generator(seed, "latent", step)
        shares_gen = torch_generator(seed, "site-shares", step)
        return self._draw(self.options.synthetic_batch_size, latent_gen, clients, shares_gen), latent_gen

    def _generate(self, draw: draws.Draw, rng: torch.Generator) -> torch.Tensor:
        """G's images for a draw (noise channels of conditional G from `rng`)."""
        if not self.view.conditional:
            return self.generator(draw.latent)
        noise = self.generator.sample_noise(draw.latent, rng) if self.generator.noise_channels else None
        return self.generator(draw.latent, noise)

    def _look_trials(self) -> LookTrials | None:
        """The trials of the sites' colour maps (`look_trials`), made once the epoch's G-steps are known."""
        if self.look_trials is None and self.options.look_trials:
            options = self.options
            self.look_trials = LookTrials(options.look_trials, self.iters, options.look_trial_margin)
        return self.look_trials

    def step_sites(self, step: int) -> list[int]:
        """The sites G-step `step` asks, and that answer the S-step inputs it carries (`sites_per_step`)."""
        assert self.federation is not None
        return step_sites(self.federation.clients, self.options.sites_per_step, self.ctx.config.seed, step)

    def _weights(
        self,
        logits: torch.Tensor,
        ratio: torch.Tensor | None,
        clients: list[int],
        owner: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The teachers' ensemble weights: uniform, the sites' class shares, Eq. 8's shares times the
        sites' density ratios (`ratio`, which the sites send only under Eq. 8: `_want_ratio`), or each
        sample's owner (`owner`: its site's position among all sites, from G's draw)."""
        assert self.federation is not None
        k, b, c = logits.shape
        if self.options.ensemble_weighting == "uniform":
            return L.uniform_weights(k, b, c, device=logits.device)
        share = self.federation.share(clients, c)
        if self.options.ensemble_weighting == "owner" and owner is not None:
            # a site's position, as G's draws number them -> its teacher's row in `logits` (-1: not asked)
            row = torch.full((len(self.federation.clients),), -1)
            row[[self.federation.clients.index(cid) for cid in clients]] = torch.arange(len(clients))
            among = row[owner.cpu()]
            return L.owner_weights(among, L.importance_weights(share, None).to(logits), b // len(owner))
        if ratio is None or self.options.ensemble_weighting != "eq8":
            return L.importance_weights(share, None)
        return L.importance_weights(share, self.view.ratio_rows(ratio, b))  # per-patch ratios upsampled

    def distillation_step(self, fleet: Fleet) -> dict[str, float]:
        """One distillation step: a G-step (the generator's batch through the sites' discriminators and
        teachers, its loss back through their input-gradients), the previous batch's S-step carried along."""
        assert self.federation is not None
        options, config = self.options, self.ctx.config
        lr_g, lr_d, lr_s = self._lrs()
        set_lr(self.g_optimizer, lr_g)
        set_lr(self.s_optimizer, lr_s)
        # the sites this step asks (every one by default); their weights are renormalised over them
        clients = self.step_sites(self.step)
        position = {cid: i for i, cid in enumerate(self.federation.clients)}  # in G's draws (mixture)
        pi_all = self.federation.pi(clients)
        gan_weight = pi_all if options.gan_weighting == "pi" else torch.full_like(pi_all, 1.0 / len(clients))
        self.generator.train()
        # G's samples belong to the asked sites only: each is judged by its own site's discriminator
        draw, latent_gen = self.step_draw(self.step, clients)
        x = self._generate(draw, latent_gen)
        trials, flipped = self._look_trials(), None
        if trials is not None and trials.in_trial(self.step):
            x, flipped = trials.flip(x, draw.owner)
        carried = self.carried
        inputs = {"x": x.detach()} if carried is None else {"x": x.detach(), "student_x": carried.x}
        masks = {} if draw.masks is None else {"m": draw.masks.to(torch.uint8)}
        if carried is not None and carried.masks is not None:
            masks["student_m"] = carried.masks.to(torch.uint8)

        def own(i: int) -> dict[str, torch.Tensor]:  # which samples are site i's (mixture, masks)
            if draw.owner is None:
                return {}
            mine = {"own": (draw.owner == i).to(torch.float32)}
            if draw.pair is not None and self.mask_pools:  # the uploaded mask each own sample came from
                mine["pair"] = torch.where(draw.owner == i, draw.pair, torch.full_like(draw.pair, -1))
            return mine

        wire = wire_encodings(options.wire)
        want_ratio = self._want_ratio()
        # owner_queries: each site is asked only about its own samples (owner_split.py)
        split = OwnerSplit.of(draw.owner, clients, position) if options.owner_queries else None
        batch_arrays = {"synthetic-inputs": inputs} | ({"label-masks": masks} if masks else {})
        # one copy of the batch, shared by every site's request (step_sites.py)
        batch = Message.build("query.generate", arrays=batch_arrays, encodings=wire)

        def scalars(i: int) -> dict[str, dict[str, object]]:
            return {
                "config": {
                    # Eq. 8's ratios on G's batch (and on a carried S-step batch) only when used
                    "want_ratio": want_ratio,
                    **({"student_index": carried.index} if carried is not None else {}),
                    "index": self._mask_index(self.step, 0),
                    "step": self.step,
                    "lr_discriminator": lr_d,
                    "c_gan": options.w_gan * float(gan_weight[i]),
                    "c_conf": options.w_conf * float(pi_all[i]) if options.use_conf else 0.0,
                    "tau": options.tau,
                    "gan_loss": options.gan_loss,
                    **({"c_bn": options.w_bn * float(pi_all[i])} if options.w_bn else {}),
                    **(
                        {"c_perceptual": options.w_perceptual * float(pi_all[i])}
                        if options.w_perceptual and self.mask_pools
                        else {}
                    ),
                    **({"total_steps": self.total_steps} if options.dp_enabled else {}),
                    # owner_queries: D_k's real batch stays the whole batch's size (generate_request.py)
                    **({"real_batch": options.synthetic_batch_size} if split is not None else {}),
                }
            }

        if split is None:
            requests = {
                cid: shared_batch_request(batch, own(position[cid]), scalars=scalars(i), encodings=wire)
                for i, cid in enumerate(clients)
            }
        else:
            own_arrays = {"own": torch.ones(len(draw.owner))}
            if draw.pair is not None and self.mask_pools:
                own_arrays["pair"] = draw.pair
            requests = {
                cid: Message.build(
                    "query.generate",
                    arrays=split.arrays_for(cid, {**batch_arrays, "synthetic-inputs": inputs | own_arrays}),
                    scalars=scalars(i),
                    encodings=wire,
                )
                for i, cid in enumerate(clients)
                if cid in split.rows
            }
        timeout = config.timeout or None
        b, view = options.synthetic_batch_size, self.view

        def reply_spec(n: int) -> ReplySpec:  # n samples asked about
            logits_spec = {"z": ArraySpec("float32", view.sent_shape(n))}
            ratio_spec = {"ratio": ArraySpec("float32", view.ratio_shape(n))}
            if carried is not None:  # step t-1's S-step targets ride along
                logits_spec["student_z"] = ArraySpec("float32", view.sent_shape(len(carried.x)))
                ratio_spec["student_ratio"] = ArraySpec("float32", view.ratio_shape(len(carried.x)))
            return ReplySpec(
                {"logits": logits_spec} | ({"discriminator-outputs": ratio_spec} if want_ratio else {}),
                refusable=True,  # a site at its privacy budget refuses; refusal_reason stops the run
                non_negative=frozenset({"discriminator-outputs"}),  # Eq. 8's density ratios
            )

        expect = reply_spec(b) if split is None else {c: reply_spec(len(r)) for c, r in split.rows.items()}
        sent = fleet.send(requests, step=self.step, timeout=timeout, expect=expect)
        self.epsilons.update(epsilons_of(sent))
        reason = refusal_reason(sent, f"G-step {self.step}")
        if reason is not None:
            raise StopRun(reason)
        sent = screened_logits(options, fleet, sent, self.step)
        replies = successful(sent, minimum=min(config.min_clients, len(clients)), what="generator queries")
        answered = sorted(replies)
        pi = self.federation.pi(answered)
        if flipped is not None:  # each teacher on its own site's samples, drawn and flipped
            trials.record_replies(replies, position, draw, flipped, view.received_logits, split)
        s_losses = []
        if carried is not None:  # step t-1's S-steps, at its learning rate, before this step's L_mimic
            set_lr(self.s_optimizer, carried.lr)
            s_losses.append(self._student_update(carried, replies, "student_z", "student_ratio"))
            set_lr(self.s_optimizer, lr_s)
            self.carried = None
        # the gradient still goes to what clients sent; per-pixel outputs become one row per pixel
        to_rows = lambda z: calibrated(view.stacked_rows(view.received_logits(z)), self.teacher_logits)  # noqa: E731
        kept = own_rows = None  # owner_queries: the samples whose owner answered, each teacher's own rows
        if split is None:
            parts = [
                torch.stack([replies[cid].tensor("logits", "z") for cid in answered]).requires_grad_(True)
            ]
            logits = to_rows(parts[0])
        else:
            parts = [replies[cid].tensor("logits", "z").requires_grad_(True) for cid in answered]
            logits, own_rows = split.stacked_rows(dict(zip(answered, parts, strict=True)), answered, to_rows)
            kept = split.answered(answered).to(x.device)
        ratio = None
        if want_ratio:
            ratio = torch.stack([replies[cid].tensor("discriminator-outputs", "ratio") for cid in answered])
            ratio = ratio.reshape(len(answered), -1)
        x_server = x.detach().requires_grad_(True)
        weights = self._weights(logits.detach(), ratio, answered, draw.owner)
        self.student.train()
        ensemble = combined_ensemble(options, logits, weights)
        student_in = view.model_input(x_server, self._mask_index(self.step, 0))
        # the samples (and rows) the step learns from: all, or those whose owner answered
        samples = slice(None) if kept is None else kept
        rows = slice(None) if kept is None else kept.repeat_interleave(ensemble.shape[0] // len(kept))
        if options.pool_generator_batch:  # per-pixel targets kept per sample, as the S-steps keep theirs
            targets = self._with_truth(x_server, student_in, ensemble.detach(), draw.masks)
            per_sample = targets.reshape(len(x), -1, targets.shape[-1]) if view.per_pixel else targets
            self.pool.add(student_in[samples], per_sample[samples])
            if not options.student_steps and not view.per_pixel:  # no S-step batch to measure it on
                self.last_coverage = class_coverage(ensemble.detach()[samples])
                # each T_k's own logits, uncalibrated (Table 7); with owner queries a sample's one teacher
                # is its owner, whose logits the ensemble is
                scored = (
                    view.stacked_rows(parts[0].detach()) if kept is None else ensemble.detach()[kept][None]
                )
                self.last_coverage["adapted_is"] = adapted_inception_score(scored)
        student_out = view.rows(self._student_forward(student_in, "g-step", self.step))
        mimic = L.mimic_loss(student_out[rows], ensemble[rows], mode=options.mimic, tau=options.tau)
        server_loss = -options.w_adv * mimic
        unique = torch.zeros(())
        if options.use_unique:
            unique = (
                L.unique_loss(logits, pi, options.tau)
                if options.js == "paper"
                else L.official_js_loss(logits, options.tau)
            )
            server_loss = server_loss + options.w_unique * unique
        if options.w_balance:
            if options.balance == "ensemble":
                balance = L.marginal_balance_loss(ensemble[rows])
            else:
                balance = L.balance_loss(logits, pi, own_rows)
            server_loss = server_loss + options.w_balance * balance
        *grads, grad_x = torch.autograd.grad(server_loss, [*parts, x_server])
        grad_logits = grads[0] if split is None else grads

        def gradient_spec(n: int) -> ReplySpec:
            return ReplySpec({"input-gradients": {"x": ArraySpec("float32", (n, *x.shape[1:]))}})

        gradients = fleet.send(
            {
                cid: Message.build(
                    "query.backprop", arrays={"output-gradients": {"z": grad_logits[i]}}, encodings=wire
                )
                for i, cid in enumerate(answered)
            },
            step=self.step,
            timeout=timeout,
            expect=gradient_spec(len(x))
            if split is None
            else {c: gradient_spec(len(split.rows[c])) for c in answered},
        )
        back = successful(
            screened_gradients(options, fleet, gradients, self.step),
            minimum=min(config.min_clients, len(answered)),
            what="input-gradients",
        )
        total = grad_x.clone()
        for cid, reply in back.items():
            if split is None:
                total += reply.tensor("input-gradients", "x")
            else:
                split.scatter(total, cid, reply.tensor("input-gradients", "x"))
        self.g_optimizer.zero_grad(set_to_none=True)
        x.backward(total)
        self.g_optimizer.step()
        if trials is not None and trials.ends(self.step):
            trials.decide(self.generator, self.g_optimizer)
        if not options.student_steps:  # the student learns from the pool alone: no query beyond G's batch
            self._replay(self.step)
        elif options.merge_student_queries:
            self.carried = self._student_inputs(lr_s)
        else:
            s_losses.append(self._student_steps(fleet, answered))
        self.step += 1

        def client_mean(name: str) -> float:  # nan when no client reports it (d_loss under DP)
            values = [
                float(r.scalar("metrics", name)) for r in replies.values() if name in r.scalars["metrics"]
            ]
            return float(np.mean(values)) if values else float("nan")

        return {
            "loss_mimic": mimic.item(),
            "loss_unique": unique.item(),
            **({"loss_student": s_losses[0]} if s_losses else {}),
            "loss_discriminator": client_mean("d_loss"),
            "loss_gan": client_mean("gan_loss"),
            "entropy": client_mean("entropy"),
        }

    def _mask_index(self, step: int, offset: int) -> int:
        """Where the undersampling masks of a batch start in the synthetic mask stream (reconstruction):
        G-step `step`'s batch at offset 0, its S-step inputs after it."""
        per_step = self.options.synthetic_batch_size * (1 + self.options.student_steps)
        return step * per_step + offset
