"""FedIOD's options: the paper's settings, the released code's preset, the stabilisers (the default on
classification) and the lean exchanges (the default on segmentation and reconstruction)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from fedistill.algorithms.base import model_cycle
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
from fedistill.algorithms.fediod.paper_options import PaperPerPixelOptions, check_paper_per_pixel
from fedistill.algorithms.fediod.presets import (
    PER_SITE_MIXTURE_KEYS,
    effective_preset,
    preset_changes,
    preset_fills_any_task,
)
from fedistill.algorithms.fediod.wire import WIRES
from fedistill.algorithms.shared.option_checks import (
    check_choices,
    check_iters_per_epoch,
    check_model_names,
    check_nonnegative,
)
from fedistill.algorithms.shared.schedules import cosine_lr, set_lr  # noqa: F401  (FedIOD's own names)
from fedistill.algorithms.shared.weight_average import COMBINES
from fedistill.config import RunConfig
from fedistill.errors import ConfigError
from fedistill.models.generator import check_upsamples

if TYPE_CHECKING:
    from fedistill.algorithms.fediod.task_view import TaskView
    from fedistill.data.base import DatasetInfo
    from fedistill.tasks import Task

log = logging.getLogger(__name__)


PRESETS = ("auto", "paper", "official-code", "stable", "lean")
WEIGHTINGS = ("eq8", "class-share", "uniform", "owner")
MIMIC_MODES = ("l2", "kl", "kl-official", "l1")
SELECTIONS = ("validation", "last", "best-on-test")
DP_ACCOUNTINGS = ("d-step", "release")

PER_PIXEL_KEYS = ("generator_blocks", "noise_channels", "discriminator_layers", "mask_source", "mask_pool",
                  "w_perceptual", "ratio_resolution")  # fmt: skip
"""Keys only the per-pixel tasks' conditional G, D_k and mask uploads read (refused on classification)."""
NONNEGATIVE_KEYS = ("generator_width", "discriminator_width", "pool_size", "pool_steps", "pool_batch_size",
                    "student_noise", "student_shift", "student_mixup", "collapse_patience", "mask_pool",
                    "noise_channels", "reference_samples", "samples_every", "sites_per_step", "student_steps",
                    "look_trials")  # fmt: skip
"""Widths, sizes, counts and shares for which 0 means "none" or "auto": >= 0."""


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
    PaperPerPixelOptions,
    PrivacyOptions,
    RobustnessOptions,
):
    """Every FedIOD key, flat (`fediod.w_adv`, `options.w_adv`); each group's docstrings are in
    option_groups.py. Every key's default is the paper's unless its docstring says otherwise; the default
    `preset = "auto"` then applies presets.py's `STABLE` (the stabilisers) to the keys a user did not set on
    classification, and `LEAN` (the student learns from G's own batches, no extra labelling) on
    segmentation and reconstruction. `preset = "paper"` keeps the paper's settings everywhere,
    `"official-code"` takes the released code's choices, `"stable"` the stabilisers on any task, `"lean"`
    the lean exchanges on any task. The ``dp_*`` options (`DPOptions`) sanitise the input-gradients.
    """

    #: The options that name models (`check_model_names`; the run checks each serves its task)
    model_keys: ClassVar[str] = "teachers student"
    section: ClassVar[str] = "fediod"  # the config table, which shared checks name (`validate_dp`)

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
            "label_shares": ("counts", "frequencies"),
        }
        check_choices("fediod", self, choices)
        self.validate_paper_per_pixel()
        check_model_names("fediod", self, self.model_keys)
        if self.selection == "best-on-test" and self.preset != "official-code":
            raise ConfigError(
                "fediod.selection = 'best-on-test' selects on the test set; it exists only to reproduce the "
                "released code (set fediod.preset = 'official-code')"
            )
        check_iters_per_epoch("fediod", self.iters_per_epoch)
        for key in (
            "teacher_epochs",
            "synthetic_batch_size",
            "latent_dim",
            "generator_blocks",
            "discriminator_layers",
        ):
            if getattr(self, key) < 1:
                raise ConfigError(f"fediod.{key} must be >= 1")
        if self.synthetic_batch_size < 2:  # G, D_k and S train on batch statistics
            raise ConfigError(
                f"fediod.synthetic_batch_size must be >= 2 (BatchNorm needs two samples), got "
                f"{self.synthetic_batch_size}"
            )
        if self.pool_batch_size == 1:  # the replay steps train S on batch statistics too
            raise ConfigError("fediod.pool_batch_size must be 0 (the synthetic batch's size) or >= 2, got 1")
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
        if not 0.0 <= self.look_trial_margin < 1.0:
            margin = self.look_trial_margin
            raise ConfigError(f"fediod.look_trial_margin is a Dice margin in [0, 1); got {margin}")
        if not 0.0 <= self.student_ema < 1.0:
            raise ConfigError(f"fediod.student_ema is a decay in [0, 1); got {self.student_ema}")
        if not 0.0 <= self.collapse_share <= 1.0:
            raise ConfigError(f"fediod.collapse_share is a share in [0, 1]; got {self.collapse_share}")
        # a negative weight would flip a term of G's loss (the sign of each is the paper's), NaN poison it
        check_nonnegative("fediod", self, "w_gan w_conf w_unique w_adv w_balance w_bn w_perceptual")
        for key in NONNEGATIVE_KEYS:
            if getattr(self, key) < 0:
                raise ConfigError(f"fediod.{key} must be >= 0, got {getattr(self, key)!r}")
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
        if self.look_trials and not (self.site_looks or filled.get("site_looks", False)):
            raise ConfigError(
                "fediod.look_trials tries each site's colour map the other way round: set "
                "fediod.site_looks = true (with fediod.generator_mixture = 'per-client') too"
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
        batchwise = [mode for mode in values("teacher_logits") if mode in ("centred", "scaled")]
        if batchwise:
            # centring and scaling take a teacher's statistics over the batch it labelled: under owner
            # queries that is its own share only (a site owning one sample would centre it to zero); "auto"
            # stays raw under them (server.py)
            raise ConfigError(
                f"fediod.owner_queries asks each site about its own samples only, so teacher_logits = "
                f"{batchwise[0]!r} would calibrate each teacher over its own share of G's batch, not the "
                "whole batch: set fediod.teacher_logits = 'raw' or 'log-probabilities'"
            )
        if all(values("student_steps")):
            raise ConfigError(
                "fediod.owner_queries leaves the S-steps' fresh samples unlabelled by the other sites: set "
                "fediod.student_steps = 0 (the student learns from G's batches in the replay pool: "
                "fediod.pool_generator_batch = true, fediod.pool_steps > 0)"
            )

    def check_run(self, config: RunConfig) -> None:
        """What the options rule out with the run's common keys, checked before the run writes anything."""
        by_preset = self.preset == "official-code" and "selection" not in config.options.get("fediod", {})
        if self.selection == "validation" and not by_preset and config.val_fraction == 0:
            raise ConfigError(
                "fediod.selection = 'validation' needs validation splits: set val_fraction > 0 "
                "or fediod.selection = 'last'"
            )

    def check_task(self, config: RunConfig, task: Task, info: DatasetInfo) -> None:
        """What the options rule out on the dataset's task (`resolve_for_task`), before the run writes."""
        from fedistill.algorithms.fediod.task_view import TaskView

        resolve_for_task(config, self, TaskView(task, info, config.seed))

    @property
    def needs_label_counts(self) -> bool:
        """Whether the ensemble weighting needs each site's class counts from stage 1."""
        return self.ensemble_weighting in ("eq8", "class-share", "owner")


def _check_image_outputs(options: FedIODOptions) -> None:
    """Refuse what compares softmaxes on image outputs (reconstruction): one column a pixel, whose softmax is
    1 everywhere, so the term would be 0 whatever the outputs are."""
    if options.mimic in ("kl", "kl-official"):
        raise ConfigError(
            f"fediod.mimic = {options.mimic!r} compares softmaxes of the outputs; this task's outputs are "
            "images, one value a pixel, whose softmax is 1 everywhere, so L_mimic would be 0 and the "
            "student would learn nothing: use 'l2' or 'l1'"
        )
    if options.ensemble_combine != "mean":
        raise ConfigError(
            f"fediod.ensemble_combine = {options.ensemble_combine!r} combines the sites' probabilities; this "
            "task's outputs are images, one value a pixel, whose softmax is 1 everywhere, so every target "
            "would be 0: use 'mean'"
        )


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
    explicit = set(config.options.get("fediod", {}))
    for key in ("latent_dim", "generator_upsamples"):
        if per_pixel and key in explicit:
            raise ConfigError(
                f"fediod.{key} shapes the generator of classification, which draws from noise; on a "
                "per-pixel task G is pix2pix's ResNet generator on the mask (fediod.generator_width, "
                "generator_blocks, noise_channels): remove it"
            )
    # a weight or pool size changed from its default (a ready config may name the defaults, and switching
    # its mask source alone must still run)
    defaults = FedIODOptions()
    unused = [
        k
        for k in ("w_perceptual", "mask_pool")
        if k in explicit and getattr(options, k) and getattr(options, k) != getattr(defaults, k)
    ]
    # the conditional networks and the mask uploads of the per-pixel tasks (a ready config may name defaults)
    conditional = [k for k in PER_PIXEL_KEYS if k in explicit and getattr(options, k) != getattr(defaults, k)]
    if not per_pixel and conditional:
        raise ConfigError(
            f"fediod.{conditional[0]} = {getattr(options, conditional[0])!r} shapes a per-pixel task's "
            "conditional G, D_k or mask uploads; on classification G draws from noise and D_k is the "
            "unconditional patch discriminator: remove it"
        )
    if per_pixel and options.mask_source == "prior" and unused:
        raise ConfigError(
            f"fediod.{unused[0]} works on the masks the sites upload, and with fediod.mask_source = 'prior' "
            "no site uploads any: remove it, or set fediod.mask_source = 'clients'"
        )
    if per_pixel and options.collapse_patience:
        raise ConfigError(
            "fediod.collapse_patience stops a run whose G draws one class for most of its samples, a share "
            "measured on classification only; on a per-pixel task G draws from masks and the check would "
            "never stop the run: set it to 0"
        )
    if image_outputs:
        _check_image_outputs(options)
    check_paper_per_pixel(options, per_pixel=per_pixel, image_outputs=image_outputs)
    if options.owner_queries and image_outputs:
        raise ConfigError(
            "fediod.owner_queries sends each site only its rows of G's batch, and a reconstruction's "
            "undersampling masks are numbered by position in the whole batch, so a site would undersample "
            "its rows with other rows' masks; use it on classification or segmentation"
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
    taken = {k: v for k, v in changes.items() if k not in explicit}
    if "generator_mixture" in explicit:  # the preset's per-site keys go with its mixture, not a user's
        for key in PER_SITE_MIXTURE_KEYS:
            if key not in explicit:
                taken.pop(key, None)
    nets = [key for key in ("teachers", "student") if key in taken]
    if per_pixel and nets:  # the released code's wide ResNet-8: a classifier
        raise ConfigError(
            f"fediod.preset = {preset!r} sets {', '.join(f'fediod.{key}' for key in nets)} = "
            f"{taken[nets[0]]!r}, the released code's classification net; on a per-pixel task set "
            f"{' and '.join(f'fediod.{key}' for key in nets)} to a model of the task too, or take the "
            "'paper' or 'lean' preset"
        )
    resolved = dataclasses.replace(options, preset=preset, **taken)
    if "owner_queries" in taken:  # a user's labels, disagreement term or S-steps need every site asked
        try:
            resolved._check_owner_queries({})
        except ConfigError:
            del taken["owner_queries"]
            resolved = dataclasses.replace(resolved, owner_queries=options.owner_queries)
    try:  # the preset's keys next to the user's (e.g. its pool_steps with a user's pool_size = 0)
        resolved.validate()
        resolved.check_combinations()
        if image_outputs:  # e.g. the stable preset's mimic = "kl" on a reconstruction
            _check_image_outputs(resolved)
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
    if view.conditional:  # D_k is built at a site's first G-step: a bad depth would stop the run there
        from fedistill.models.pix2pix import patch_min_size

        smallest = patch_min_size(resolved.discriminator_layers)
        if view.info.image_size < smallest:
            raise ConfigError(
                f"fediod.discriminator_layers = {resolved.discriminator_layers} makes a patch discriminator "
                f"that needs images of at least {smallest}x{smallest}; {view.info.name}'s are "
                f"{view.info.image_size}x{view.info.image_size}: take fewer layers"
            )
    view = view.with_condition(resolved.reconstruction_condition)
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
