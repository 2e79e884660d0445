"""FedIOD's options: the paper's settings, the released code's preset, the stabilisers (the default on
classification) and the lean exchanges (the default on segmentation and reconstruction)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedistill.algorithms.base import (
    model_cycle,
)
from fedistill.algorithms.fediod.calibration import TEACHER_LOGITS
from fedistill.algorithms.fediod.option_groups import (
    RATIO_RESOLUTIONS,
    DiscriminatorOptions,
    GeneratorLossOptions,
    GeneratorOptions,
    PerPixelTaskOptions,
    PrivacyOptions,
    ProtocolOptions,
    RobustnessOptions,
    StabiliserOptions,
    StudentOptions,
    TeacherOptions,
)
from fedistill.algorithms.fediod.wire import WIRES
from fedistill.algorithms.shared.option_checks import check_choices
from fedistill.algorithms.shared.schedules import cosine_lr, set_lr  # noqa: F401  (FedIOD's own names)
from fedistill.algorithms.shared.weight_average import COMBINES
from fedistill.config import RunConfig
from fedistill.errors import ConfigError
from fedistill.models.generator import check_upsamples

if TYPE_CHECKING:
    from fedistill.algorithms.fediod.task_view import TaskView

log = logging.getLogger(__name__)


PRESETS = ("auto", "paper", "official-code", "stable", "lean")
WEIGHTINGS = ("eq8", "class-share", "uniform", "owner")
MIMIC_MODES = ("l2", "kl", "kl-official", "l1")
SELECTIONS = ("validation", "last", "best-on-test")
DP_ACCOUNTINGS = ("d-step", "release")


@dataclass(frozen=True)
class FedIODOptions(
    ProtocolOptions,
    TeacherOptions,
    GeneratorOptions,
    GeneratorLossOptions,
    DiscriminatorOptions,
    StudentOptions,
    StabiliserOptions,
    PerPixelTaskOptions,
    PrivacyOptions,
    RobustnessOptions,
):
    """Every FedIOD key, flat (`fediod.w_adv`, `options.w_adv`); each group's docstrings are in
    option_groups.py. Every key's default is the paper's unless its docstring says otherwise; the default
    `preset = "auto"` then applies `STABLE` (the stabilisers) to the keys a user did not set on
    classification, and `LEAN` (the student learns from G's own batches, no extra labelling) on
    segmentation and reconstruction. `preset = "paper"` keeps the paper's settings everywhere,
    `"official-code"` takes the released code's choices, `"stable"` the stabilisers on any task, `"lean"`
    the lean exchanges on any task.

    The ``dp_*`` options (see `DPOptions` and the module docstring) sanitise the input-gradients.
    """

    def validate(self) -> None:
        """Check the DP keys, the choices and ranges, and the keys that only make sense together."""
        self.validate_dp()
        choices = {
            "preset": PRESETS,
            "ensemble_weighting": WEIGHTINGS,
            "mimic": MIMIC_MODES,
            "selection": SELECTIONS,
            "gan_weighting": ("pi", "average"),
            "gan_loss": ("non-saturating", "minimax"),
            "js": ("paper", "official"),
            "schedule": ("cosine", "constant"),
            "student_optimizer": ("adam", "sgd"),
            "balance": ("ensemble", "teachers"),
            "dp_accounting": DP_ACCOUNTINGS,
            "teacher_logits": TEACHER_LOGITS,
            "generator_mixture": ("shared", "per-client"),
            "mask_source": ("clients", "prior"),
            "wire": WIRES,
            "ensemble_combine": COMBINES,
            "ratio_resolution": RATIO_RESOLUTIONS,
            "pixel_logits": ("all", "margin"),
        }
        check_choices("fediod", self, choices)
        if self.selection == "best-on-test" and self.preset != "official-code":
            raise ConfigError(
                "fediod.selection = 'best-on-test' selects on the test set; it exists only to reproduce the "
                "released code (set fediod.preset = 'official-code')"
            )
        if self.iters_per_epoch not in ("max", "min") and not (
            isinstance(self.iters_per_epoch, int) and self.iters_per_epoch >= 1
        ):
            raise ConfigError(
                f"fediod.iters_per_epoch must be max, min or a number; got {self.iters_per_epoch!r}"
            )
        for key in (
            "teacher_epochs",
            "synthetic_batch_size",
            "latent_dim",
            "generator_blocks",
            "discriminator_layers",
        ):
            if getattr(self, key) < 1:
                raise ConfigError(f"fediod.{key} must be >= 1")
        for key in ("lr_generator", "lr_discriminator", "lr_student", "tau", "share_power"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"fediod.{key} must be > 0")
        check_upsamples("fediod.generator_upsamples", self.generator_upsamples)
        if not 0.0 <= self.combine_trim < 0.5 or not 0.0 < self.combine_clip < 1.0:
            raise ConfigError("fediod.combine_trim must lie in [0, 0.5) and fediod.combine_clip in (0, 1)")
        if not 0.0 <= self.truth_weight <= 1.0:
            raise ConfigError(f"fediod.truth_weight is a weight in [0, 1]; got {self.truth_weight}")
        if not 0.0 <= self.student_recolour <= 1.0:
            raise ConfigError(f"fediod.student_recolour is a share in [0, 1]; got {self.student_recolour}")
        if not 0.0 <= self.student_ema < 1.0:
            raise ConfigError(f"fediod.student_ema is a decay in [0, 1); got {self.student_ema}")
        for key in (
            "generator_width",
            "discriminator_width",
            "w_bn",
            "pool_size",
            "pool_steps",
            "pool_batch_size",
            "student_noise",
            "student_shift",
            "student_mixup",
            "collapse_patience",
            "mask_pool",
            "noise_channels",
            "w_perceptual",
            "reference_samples",
            "sites_per_step",
            "student_steps",
        ):
            if getattr(self, key) < 0:
                raise ConfigError(f"fediod.{key} must be >= 0")
        self.check_combinations(preset_fills=True)

    def check_combinations(self, *, preset_fills: bool = False) -> None:
        """Rules across keys. Before the preset is applied (`preset_fills`), a key the preset sets counts
        as set, so a user may change the preset's replay steps without repeating its pool size;
        `resolve_options` checks again once the preset's keys are in."""
        filled = preset_fills_any_task(self.preset) if preset_fills else {}
        if self.pool_steps and not (self.pool_size or filled.get("pool_size", 0)):
            raise ConfigError("fediod.pool_steps replays the pool: set fediod.pool_size > 0 too")
        if self.pool_generator_batch and not (self.pool_size or filled.get("pool_size", 0)):
            raise ConfigError("fediod.pool_generator_batch adds to the pool: set fediod.pool_size > 0 too")
        per_client = "per-client" in (self.generator_mixture, filled.get("generator_mixture"))
        if self.ensemble_weighting == "owner" and not per_client:
            raise ConfigError(
                "fediod.ensemble_weighting = 'owner' labels each sample by the teacher of the site G drew it "
                "for: set fediod.generator_mixture = 'per-client' too"
            )
        if self.owner_queries:
            self._check_owner_queries(filled)
        if self.site_looks and not per_client:
            raise ConfigError(
                "fediod.site_looks gives each site's share of G's batch that site's colours: set "
                "fediod.generator_mixture = 'per-client' too"
            )
        if not self.student_steps and not (
            (self.pool_generator_batch or filled.get("pool_generator_batch", False))
            and (self.pool_steps or filled.get("pool_steps", 0))
        ):
            raise ConfigError(
                "fediod.student_steps = 0 trains the student only on the G-steps' batches in the replay "
                "pool: set fediod.pool_generator_batch = true and fediod.pool_steps > 0 too"
            )

    def _check_owner_queries(self, filled: dict[str, object]) -> None:
        """`owner_queries` asks each site about its own samples only: what needs every teacher on every
        sample is refused with it."""
        # before the preset applies, either its value or the current one may be the run's
        values = lambda key: (getattr(self, key), filled.get(key, getattr(self, key)))  # noqa: E731
        if "owner" not in values("ensemble_weighting"):
            raise ConfigError(
                "fediod.owner_queries asks each site only about the samples G drew for it, so only their "
                "owner's teacher labels them: set fediod.ensemble_weighting = 'owner' (and "
                "fediod.generator_mixture = 'per-client') too"
            )
        if all(values("use_unique")):
            raise ConfigError(
                "fediod.owner_queries asks one teacher per sample, and the disagreement term (L_unique) "
                "compares every teacher on every sample: set fediod.use_unique = false too"
            )
        if all(values("student_steps")):
            raise ConfigError(
                "fediod.owner_queries leaves the S-steps' fresh samples unlabelled by the other sites: set "
                "fediod.student_steps = 0 (the student learns from G's batches in the replay pool: "
                "fediod.pool_generator_batch = true, fediod.pool_steps > 0)"
            )

    @property
    def needs_label_counts(self) -> bool:
        """Whether the ensemble weighting needs each site's class counts from stage 1."""
        return self.ensemble_weighting in ("eq8", "class-share", "owner")


#: What `preset = "official-code"` changes (notes §2.5-2.9): only keys the user did not set.
OFFICIAL_CODE = {
    "teachers": "resnet8-wide",
    "student": "resnet8-wide",
    "ensemble_weighting": "class-share",
    "mimic": "kl-official",
    "js": "official",
    "w_unique": 5.0,
    "w_adv": 0.2,
    "w_balance": 10.0,
    "balance": "teachers",
    "lr_generator": 1e-4,
    "lr_discriminator": 1e-4,
    "lr_student": 5e-3,
    "student_optimizer": "sgd",
    "iters_per_epoch": "max",
    "selection": "best-on-test",
}


#: What `preset = "stable"` changes: the one-shot literature's stabilisers, the student budget and the
#: learning rates the digits demo chose; on Fashion-MNIST the rates and the ensemble's balance target
#: raised the best validation accuracy too (docs/results/tuning-history.md).
STABLE = {
    "lr_student": 3e-3,
    "lr_generator": 3e-3,
    "balance": "ensemble",
    "w_bn": 10.0,
    "pool_size": 20000,
    "pool_steps": 30,
    "mimic": "kl",
    "tau": 3.0,
    "student_steps": 2,
    # G-steps per epoch: the paper's "max" gives 4 on digits, too few for the student to catch up
    "iters_per_epoch": 12,
    # centred logits only when a site saw a single class, where centring helps (calibration.py)
    "teacher_logits": "auto",
    # class shares from the square roots of the counts: a class's largest holder no longer decides that
    # class alone (option_groups.py, `share_power`; docs/methods/fediod/robustness.md)
    "share_power": 0.5,
}

#: What `preset = "lean"` changes: the student learns only from the G-steps' own batches, kept in a replay
#: pool with the ensemble targets their query already returned, so the sites label nothing else; on a
#: two-class segmentation each site sends one logit per pixel (its margin); on image outputs
#: (reconstruction) the ensemble is the plain mean of the teachers' corrections, so no D_k ratio is sent.
#: Why: on the dense tasks the S-steps' fresh samples were most of what the sites sent; without them the
#: segmentation and reconstruction students kept their quality over three seeds at half the bytes
#: (benchmarks/results/fediod_dense_communication_lean-*.md). On Table 9, whose D_k learn from one volume
#: each, Eq. 8's per-pixel ratios weighed the teachers worse than their mean: the student gained 0.031 and
#: 0.030 SSIM over Eq. 8 on seeds 0 and 1, and on the reconstruction demo (seeds 0-2) moved by at most
#: 0.0006 (benchmarks/results/sweeps/reconstruction_table9_fediod-*.md,
#: benchmarks/results/fediod_dense_communication_uniform-reconstruction.md).
LEAN = {
    "student_steps": 0,
    "pool_generator_batch": True,
    "pool_size": 1000,
    "pool_steps": 2,
    "pixel_logits": "margin",  # only where the task has two classes per pixel (`preset_changes`)
}

#: What the lean preset changes on top where the outputs are images (reconstruction): the teachers' plain
#: mean (see LEAN), half of each target from the image G drew, 16 replay steps per G-step, and the
#: student's learning rate doubled. Why: the server knows the true answer for G's images (`truth_weight`),
#: and replaying costs no message. On Table 9 (brain-t1-sites, seeds 0-2) the student rose from SSIM 0.5559
#: to 0.6405 on average with the truth and the replay steps, chosen at seed 0 by the sites' validation
#: slices over truth weights 0-1 and 2-24 replay steps; it was selected at epochs 20, 19 and 20 of 20,
#: still improving, and a student lr of 2e-3 (validation at seed 0: 0.7022 against 0.6989 at 1e-3,
#: 0.7023 at 3e-3, a tie kept at the smaller step) raised it to 0.6531 (FedAvg: 0.6665)
#: (docs/methods/fediod/per-pixel.md, benchmarks/results/sweeps/reconstruction_table9_fediod-*.md).
LEAN_IMAGE_OUTPUTS = {
    "ensemble_weighting": "uniform",
    "truth_weight": 0.5,
    "pool_steps": 16,
    "lr_student": 2e-3,
}

#: What the lean preset changes on top where the label masks lay out most of G's image (nuclei,
#: `Condition.shapes_the_image`): three quarters of the student's loss against the mask G drew each image
#: from. Why: G must draw what such a mask says to look real, so the mask is the image's label; where
#: the teachers' ensemble calls every pixel a nucleus (Table 4, seed 0) the student then still learns the
#: nuclei. Chosen on the sites' validation splits at seed 0 over weights 0-1; over seeds 0-4 the average
#: Dice rose from 64.78 to 74.86 (docs/methods/fediod/per-pixel.md, "The masks as the truth"). Not on the
#: brain lesions: G draws a brain there whatever the small lesion mask says, and the truth hurt
#: (Table 2, seed 0: 53.63 without, 51.60 at 0.25, 42.65 at 0.5). And a share of G's batch per site, each
#: in that site's colours (`site_looks`): with one look for all, G drew only the H&E-like look and the
#: student never segmented Table 4's fluorescence site (Dice 30.97-31.21 on five seeds); with the looks it
#: did on seeds 2 and 3 (82.44, 81.44) and the average Dice over seeds 0-4 rose from 74.86 to 80.37, for 2-7
#: points on the H&E-like sites at seeds 0, 1 and 4; over seeds 0-9 it found the site on four seeds and
#: averaged 75.77 against 73.07, its worst seed 37.66 against 63.99 (per-pixel.md, "The fluorescence site").
LEAN_MASK_SHAPED_IMAGES = {
    "truth_weight": 0.75,
    "generator_mixture": "per-client",
    "site_looks": True,
    "ensemble_weighting": "owner",
    "use_unique": False,
    "owner_queries": True,
}
#: The keys of `LEAN_MASK_SHAPED_IMAGES` that go with its per-site mixture: a user who names the mixture
#: chooses them too.
PER_SITE_MIXTURE_KEYS = ("site_looks", "ensemble_weighting", "use_unique", "owner_queries")

#: What the lean preset changes on top where a two-class segmentation's masks mark a small part of G's
#: image (lesions): one byte a value for the logits and input-gradients (`wire = "compact8-sqrt"`) and a
#: replay pool of 2,500 of G's samples with 5 replay steps per G-step. Why: on Table 2 (seeds 0-3) the
#: student rose from Dice 41.73 to 51.92 on average, ahead of the old setting and of FedAvg (38.33) on every
#: seed, while the sites sent 0.55 of the old setting's bytes (0.65 of FedAvg's); the larger pool made most
#: of the gain, and the one-byte wire, which had collapsed a seed with the small pool, added to it on three
#: seeds of four (docs/methods/fediod/per-pixel.md, "The lesions' settings"). Not on nuclei, whose default
#: was chosen with `compact` and the small pool.
LEAN_SMALL_MASKS = {"wire": "compact8-sqrt", "pool_size": 2500, "pool_steps": 5}

PRESET_CHANGES = {"paper": {}, "official-code": OFFICIAL_CODE, "stable": STABLE, "lean": LEAN}


def effective_preset(preset: str, *, per_pixel: bool) -> str:
    """The preset a run applies: `"auto"` is `"stable"` on classification and `"lean"` on per-pixel tasks.

    Why: with the paper's settings the student ends far below its ensemble on digits, and the stabilisers
    are measured on classification only; on the dense tasks the lean exchanges halve the bytes."""
    if preset == "auto":
        return "lean" if per_pixel else "stable"
    return preset


def preset_fills_any_task(preset: str) -> dict[str, object]:
    """What `preset` may fill before the task is known: `"auto"` fills the stable preset's keys on
    classification and the lean one's on per-pixel tasks, so either counts until `resolve_options` checks
    the one that applies."""
    lean_extras = {**LEAN_IMAGE_OUTPUTS, **LEAN_MASK_SHAPED_IMAGES}
    if preset == "auto":
        return {**PRESET_CHANGES["stable"], **PRESET_CHANGES["lean"], **lean_extras}
    return {**PRESET_CHANGES[preset], **(lean_extras if preset == "lean" else {})}


def preset_changes(
    preset: str, *, two_class_pixels: bool, image_outputs: bool = False, mask_shapes_images: bool = False
) -> dict[str, object]:
    """The keys `preset` fills: its table, less the lean preset's margin logits where the task has no two
    classes per pixel (classification, reconstruction, multi-class segmentation), plus the lean preset's
    changes for image outputs where the outputs are images (`LEAN_IMAGE_OUTPUTS`), for masks that lay
    out the image where they do (`LEAN_MASK_SHAPED_IMAGES`) and for a two-class segmentation's small
    masks where they do not (`LEAN_SMALL_MASKS`)."""
    changes = dict(PRESET_CHANGES[preset])
    if not two_class_pixels:
        changes.pop("pixel_logits", None)
    if preset != "lean":
        return changes
    if image_outputs:
        changes.update(LEAN_IMAGE_OUTPUTS)
    if mask_shapes_images:
        changes.update(LEAN_MASK_SHAPED_IMAGES)
    elif two_class_pixels:
        changes.update(LEAN_SMALL_MASKS)
    return changes


def resolve_options(
    config: RunConfig,
    options: FedIODOptions,
    *,
    per_pixel: bool,
    two_class_pixels: bool = False,
    image_outputs: bool = False,
    mask_shapes_images: bool = False,
) -> FedIODOptions:
    """Apply the preset's changes to every key the user did not set; `preset` names the one applied.
    `two_class_pixels`: a two-class segmentation (the lean preset's margin logits apply); `image_outputs`:
    the outputs are images, not classes (reconstruction: the lean preset's uniform ensemble applies);
    `mask_shapes_images`: G's masks lay out its images (nuclei: the lean preset's truth weight applies)."""
    preset = effective_preset(options.preset, per_pixel=per_pixel)
    for key in ("student_shift", "student_mixup"):
        if per_pixel and getattr(options, key):
            raise ConfigError(f"fediod.{key} is for classification; this task is per-pixel")
    if options.student_recolour and (not per_pixel or image_outputs):
        raise ConfigError(
            "fediod.student_recolour recolours the student's images under unchanged targets; it is for "
            "segmentation, where a mask does not depend on the colours"
        )
    idle = [k for k in ("student_noise", "student_shift", "student_mixup") if getattr(options, k)]
    if not options.student_steps and idle:
        log.warning("fediod.%s act on S-step samples; with student_steps = 0 there are none", ", ".join(idle))
    if image_outputs and options.teacher_logits not in ("raw", "auto"):
        raise ConfigError(
            f"fediod.teacher_logits = {options.teacher_logits!r} calibrates class logits; this task's "
            "outputs are images, which the ensemble averages as they are (use 'raw')"
        )
    if options.site_looks and (not per_pixel or image_outputs):
        raise ConfigError(
            "fediod.site_looks colours the images a conditional G draws from a mask; it is for segmentation "
            "(on classification G draws from noise, on reconstruction a colour map would change the target)"
        )
    if options.truth_weight and not per_pixel:
        raise ConfigError(
            "fediod.truth_weight teaches the student the label of G's images; on classification G draws "
            "from noise and the server knows no label (only the per-pixel tasks, whose G draws from a mask, "
            "have one)"
        )
    if options.sites_per_step > config.clients:
        raise ConfigError(
            f"fediod.sites_per_step = {options.sites_per_step} exceeds the {config.clients} clients "
            "(0 asks every site)"
        )
    changes = preset_changes(
        preset,
        two_class_pixels=two_class_pixels,
        image_outputs=image_outputs,
        mask_shapes_images=mask_shapes_images,
    )
    if not changes:
        return dataclasses.replace(options, preset=preset)
    explicit = set(config.options.get("fediod", {}))
    taken = {k: v for k, v in changes.items() if k not in explicit}
    if "generator_mixture" in explicit:  # the preset's per-site keys go with its mixture, not a user's
        for key in PER_SITE_MIXTURE_KEYS:
            if key not in explicit:
                taken.pop(key, None)
    mine = config.options.get("fediod", {})
    if (
        mine.get("ensemble_weighting", "owner") != "owner"
        or mine.get("use_unique", False)
        or mine.get("student_steps", 0)
    ):
        taken.pop("owner_queries", None)  # a user's labels, disagreement term or S-steps need every site
    resolved = dataclasses.replace(options, preset=preset, **taken)
    try:  # the preset's keys next to the user's (e.g. its pool_steps with a user's pool_size = 0)
        resolved.validate()
        resolved.check_combinations()
    except ConfigError as error:
        preset_keys = ", ".join(f"{k} = {v!r}" for k, v in taken.items())
        raise ConfigError(f"{error} (fediod.preset = {preset!r} sets {preset_keys})") from error
    return resolved


def resolve_for_task(
    config: RunConfig, options: FedIODOptions, view: TaskView
) -> tuple[FedIODOptions, TaskView]:
    """The options a run applies on `view`'s task (`resolve_options`), and the view with what its sites
    send of their outputs; the server and every site call it alike."""
    resolved = resolve_options(
        config,
        options,
        per_pixel=view.per_pixel,
        two_class_pixels=view.two_class_pixels,
        image_outputs=view.image_outputs,
        mask_shapes_images=view.mask_shapes_images,
    )
    return resolved, view.with_sent_outputs(resolved.ratio_resolution, resolved.pixel_logits)


SMALL_IMAGE_PX = 16


def network_widths(options: FedIODOptions, image_size: int) -> tuple[int, int]:
    """The widths of G and of every D_k: the options', or for 0 (auto) the paper's 64 and 128, except on
    images of at most 16 px (8x8 digits), where 32 and 32 suffice: a G of width 64 and a D_k of 128 there
    cost most of a G-step for samples that the teachers see at 8x8."""
    small = image_size <= SMALL_IMAGE_PX
    return (
        options.generator_width or (32 if small else 64),
        options.discriminator_width or (32 if small else 128),
    )


def teacher_name(options: FedIODOptions, config: RunConfig, client_id: int) -> str:
    """The architecture of client `client_id`'s teacher: `fediod.teachers` cycled over the clients."""
    names = model_cycle(options.teachers, config.model, key="fediod.teachers")
    return names[client_id % len(names)]
