"""FedDF's server round: send each group its model, gather the trained ones, optionally drop the worst,
average per group, then distil the ensemble of all received models into each group's student."""

from __future__ import annotations

import copy
import logging
from contextlib import AbstractContextManager, nullcontext

import numpy as np
import torch
from torch import nn

from fedistill import devices
from fedistill.algorithms.base import ServerContext, ServerLogic, clone_state
from fedistill.algorithms.classic import PrivacyReport
from fedistill.algorithms.feddf.fusion import distill
from fedistill.algorithms.feddf.options import FedDFOptions, check_full_precision, group_names
from fedistill.algorithms.shared.distillation_data import (
    build_source,
    check_source_run,
    parse_source,
    split_holdout,
)
from fedistill.algorithms.shared.drop_worst import accuracy, drop_worst_weights, predict_logits
from fedistill.algorithms.shared.sampling import mean_metric, sample_clients, sampling_rate
from fedistill.algorithms.shared.training import average_states, evaluate_model, new_model
from fedistill.algorithms.shared.weight_average import robust_average_states
from fedistill.errors import ConfigError
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import Message, state_specs
from fedistill.federation.plausibility import screen_parameters
from fedistill.federation.reply_spec import LOCAL_METRICS, TRAIN_METRICS, ReplySpec
from fedistill.models.binary import full_precision
from fedistill.seeding import torch_generator

log = logging.getLogger(__name__)

#: Below this many labelled validation samples, model selection and early stopping are mostly noise.
FEW_VALIDATION_SAMPLES = 50


class FedDFServer(ServerLogic):
    """One model per architecture group, fused each round from the ensemble of every received model."""

    #: Why `recalibrate_norm` does not apply (engine/norm_statistics.py), though its sites could answer
    not_recalibrated = "its fused models learn last from the server's distillation data"

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        config, info = ctx.config, ctx.info
        self.options: FedDFOptions = ctx.options
        if ctx.validation is None or len(ctx.validation) == 0:
            raise ConfigError(
                "feddf needs the server's validation split (model selection and early stopping): "
                "set val_fraction > 0"
            )
        self.validation = ctx.validation
        kind, _ = parse_source(self.options.source)
        held_out = None  # holdout: part of the held-out split stays labelled, the rest is distilled on
        if kind == "holdout":
            share = self.options.holdout_val_share
            self.validation, held_out = split_holdout(ctx.validation, share, config.seed)
        if len(self.validation) < FEW_VALIDATION_SAMPLES:
            log.warning(
                "FedDF selects its students, stops early%s on %d labelled validation samples only: "
                "their accuracies move in steps of %.3f; raise val_fraction%s",
                " and drops models" if self.options.drop_worst != "off" else "",
                len(self.validation),
                1.0 / len(self.validation),
                " or feddf.holdout_val_share" if kind == "holdout" else "",
            )
        # by registered name: an alias (sst-2, fmnist) loads the same training set, EMNIST's splits overlap
        check_source_run(self.options.source, "feddf.source", config.dataset)
        self.cycle = group_names(self.options, config)
        self.group_models = {name: new_model(config, info, name) for name in dict.fromkeys(self.cycle)}
        self.specs = {name: state_specs(model.state_dict()) for name, model in self.group_models.items()}
        check_full_precision(self.options, self.group_models)
        self.source = build_source(
            self.options.source,
            info,
            data_dir=config.data_dir,
            size=self.options.source_size,
            seed=config.seed,
            upsample=self.options.generator_upsample,
            held_out=held_out,
            download=config.download,
        )
        log.info("FedDF distils on %s", self.source.description)
        self.last_local: dict[str, float] = {}
        rate = sampling_rate(config.fraction, ctx.num_clients)
        self.privacy = PrivacyReport(self.options, rate, ctx.num_clients)

    def group(self, client: int) -> str:
        """The architecture group of `client` (`groups` cycled over the clients)."""
        return self.cycle[client % len(self.cycle)]

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        """One round: local training, drop-worst, per-group averages, ensemble distillation."""
        config, options = self.ctx.config, self.options
        chosen = sample_clients(fleet.clients, config.fraction, config.seed, round)
        evaluate_local = round % config.eval_every == 0 or round == config.rounds
        settings = {"round": round, "prox_mu": options.prox_mu, "evaluate_local": evaluate_local}
        requests = {
            name: Message.build(
                "train", arrays={"parameters": model.state_dict()}, scalars={"config": settings}
            )
            for name, model in self.group_models.items()
        }
        needed = TRAIN_METRICS + (LOCAL_METRICS if evaluate_local else ())
        expect = {
            cid: ReplySpec({"parameters": self.specs[self.group(cid)]}, needed, refusable=True)
            for cid in chosen
        }
        sent = fleet.send(
            {cid: requests[self.group(cid)] for cid in chosen}, timeout=config.timeout or None, expect=expect
        )
        self.privacy.check(sent, round)
        if options.plausibility_checks:
            sent = screen_parameters(fleet, sent)
        replies = successful(sent, minimum=min(config.min_clients, len(chosen)), what="trained parameters")
        clients = sorted(replies)
        states = [replies[cid].tensors("parameters") for cid in clients]
        counts = [float(replies[cid].scalar("metrics", "num_samples")) for cid in clients]
        teachers = [self._frozen(self.group(cid), state) for cid, state in zip(clients, states, strict=True)]

        # drop-worst and the ensemble's own validation accuracy (the ceiling the students chase)
        labels = devices.on_device(self.validation.y)
        val_logits = torch.stack([predict_logits(t, self.validation, self.ctx.info) for t in teachers])
        accuracies = [accuracy(z, labels) for z in val_logits]
        if options.drop_worst == "off":
            weights = [1.0 / len(clients)] * len(clients)
        else:
            weights = drop_worst_weights(
                accuracies, self.ctx.info.num_classes, weighted=options.drop_worst == "weighted"
            )
        kept = [i for i, w in enumerate(weights) if w > 0]
        ensemble = (torch.tensor(weights, device=val_logits.device).view(-1, 1, 1) * val_logits).sum(0)
        metrics: dict[str, float] = {
            "train_loss": mean_metric({c: replies[c] for c in clients}, "train_loss", counts),
            "clients": len(clients),
            "teachers": len(kept),
            "dropped": len(clients) - len(kept),
            "teacher_val_accuracy_mean": float(np.mean(accuracies)),
            "ensemble_val_accuracy": accuracy(ensemble, labels),
        }

        # per group: average its kept models, then distil the whole ensemble into it
        selected = []
        for name, student in self.group_models.items():
            members = [i for i in kept if self.group(clients[i]) == name]
            if members and options.student_init == "average":  # else the group's previous model
                shares = [counts[i] if options.weighting == "samples" else 1.0 for i in members]
                student.load_state_dict(self._aggregate([states[i] for i in members], shares))
            if not options.distill:
                selected.append(self._validate(student))
                metrics |= {f"members_{name}": len(members), f"val_accuracy_{name}": selected[-1]}
                continue
            with self._precision(student):
                report = distill(
                    student,
                    [teachers[i] for i in kept],
                    [weights[i] for i in kept],
                    self.source,
                    self._validate,
                    options,
                    torch_generator(config.seed, "feddf-distillation", round, name),
                )
            selected.append(report.selected_accuracy)
            metrics |= {
                f"members_{name}": len(members),
                f"val_accuracy_average_{name}": report.evaluations[0][1],
                f"val_accuracy_{name}": report.selected_accuracy,
                f"distill_steps_{name}": report.steps,
                f"selected_step_{name}": report.selected_step,
                f"distill_loss_first_{name}": report.losses[0],
                f"distill_loss_last_{name}": report.losses[-1],
            }
        metrics["val_accuracy"] = float(np.mean(selected))
        if evaluate_local:
            local_counts = [float(replies[c].scalar("metrics", "local_count")) for c in clients]
            local = [float(replies[c].scalar("metrics", "local_accuracy")) for c in clients]
            metrics["local_accuracy"] = float(np.average(local, weights=local_counts))
            self.last_local = {"local_accuracy": metrics["local_accuracy"]}
        self.privacy.rounds_done = round
        return metrics | self.privacy.metrics()

    def final_evaluate(self, fleet: Fleet, last: dict[str, float]) -> dict[str, float]:
        """The last evaluation and, under DP, every client's epsilon."""
        return dict(last) | self.privacy.final(fleet, self.ctx.config.timeout or None)

    def _aggregate(
        self, states: list[dict[str, torch.Tensor]], shares: list[float]
    ) -> dict[str, torch.Tensor]:
        """The group's student initialisation from its members' states (`aggregate`)."""
        if self.options.aggregate == "mean":
            return average_states(states, shares)
        return robust_average_states(states, shares, self.options.aggregate, self.options.aggregate_trim)

    def _frozen(self, group: str, state: dict[str, torch.Tensor]) -> nn.Module:
        """A received model as a frozen teacher (eval mode, no gradients)."""
        model = copy.deepcopy(self.group_models[group])
        model.load_state_dict(state)
        model.eval()
        model.requires_grad_(False)
        return model

    def _precision(self, student: nn.Module) -> AbstractContextManager[nn.Module]:
        """The precision the student is distilled and selected in (`fuse_precision`)."""
        return full_precision(student) if self.options.fuse_precision == "full" else nullcontext(student)

    def _validate(self, model: nn.Module) -> float:
        return evaluate_model(model, self.validation, self.ctx.info)["accuracy"]

    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        """Test metrics per group (`test_accuracy_<model>`); `test_accuracy` is their mean."""
        results = {name: self.ctx.evaluate(model) for name, model in self.group_models.items()}
        metrics = {f"test_accuracy_{name}": r["accuracy"] for name, r in results.items()}
        metrics |= {f"test_loss_{name}": r["loss"] for name, r in results.items()}
        metrics["test_accuracy"] = float(np.mean([r["accuracy"] for r in results.values()]))
        if self.options.fuse_precision == "full":  # the fused network itself, before clients binarize it
            full = []
            for model in self.group_models.values():
                with full_precision(model):
                    full.append(self.ctx.evaluate(model)["accuracy"])
            metrics["test_accuracy_full_precision"] = float(np.mean(full))
        metrics["test_loss"] = float(np.mean([r["loss"] for r in results.values()]))
        return metrics | self.last_local

    def models(self) -> dict[str, nn.Module]:
        """Each group's model (`global` when there is one group)."""
        if len(self.group_models) == 1:
            return {"global": next(iter(self.group_models.values()))}
        return {f"global_{name}": model for name, model in self.group_models.items()}

    def state_dict(self) -> dict:
        """Each group's model, the last local metrics and the privacy report."""
        return {
            "models": {name: clone_state(model) for name, model in self.group_models.items()},
            "last_local": self.last_local,
            "privacy": self.privacy.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict()` returned."""
        for name, model_state in state["models"].items():
            self.group_models[name].load_state_dict(model_state)
        self.last_local = dict(state.get("last_local", {}))
        self.privacy.load_state_dict(state.get("privacy", {}))
