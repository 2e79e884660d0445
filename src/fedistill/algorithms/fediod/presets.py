"""FedIOD's presets: the keys each one fills that a user did not set, with why (`fediod.preset`). The
released code's choices, the stabilisers (the default on classification) and the lean exchanges (the
default on segmentation and reconstruction), with the lean preset's additions per kind of per-pixel task.
"""

from __future__ import annotations

#: What `preset = "official-code"` changes (notes §2.5-2.9): only keys the user did not set. Not G's GAN
#: term's scale: the code sums it over D_k's patches, here it is their mean (`w_gan` = patches restores it).
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
#: (docs/methods/fediod/per-pixel-notes.md, benchmarks/results/sweeps/reconstruction_table9_fediod-*.md).
LEAN_IMAGE_OUTPUTS = {
    "ensemble_weighting": "uniform",
    "truth_weight": 0.5,
    "pool_steps": 16,
    "lr_student": 2e-3,
}

#: What the lean preset changes on top where the label masks lay out most of G's image (nuclei,
#: `Condition.shapes_the_image`): three quarters of the student's loss against the mask G drew each image
#: from. Why: G must draw what such a mask says to look real, so the mask is the image's label; where the
#: teachers' ensemble calls every pixel a nucleus (Table 4, seed 0) the student then still learns the nuclei.
#: Chosen on the sites' validation splits at seed 0 over weights 0-1; over seeds 0-4 the average Dice rose
#: from 64.78 to 74.86 (docs/methods/fediod/per-pixel-notes.md, "The masks as the truth"). Not on the brain
#: lesions: G draws a brain there whatever the small lesion mask says, and the truth hurt (Table 2, seed 0:
#: 53.63 without, 51.60 at 0.25, 42.65 at 0.5). And a share of G's batch per site, each in that site's colours
#: (`site_looks`): with one look for all, G drew only the H&E-like look and the student never segmented Table
#: 4's fluorescence site (Dice 30.97-31.21 on five seeds); with the looks it did on seeds 2 and 3 (82.44,
#: 81.44) and the average Dice over seeds 0-4 rose from 74.86 to 80.37, for 2-7 points on the H&E-like sites
#: at seeds 0, 1 and 4; over seeds 0-9 it found the site on four seeds and averaged 75.77 against 73.07, its
#: worst seed 37.66 against 63.99 (per-pixel-notes.md, "The fluorescence site, found by the default"). And
#: each sample labelled by its own site's teacher, which alone is asked about it (`owner_queries`, with owner
#: labels and no disagreement term): over seeds 0-9 the average Dice rose from 75.77 to 80.79 (worst seed
#: 58.07, eight seeds up) while the sites sent 128.1 MB instead of 327.0, 0.73 of FedAvg's
#: (per-pixel-notes.md, "Each site asked about its own samples only"). And half the adversarial weight: under
#: owner labels one teacher's logits stand against the student, and at 0.2 G's adversarial term drove L_mimic
#: to 589 and 71 on seeds 3 and 5 as every D_k won; chosen at 0.1 on the sites' validation splits (mean best
#: validation Dice over seeds 0-9: 83.42 against 78.01), the test Dice rose from 80.79 to 86.61 on average,
#: its worst seed from 58.07 to 71.26. And a trial of each site's colours the other way round at the start of
#: each epoch (`look_trials`, 4 G-steps): a map learnt by gradient could stop at dark nuclei on a dark ground
#: for the fluorescence site; the site's own teacher judges which way finds G's masks. Over seeds 0-9 the mean
#: best validation Dice rose from 83.42 to 87.63 (4 G-steps fixed beforehand, nothing tuned), the test Dice
#: from 86.61 to 90.45 (median 88.40 to 95.14, worst seed 71.26 to 74.90, eight seeds up), the fluorescence
#: site's from 68.68 to 80.58, at the same bytes (per-pixel-notes.md, "Each site's colours tried both ways").
#: And five times the discriminators' weight in G's loss (`w_gan`): at 1 the seeds that missed the
#: fluorescence site (3, 7, 9) were those where every D_k won (its loss fell to 0.07-0.15), and G kept a look
#: no real image has (seed 7: a red ground where the site's is black). Over seeds 0-9 at 1 / 3 / 5 the mean
#: best validation Dice was 87.63 / 89.54 / 89.58 (the choice; 3 and 5 nearly tie), the test Dice 90.45 /
#: 91.45 / 91.98 and the fluorescence site's 80.58 / 88.74 / 87.06, its worst seed 30.99 / 84.36 / 75.79; the
#: worst seed's average fell from 74.90 to 70.31 (seed 3) and the median from 95.14 to 94.32, at the same
#: bytes (per-pixel-notes.md, "The discriminators' weight").
LEAN_MASK_SHAPED_IMAGES = {
    "truth_weight": 0.75,
    "generator_mixture": "per-client",
    "site_looks": True,
    "ensemble_weighting": "owner",
    "use_unique": False,
    "owner_queries": True,
    "w_adv": 0.1,
    "look_trials": 4,
    "w_gan": 5.0,
}
#: The keys of `LEAN_MASK_SHAPED_IMAGES` that go with its per-site mixture: a user who names the mixture
#: chooses them too.
PER_SITE_MIXTURE_KEYS = (
    "site_looks",
    "ensemble_weighting",
    "use_unique",
    "owner_queries",
    "w_adv",
    "look_trials",
)

#: What the lean preset changes on top where a two-class segmentation's masks mark a small part of G's
#: image (lesions): one byte a value for the logits and input-gradients (`wire = "compact8-sqrt"`) and a
#: replay pool of 2,500 of G's samples with 5 replay steps per G-step. Why: on Table 2 (seeds 0-3) the
#: student rose from Dice 41.73 to 51.92 on average, ahead of the old setting and of FedAvg (38.33) on every
#: seed, while the sites sent 0.55 of the old setting's bytes (0.65 of FedAvg's); the larger pool made most
#: of the gain, and the one-byte wire, which had collapsed a seed with the small pool, added to it on three
#: seeds of four (docs/methods/fediod/per-pixel-notes.md, "The lesions' settings").
#: Not on nuclei, whose default was chosen with `compact` and the small pool.
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
