"""One-shot FedAvg and one-shot FedDF: the simplest one-shot baselines, on FedIOD's stage-1 models.

Each site trains its local model once, exactly as FedIOD's client trains its teacher (DENSE's
`OneShotClient`: the same architecture rule, `teacher_epochs`, random stream and stage-1 cache
entry), and uploads it once. The server then either averages the models once (`fedavg-oneshot`:
FedAvg with a single round of `teacher_epochs` local epochs from a common start) or fuses them once by
FedDF's ensemble distillation (`feddf-oneshot`: the sample-weighted average as the student's start,
then FedDF's AVGLOGITS distillation on its `source`, selected on the server's validation split). So in a
comparison table every row distils or averages the very same local models.

In both, each site sends its parameters (with its training metrics) once and nothing afterwards (the
ledger shows it): the server scores the student on the test set and, for the fusion, selects it on its
own validation split. `rounds` is 1: everything happens in the first round.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from fedistill.algorithms.base import Algorithm, ServerContext, ServerLogic, clone_state, register
from fedistill.algorithms.feddf import FedDFOptions, distill
from fedistill.algorithms.one_shot.dense.client import OneShotClient
from fedistill.algorithms.one_shot.dense.options import teacher_of
from fedistill.algorithms.shared.distillation_data import (
    DistillationSource,
    build_source,
    check_source_run,
    parse_source,
    split_holdout,
)
from fedistill.algorithms.shared.option_checks import check_model_names, check_refused
from fedistill.algorithms.shared.stage1 import STAGE1_UNUSED_KEYS, collect_local_models, teachers_from_cache
from fedistill.algorithms.shared.training import average_states, evaluate_model, new_model, test_metrics
from fedistill.config import RunConfig
from fedistill.data.base import ImageSet
from fedistill.errors import ConfigError
from fedistill.federation.fleet import Fleet
from fedistill.privacy.budget import DP_KEYS
from fedistill.seeding import torch_generator

log = logging.getLogger(__name__)


#: FedDF's round keys a one-shot method never reads: the groups (`teachers` and `student` name the
#: architectures), the student's start (always the sample-weighted average of the student's
#: architecture), drop-worst, the robust combines and their trim, binary fusion and the clients' proximal
#: term. (The `dp_*` keys, `DP_KEYS`, are refused too: the sites upload their stage-1 models as trained.)
UNUSED_ROUND_KEYS = (
    "groups",
    "distill",
    "drop_worst",
    "weighting",
    "fuse_precision",
    "student_init",
    "prox_mu",
    "aggregate",
    "aggregate_trim",
)

#: FedDF's distillation keys: `feddf-oneshot` reads them, `fedavg-oneshot` (which only averages) refuses
#: them.
DISTILLATION_KEYS = (
    "source",
    "source_size",
    "holdout_val_share",
    "generator_upsample",
    "steps",
    "distill_batch_size",
    "distill_lr",
    "distill_optimizer",
    "schedule",
    "loss",
    "temperature",
    "t_squared",
    "clip_grad_norm",
    "eval_every_steps",
    "patience",
    "fallback_to_average",
    "student_bn",
)


NO_DP = (
    "is a differential-privacy key, but {section} does not offer differential privacy: its clients upload "
    "their stage-1 models as they are, unclipped and un-noised (fedavg and feddf offer it); leave it at "
    "{default}"
)
ROUND_KEY = (
    "is a key of FedDF's rounds, which a one-shot method does not use (it would be ignored); leave it at "
    "{default}"
)
DISTILLATION_KEY = (
    "is a distillation key, and {section} only averages the sites' models (it would be ignored); set it in "
    "[feddf-oneshot], which distils, or leave it at {default}"
)

NO_STUDENT_ARCHITECTURE = (
    "one-shot FedAvg averages the sites' models of the student's architecture, and no site has it: "
    "make `teachers` name the student's model (or `student` one of the teachers')"
)


@dataclass(frozen=True)
class OneShotOptions(FedDFOptions):
    """FedIOD's stage 1 (`teachers`, `student`, `teacher_epochs`) and, for `feddf-oneshot`, FedDF's
    distillation options (`source`, `steps`, `distill_lr`, ...; `fedavg-oneshot`, which never distils,
    refuses them). FedDF's round keys (`groups`, `distill`, `drop_worst`, `weighting`, `fuse_precision`,
    `student_init`, `prox_mu`, `aggregate`, `aggregate_trim`) and the `dp_*` keys must keep their defaults
    (`refused_keys`): a one-shot method has no use for them."""

    teachers: str = ""  # one model name, or a comma list cycled over the clients; "" = `model`
    student: str = ""  # the architecture of the averaged or fused model; "" = `model`
    teacher_epochs: int = 30  # FedIOD's default, so every one-shot method sees the same local models
    section: ClassVar[str] = "fedavg-oneshot"
    model_keys: ClassVar[str] = "teachers student"  # not FedDF's `groups`, which must stay empty
    distils: ClassVar[bool] = False  # whether the method reads FedDF's distillation keys
    #: FedDF's keys it never reads, refused when set away from their defaults rather than ignored (and
    #: left out of `fedistill list --options`): the one upload is never sanitised, dropped as worst or
    #: robustly combined (only screened: `plausibility_checks`), nor distilled
    refused_keys: ClassVar[dict[str, str]] = {
        **dict.fromkeys(DP_KEYS, NO_DP),
        **dict.fromkeys(UNUSED_ROUND_KEYS, ROUND_KEY),
        **dict.fromkeys(DISTILLATION_KEYS, DISTILLATION_KEY),
    }

    def validate(self) -> None:
        """None of the refused keys set (`refused_keys`), FedDF's checks and at least one stage-1 epoch."""
        check_refused(self.section, self)  # before FedDF's checks, which would offer values refused here
        super().validate()
        check_model_names(self.section, self, self.model_keys)
        if self.teacher_epochs < 1:
            raise ConfigError(f"{self.section}.teacher_epochs must be >= 1, got {self.teacher_epochs}")

    def check_run(self, config: RunConfig) -> None:
        """What the options rule out with the run's common keys, checked before the run writes anything."""
        if config.rounds != 1:
            raise ConfigError(
                f"a one-shot method runs one round, got rounds = {config.rounds}; set rounds = 1"
            )
        if self.distils:
            check_source_run(self.source, f"{self.section}.source", config.dataset)
        if self.distils and config.val_fraction == 0:
            raise ConfigError(
                f"{self.section} selects on the server's validation split: set val_fraction > 0"
            )


@dataclass(frozen=True)
class FusionOneShotOptions(OneShotOptions):
    """The same options, read from (and named in messages as) the `[feddf-oneshot]` table."""

    section: ClassVar[str] = "feddf-oneshot"
    distils: ClassVar[bool] = True
    refused_keys: ClassVar[dict[str, str]] = {
        **dict.fromkeys(DP_KEYS, NO_DP),
        **dict.fromkeys(UNUSED_ROUND_KEYS, ROUND_KEY),
    }


class OneShotServer(ServerLogic):
    """Round 1: every site's model, once; then the average (FedAvg) or the distilled fusion (FedDF)."""

    fuse = False

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        config = ctx.config
        self.options: OneShotOptions = ctx.options
        self.options.check_run(config)
        self.student = new_model(config, ctx.info, self.options.student or config.model)
        self.reference: dict[str, float] = {}
        self.fusion: dict[str, float] = {}
        # known now: refuse here rather than after every site has trained
        if self.fuse:
            self.validation, self.source = self._fusion_data()
        elif all(self._architecture(c) != self._student_architecture() for c in range(ctx.num_clients)):
            raise ConfigError(NO_STUDENT_ARCHITECTURE)

    def _fusion_data(self) -> tuple[ImageSet, DistillationSource]:
        """The labelled split the fusion selects on and the unlabelled inputs it distils on."""
        config, options = self.ctx.config, self.options
        validation = self.ctx.validation
        if validation is None or len(validation) == 0:
            raise ConfigError("feddf-oneshot selects on the server's validation split: set val_fraction > 0")
        key = f"{options.section}.source"
        kind, _ = parse_source(options.source, key)
        check_source_run(options.source, key, config.dataset)  # as FedDF's: not the clients' images
        held_out = None
        if kind == "holdout":
            validation, held_out = split_holdout(validation, options.holdout_val_share, config.seed, key=key)
        source = build_source(
            options.source,
            self.ctx.info,
            data_dir=config.data_dir,
            size=options.source_size,
            seed=config.seed,
            upsample=options.generator_upsample,
            held_out=held_out,
            download=config.download,
            key=key,
        )
        return validation, source

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        """The one round: gather every site's model once, then average (or fuse) them."""
        config = self.ctx.config
        replies = collect_local_models(
            fleet, config, self._local_model, screen_norms=self.options.plausibility_checks
        )
        clients = sorted(replies)
        counts = [float(replies[c].scalar("metrics", "num_samples")) for c in clients]
        models = [self._frozen(c, replies[c].tensors("parameters")) for c in clients]
        self.reference = self._teacher_report(models, counts)
        self.reference["teachers_from_cache"] = teachers_from_cache(replies)
        same = [i for i, c in enumerate(clients) if self._architecture(c) == self._student_architecture()]
        if not same and not self.fuse:
            raise ConfigError(
                "one-shot FedAvg averages models of the student's architecture; none was sent (the sites "
                "of that architecture did not answer)"
            )
        if same:
            self.student.load_state_dict(
                average_states([models[i].state_dict() for i in same], [counts[i] for i in same])
            )
        if self.fuse:
            self.fusion = self._distil(models, counts, round)
        return {"clients": len(clients)} | self.fusion

    def _distil(self, teachers: list[nn.Module], counts: list[float], round: int) -> dict[str, float]:
        config, options = self.ctx.config, self.options
        validation, source = self.validation, self.source

        def validate(model: nn.Module) -> float:
            return evaluate_model(model, validation, self.ctx.info)["accuracy"]

        weights = [1.0 / len(teachers)] * len(teachers)
        report = distill(
            self.student,
            teachers,
            weights,
            source,
            validate,
            options,
            torch_generator(config.seed, "feddf-oneshot", round),
        )
        log.info("one-shot FedDF distilled on %s", source.description)
        return {
            "val_accuracy_average": report.evaluations[0][1],
            "val_accuracy": report.selected_accuracy,
            "distill_steps": float(report.steps),
        }

    def _teacher_report(self, models: list[nn.Module], counts: list[float]) -> dict[str, float]:
        """The local models' test accuracies and their uniform ensemble's (the one-shot ceiling)."""
        accuracies = [self.ctx.evaluate(m)["accuracy"] for m in models]
        ensemble = self.ctx.evaluate(_Ensemble(models))["accuracy"]
        return {
            "teacher_mean_accuracy": float(torch.tensor(accuracies).mean()),
            "teacher_std_accuracy": float(torch.tensor(accuracies).std(unbiased=False)),
            "ensemble_accuracy": ensemble,
        }

    def _architecture(self, client_id: int) -> str:
        return teacher_of(self.options, self.ctx.config, client_id)

    def _student_architecture(self) -> str:
        return self.options.student or self.ctx.config.model

    def _local_model(self, client_id: int) -> nn.Module:
        return new_model(self.ctx.config, self.ctx.info, self._architecture(client_id))

    def _frozen(self, client_id: int, state: dict[str, torch.Tensor]) -> nn.Module:
        model = self._local_model(client_id)
        model.load_state_dict(state)
        model.eval()
        model.requires_grad_(False)
        return model

    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        """The student on the test set (the evaluation harness)."""
        return test_metrics(self.ctx.evaluate(self.student))

    def final_evaluate(self, fleet: Fleet, last: dict[str, float]) -> dict[str, float]:
        """The last evaluation, the teachers' report and the student's share of the ensemble."""
        final = dict(last) | self.reference
        if self.reference.get("ensemble_accuracy"):
            final["fraction_of_ensemble"] = final["test_accuracy"] / self.reference["ensemble_accuracy"]
        return final

    def models(self) -> dict[str, nn.Module]:
        """The averaged (or fused) model, saved as `global`."""
        return {"global": self.student}

    def state_dict(self) -> dict[str, Any]:
        """The student, the teachers' report and the fusion's metrics, for the checkpoint."""
        return {"student": clone_state(self.student), "reference": self.reference, "fusion": self.fusion}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict()` returned."""
        self.student.load_state_dict(state["student"])
        self.reference, self.fusion = dict(state["reference"]), dict(state["fusion"])


class OneShotFusionServer(OneShotServer):
    """One-shot FedDF: the sites' models fused once by FedDF's ensemble distillation."""

    fuse = True


class _Ensemble(nn.Module):
    """The uniform average of the local models' logits, for the ceiling's test accuracy."""

    def __init__(self, models: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(copy.copy(m) for m in models)

    def train(self, mode: bool = True) -> _Ensemble:
        """The members stay in the mode they came in (they share their layers with the local models, so an
        evaluation harness restoring "train" here would switch the models' BatchNorm to training)."""
        self.training = mode
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x) for m in self.members]).mean(0)


register(
    Algorithm(
        "fedavg-oneshot",
        "one-shot FedAvg: FedIOD's stage-1 models, uploaded once and averaged once",
        OneShotClient,
        OneShotServer,
        OneShotOptions,
        unused_keys=STAGE1_UNUSED_KEYS,
    )
)
register(
    Algorithm(
        "feddf-oneshot",
        "one-shot FedDF: FedIOD's stage-1 models, uploaded once and fused once by ensemble distillation",
        OneShotClient,
        OneShotFusionServer,
        FusionOneShotOptions,
        unused_keys=STAGE1_UNUSED_KEYS,
    )
)
