"""FedIOD's options, one frozen dataclass per concern. `FedIODOptions` (options.py) inherits them all, so
every key stays flat: `fediod.w_adv` in a config, `options.w_adv` in code.

Defaults are the paper's unless a docstring names another source; `preset` then fills some keys a user
did not set (presets.py `STABLE`, `OFFICIAL_CODE`). The measurements behind the defaults are in
docs/results/tuning-history.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedistill.privacy.budget import DPOptions

RATIO_RESOLUTIONS = ("pixel", "patch")
"""The values of `ratio_resolution`."""


@dataclass(frozen=True)
class ProtocolOptions:
    """How a run goes: the preset, the shape of an epoch, the exchanges, model selection and bookkeeping."""

    preset: str = "auto"
    """Which settings fill the keys a user did not set: auto (default: stable on classification, lean on
    per-pixel tasks) | paper | official-code (the released code's) | stable (the stabilisers on any task) |
    lean (S learns from G's own batches in a replay pool, so sites label nothing else; margin logits on a
    two-class segmentation). Why: the paper's settings leave the student far below its ensemble on
    classification, and on the dense tasks the lean exchanges keep the student at half the bytes."""

    synthetic_batch_size: int = 64
    """Samples G draws per G-step, and each client's real batch for its D_k; default 64. Named apart from
    the common `batch_size`, which an algorithm table overrides for local training (here, stage 1)."""

    iters_per_epoch: int | str = "max"
    """G-steps per distillation epoch: max | min over the clients of ceil(n_k / batch), or a number;
    default max, the paper's one pass over the largest site's data."""

    merge_student_queries: bool = True
    """Carry step t's S-step inputs in step t+1's `query.generate` (clients answer them before their
    D-step); default true. Why: the same arithmetic with 2 instead of 3 exchanges per G-step, plus one per
    epoch (with `sites_per_step`, step t+1's sites label them, not step t's: the same in distribution)."""

    schedule: str = "cosine"
    """Learning rates of G, D_k and S over the run: cosine (default, the paper's: down to 0) | constant."""

    selection: str = "validation"
    """Which student is handed over: validation (default: the best on the clients' validation splits) |
    last | best-on-test (only with the official-code preset, to reproduce the released code)."""

    collapse_share: float = 0.5
    """Warn when one class takes more than this share of G's samples; default 0.5. Why: a collapsed G
    teaches the student one class."""

    collapse_patience: int = 0
    """> 0: after this many epochs in a row with a collapsed G, stop cleanly with the best validated
    student; default 0, warn only; classification only. Why: the remaining epochs would be on one class."""

    samples_every: int = 1
    """Save a grid of synthetic samples every N epochs (0: never); default 1."""

    reference_samples: int = 0
    """Test samples the ensemble's ceiling is measured on; default 0: all."""

    sites_per_step: int = 0
    """Sites each G-step asks (its `query.generate` and `query.backprop`, and the S-step targets that ride
    along): a subset of this many, drawn per step from the server's seeded generator, with the weights
    (pi, Eq. 8's class shares) renormalised over it; default 0: every site, the paper's protocol. Why:
    at 1,000 sites a G-step that asks every site holds every site's graph and replies at once; sampled,
    a step's memory and time grow with the sites asked, not with the federation."""

    owner_queries: bool = False
    """With the per-client G and owner labels (`ensemble_weighting = "owner"`): each site is sent only the
    samples G drew for it, and answers (its D-step, logits and input-gradients) only for them; default
    false: every site answers for the whole batch. Why: under owner labels a sample's target is its owner's
    teacher's, and a site's own terms (L_gan, L_conf, the perceptual term) already see its own samples
    only, so the other sites' answers on it fed only the disagreement term (refused here) and each
    teacher's class balance (taken over its own samples here); asking the owner alone moves about 1/K of
    the G-step's bytes. A sample whose owner does not answer is left out of the step. On Table 4 (nuclei,
    seeds 0-9) the sites sent 128.1 MB instead of 327.0 and the average Dice rose from 75.77 to 80.79 (86.61
    with `w_adv = 0.1`); the lean preset takes both there (docs/methods/fediod/per-pixel-notes.md)."""

    recompute_graphs: bool = False
    """A site drops the graph of its G-step terms once it has answered `query.generate` and recomputes it
    (one more forward pass through T_k and D_k) when `query.backprop` arrives; default false: it keeps the
    graph. Why: between the two queries every asked site holds that graph, and a step that asks a thousand
    sites in one process holds a thousand; recomputed, each holds only its inputs. The gradient is the
    same bit for bit (D_k's BatchNorm runs on batch statistics)."""

    sites_together: bool = False
    """In-process, the same-architecture sites answer a G-step in one batched call (`torch.func.vmap`
    over their stacked T_k and D_k) instead of one after another; each site's messages, ledger rows and
    state stay its own, equal to answering alone up to float rounding (sites_together.py). Default false.
    Applies to classification without DP, the per-client mixture or `recompute_graphs`; other runs, and
    Flower, answer one site at a time. Why: K sites' small batches one after another leave an accelerator
    mostly idle; on a CPU, where the sites' convolutions are compute-bound, it is no faster (2-core CPU,
    K = 10: 0.83x at one thread, 1.02x at two; benchmarks/results/fediod_sites_together.md)."""

    wire: str = "compact"
    """How stage 2's exchanges cross the wire (wire.py): compact (default: synthetic images as 8 bits over
    each tensor's range; two-class label masks as one bit a pixel, exact; logits, discriminator outputs
    and gradients as float16 under a per-tensor power-of-two scale) | float32 (every array as computed, as
    runs before compact became the default) | compact8 (compact, with the sites' logits and
    input-gradients as `int8-symmetric`, one byte a value) | compact8-gradients (compact, with only the
    input-gradients as `int8-symmetric`) | compact8-sqrt (compact8, with the logits on the square-root
    grid `int8-sqrt`, finest near zero). Every wire but float32 also sends evaluation as float16 under a
    per-tensor scale: the student the sites validate and the teachers' outputs on the test images
    (wire.py, `EVALUATION`). Why: compact moves 38% of float32's bytes on the digits demo with the student
    within noise over six paired seeds (benchmarks/results/fediod_wire_encodings.md), and 53% / 47% of
    them on the segmentation and reconstruction demos at the same Dice and SSIM
    (fediod_dense_communication.md). compact8 halves the sites' bytes again with the student within noise
    on the digits demo and Table 9, but cost the brain-lesion student of Table 2 about 14 Dice points on
    three seeds (one logit per pixel loses its fine steps on one byte); compact8-gradients moved it by
    -4.7, +8.1 and -15.3 points and compact8-sqrt by +1.5, +6.3, -25.0 (that seed collapsed) and -0.7 on
    four seeds, not settled either way (docs/methods/fediod/per-pixel-notes.md, "One byte a value"). With a
    replay pool of 2,500 and 5 replay steps compact8-sqrt moved the same four seeds by -1.8, +9.3, +3.2
    and +9.9, and the lean preset takes it on a two-class segmentation with small masks (lesions:
    presets.py, `LEAN_SMALL_MASKS`)."""

    channels_last: bool = True
    """Stage 2's convolutions (T_k after stage 1, D_k, G, S) in channels-last memory layout: the same
    arithmetic in another order; default true. Why: a G-step runs markedly faster on CPU (max-pooling and
    small convolutions gain most). false: the default layout, as runs before it."""


@dataclass(frozen=True)
class TeacherOptions:
    """Stage 1, the local teachers T_k, and how their outputs form the ensemble."""

    teachers: str = ""
    """The teachers' architecture: one model name for all clients, or a comma list cycled over the
    clients; default "": the run's `model`."""

    teacher_epochs: int = 30
    """Stage 1: each teacher's local epochs (the common lr, batch, optimizer); default 30 (the paper: 500)."""

    ensemble_weighting: str = "eq8"
    """The teachers' weights in the ensemble: eq8 (default, the paper's Eq. 8) | class-share (the released
    code's) | uniform (the paper's Table 6 ablation) | owner (with the per-client G: each sample labelled
    by the teacher of the site G drew it for, the class shares where that site was not asked; Eq. 8's
    density ratios estimate which site a sample belongs to, and the per-client G knows it)."""

    share_power: float = 1.0
    """The power the class counts are raised to before they become the class shares that weigh the
    teachers per class (Eq. 8, class-share, owner): n_kc^p / sum_j n_jc^p; default 1, the paper's shares
    (the stable preset sets 0.5).
    Why 0.5 (square roots): with shares proportional to the counts, the site holding most of a class decides
    that class's logit alone, and its teacher, which never saw the neighbouring classes, claims them too;
    square roots let the class's smaller holders temper it (Fashion-MNIST, Dirichlet 0.1, K = 10: the
    class-share ensemble 80.75 / 74.83 / 79.53% on seeds 0 / 1 / 2 becomes 83.19 / 79.94 / 82.19%)."""

    label_shares: str = "counts"
    """What Eq. 8's label term compares, per class c: counts (default) | frequencies. The paper writes the
    term as E|y'_k = c| / E_k|y'_k = c|, "acquired by ... the number of samples from class c used to train
    the model at the local node k", and says it "corresponds to P_Y'k(y) / P_Y'(y)". counts reads the first:
    n_kc / sum_j n_jc, site k's share of all class-c samples (the released code's class shares too).
    frequencies reads the second: (n_kc / n_k) / sum_j (n_jc / n_j), the class's frequency at site k against
    the others'. After the normalisation over the sites the two differ by the site's size: counts weigh a
    large site more where two sites hold a class equally often, frequencies weigh them alike."""

    teacher_logits: str = "raw"
    """The teachers' logits before the ensemble (calibration.py): raw (default, the paper) | scaled (mixed
    architectures) | centred (one-class sites) | log-probabilities (each teacher's log-softmax: the ensemble
    becomes a weighted product of probabilities; on the wide ResNet-8 the setting to use, on LeNet-5 and
    the digits demo a loss: docs/methods/fediod/options.md) | auto (centred if any site saw a single
    class)."""


@dataclass(frozen=True)
class GeneratorOptions:
    """The generator G: its network, its rate and what it draws from."""

    latent_dim: int = 100
    """Length of G's latent z; default 100. Classification only (refused on the per-pixel tasks, whose G
    draws from a mask), as is `generator_upsamples`."""

    generator_width: int = 0
    """G's width; default 0 (auto): the paper's 64, or 32 on images up to 16 px (`network_widths`). Why: on
    8x8 digits a wider G costs most of a G-step for samples the teachers see at 8x8."""

    generator_upsamples: int | str = "auto"
    """G builds its image at image_size / 2**n and then upsamples it n times: 0, 1, 2 (the paper) or auto
    (default), the paper's 2 unless its base grid would be under 4 px (`generator.resolve_upsamples`).
    Why: the paper's 2x2 grid on 8x8 digits limited the student."""

    lr_generator: float = 1e-3
    """G's learning rate (Adam, cosine from it to 0, as the paper's for G, D_k and S); default 1e-3."""

    generator_mixture: str = "shared"
    """shared (default, the paper): one G whose every sample must fool every D_k (Eq. 2), which pulls G
    towards what all sites' data have in common. per-client: G(z, one-hot k) draws a mixture, a share
    pi_k of each batch meant for site k; D_k, its L_gan, L_conf and batch-norm terms see only those
    samples, so the mixture approximates the union of the sites' data, sum_k pi_k P_k. Every teacher
    still labels every sample (unless `owner_queries`). Each client receives which samples are its own
    (a 0/1 vector); nothing else changes. On per-pixel tasks each mask already belongs to a site; per-
    client adds that site's one-hot as constant planes to G's mask condition. The lean preset takes
    per-client, with `site_looks`, owner labels and `owner_queries`, where the masks lay out the image
    (nuclei)."""

    site_looks: bool = False
    """With the per-client mixture on a per-pixel task: G draws every image from its mask alone, through one
    net, and a site's images come out through that site's own colour map (a C x C matrix and an offset on
    the image, the identity at first), so the sites share what a mask says and differ only in colours. Why:
    with the site as input planes G drew the fluorescence nuclei site of Table 4 as a dark image with no or
    faint nuclei, while its H&E-like sites' images followed the masks; a colour map can turn the H&E-like
    rendering of a mask into that site's look. Default false; the lean preset sets it, with per-client,
    where the masks lay out the image (nuclei: on Table 4 the student found the fluorescence site on four
    seeds of ten, where it never had, and the mean Dice rose from 73.07 to 75.77; options.py)."""

    look_trials: int = 0
    """With `site_looks`: the first this many G-steps of each epoch are a trial in which every other sample
    of each site's share is shown with its contrast flipped about the share's mean colour; a site whose own
    teacher finds the masks' foreground better in the flipped half (Dice against the masks G drew from)
    gets its colour map flipped for good (look_trials.py). Why: a map learnt by gradient from the
    H&E-like rendering can stop at dark nuclei on a dark ground for a fluorescence site, since turning
    the nuclei brighter passes through images with none visible. Default 0 (no trials)."""

    look_trial_margin: float = 0.0
    """How much higher (Dice, 0-1) the flipped half must score for a trial to flip a site's map; 0: any
    win flips it. A margin keeps a map whose teacher finds little either way from flipping back and forth,
    but on Table 4 0.05 lost the fluorescence site on two seeds of ten, whose right flips came early on small
    margins (per-pixel-notes.md)."""


@dataclass(frozen=True)
class GeneratorLossOptions:
    """The terms of G's loss (the paper's Eq. 2-11) and the released code's class-balance term."""

    gan_weighting: str = "pi"
    """How the sites' GAN terms are weighed: pi (default, Eq. 2) | average (Table 6 ablation)."""

    gan_loss: str = "non-saturating"
    """G's GAN loss: non-saturating (default) | minimax."""

    use_conf: bool = True
    """Include L_conf (Eq. 3: every teacher confident on G's samples); default true."""

    use_unique: bool = True
    """Include the disagreement term (`js`); default true."""

    js: str = "paper"
    """The disagreement term: paper (default, -JSD, Eq. 4-5) | official (the released code's
    + (1/K) sum KL(M || P_k), clamped)."""

    w_gan: float = 1.0
    """Weight of L_gan; default 1 (Eq. 11). The lean preset takes 5 on nuclei, where at 1 the sites'
    discriminators won where the fluorescence site was missed (docs/methods/fediod/per-pixel-notes.md)."""

    w_conf: float = 1.0
    """Weight of L_conf; default 1 (Eq. 11)."""

    w_unique: float = 1.0
    """Weight of the disagreement term; default 1 (Eq. 11)."""

    w_adv: float = 0.2
    """Weight of -L_mimic in G's loss (G searches inputs where S lags); default 0.2, where Eq. 11 weighs it
    1. Why: at 1 and without the balance term G collapsed onto one or two classes on digits and S stayed at
    chance. `w_adv = 1, w_balance = 0` gives the paper's literal weights. The lean preset takes 0.1 with owner
    labels on nuclei, where one teacher's logits stand against S and at 0.2 G diverged on two seeds of ten
    (docs/methods/fediod/per-pixel-notes.md)."""

    w_balance: float = 10.0
    """Weight of the released code's class-balance term (not in the paper); default 10, the code's. Why: with
    it and `w_adv = 0.2` every class stayed covered on digits."""

    balance: str = "teachers"
    """Whose class marginal the balance term evens out: teachers (default, the released code's: each
    teacher's) | ensemble (the weighted ensemble's, Eq. 9; the stable preset's). Why: the code's choice;
    the ensemble's did better on digits with the stable preset's rates."""


@dataclass(frozen=True)
class DiscriminatorOptions:
    """The discriminators D_k, one per client."""

    discriminator_width: int = 0
    """Every D_k's width; default 0 (auto): the paper's 128, or 32 on images up to 16 px
    (`network_widths`)."""

    lr_discriminator: float = 2e-4
    """Every D_k's learning rate (Adam); default 2e-4, below the paper's 1e-3. Why: 1e-3 lets every D_k
    win within an epoch on small data."""


@dataclass(frozen=True)
class StudentOptions:
    """The student S: its network, its optimiser and how it imitates the ensemble."""

    student: str = ""
    """The student's architecture; default "": the run's `model`."""

    student_steps: int = 5
    """S-steps per G-step on fresh samples the sites label (`query.student`); default 5, the released
    code's. 0: none, the student learns only from the G-steps' own batches in the replay pool
    (`pool_generator_batch`, `pool_steps`), so no site labels anything beyond G's batch."""

    lr_student: float = 1e-3
    """S's learning rate; default 1e-3, the paper's."""

    student_optimizer: str = "adam"
    """adam (default, the paper's) | sgd (momentum 0.9, weight decay 3e-5, as the released code)."""

    mimic: str = "l2"
    """How S imitates the ensemble (L_mimic): l2 (default, tau -> infinity, Eq. 10) | kl (temperature
    `tau`) | kl-official | l1."""

    tau: float = 1.0
    """Softmax temperature of `mimic = "kl"` and of G's L_conf and disagreement terms; default 1."""


@dataclass(frozen=True)
class StabiliserOptions:
    """Stabilisers from the one-shot literature, all off by default (the paper); the stable preset turns
    on batch-norm matching and the replay pool."""

    w_bn: float = 0.0
    """Weight of DeepInversion batch-norm statistic matching on each teacher (bn_matching.py); default 0.
    Why: it keeps G's samples on statistics the teachers saw (the stable preset sets 10)."""

    pool_size: int = 0
    """Synthetic samples kept with their ensemble targets for replay; default 0: no pool. Why: replayed
    samples train S again without another query to the clients."""

    pool_steps: int = 0
    """Extra S-steps per G-step on batches drawn from the pool; default 0."""

    pool_batch_size: int = 0
    """Samples per replay step; default 0: `synthetic_batch_size`."""

    pool_generator_batch: bool = False
    """Also pool the G-step's own batch, with the ensemble targets its query already returned; default
    false: only the S-steps' samples. Why: more distinct labelled samples at no extra query."""

    student_noise: float = 0.0
    """Std of Gaussian noise on G's samples for the S-steps (in units of the data's std); default 0. Why
    off: it helps on 8x8 digits and hurts on MNIST and Fashion-MNIST."""

    student_shift: int = 0
    """Before the clients label them for the S-steps, move G's samples by a random offset of up to this
    many pixels each way (edges repeated); classification only; default 0. Why off: see `student_mixup`."""

    student_mixup: float = 0.0
    """Then mix them in pairs with a Beta(a, a) weight, a = this; classification only; default 0. Why off:
    with a shift of 1 it gained only on the digits setting it was chosen on."""

    student_recolour: float = 0.0
    """Segmentation: the share of the student's training images shown in a random new look (channels
    shuffled, per-channel contrast and offset, half of them inverted; `random_recolour`), targets kept;
    default 0. Why: a mask does not depend on the stain, and G draws only the looks the teachers made it
    draw, so a student that learns the shapes under many looks can reach a site whose look G missed."""

    student_ema: float = 0.0
    """> 0: the student that is validated, selected and handed over is an exponential moving average of
    the trained student's weights, with this decay per S-step; default 0, the trained student itself. Why
    off: the student plateaus early and the average plateaus with it."""


@dataclass(frozen=True)
class PerPixelTaskOptions:
    """Per-pixel tasks (segmentation, reconstruction; task_view.py): G is pix2pix's ResNet generator on the
    one-hot label mask (plus `noise_channels` of seeded noise), D_k the conditional PatchGAN."""

    mask_source: str = "clients"
    """Where G's masks come from: clients (default; AsynDGAN and the paper: masks cross, kind label-masks)
    | prior."""

    mask_pool: int = 0
    """Masks a site uploads once; default 0: all of its training masks (refused with mask_source prior)."""

    generator_blocks: int = 9
    """ResNet blocks of the conditional G; default 9, the paper's."""

    noise_channels: int = 2
    """Channels of seeded noise next to the one-hot mask; default 2. Why: pix2pix's dropout noise is not
    seeded."""

    discriminator_layers: int = 3
    """Layers of the conditional PatchGAN; default 3, the 70 x 70 PatchGAN."""

    w_perceptual: float = 1.0
    """Weight of the perceptual term the paper adds to L_gan (Johnson et al.): features of the site's own
    T_k encoder, between G(m) and the real image of m, so only with masks the site uploaded; default 1."""

    ratio_resolution: str = "patch"
    """How a site sends Eq. 8's D_k ratios (kind discriminator-outputs): patch (default: one value per
    patch of D_k's map; the server upsamples it as the site would, nearest, so the ensemble weights are
    the same bit for bit) | pixel (D_k's patch map upsampled to one value per pixel at the site). Why: on
    the segmentation demo the per-pixel map is the largest thing sites send, while D_k has one logit per
    patch (a 32 px image with 2 layers: 36 patches for 1024 pixels). The weights need one value per pixel
    or patch: Eq. 8 normalises over the sites at every pixel, so a mean over the image would change them.
    L_gan, the only loss on D_k's logits themselves, is computed at the site and never sent."""

    truth_weight: float = 0.0
    """What the server knows of G's images, weighed against the teachers' ensemble in the student's loss;
    default 0, the paper's (the ensemble alone); the lean preset, the default on the per-pixel tasks, sets
    it on reconstruction (0.5, with 16 replay steps: presets.LEAN_IMAGE_OUTPUTS) and on nuclei (0.75:
    presets.LEAN_MASK_SHAPED_IMAGES), not on the brain lesions, where it hurt. Reconstruction: G draws
    the fully sampled image and the sites see its undersampled version, so the server holds the exact
    answer to every synthetic input, the correction that turns the zero-filled image back into G's image,
    and mixes it into the target, (1 - w) ensemble + w truth. Segmentation: G draws each image from a
    label mask, so the mask is the image's label; the student's loss is (1 - w) L_mimic + w times the
    task's own loss against it (AsynDGAN trains its segmenter on these pairs alone). Why: the teachers
    each learnt from one site and their ensemble caps a student that only copies it; the truth needs no
    message. Refused on classification, whose G draws from noise."""

    pixel_logits: str = "all"
    """What a site sends of its teacher's per-pixel logits: all (default: every class's) | margin (a
    segmentation: the C - 1 margins over the background, z_c - z_0, and the server takes (0, z_1 - z_0,
    ...); on two classes one value per pixel). Why: a softmax depends on nothing else, and on two classes
    it halves the largest thing the sites send (on three, a third less). The output-gradients the server
    returns shrink with it. Not lossless under Eq. 8 or class-share weighting: their weights differ per
    class, so the ensemble depends on the logits' centring, and margin centres them on class 0."""


@dataclass(frozen=True)
class PrivacyOptions(DPOptions):
    """Differential privacy on the input-gradients clients return (`DPOptions`' ``dp_*`` keys), with
    FedIOD's own accounting and clip norm."""

    dp_accounting: str = "d-step"
    """The sampling rate each D-step is accounted at: d-step (default, the paper's: q = B / n_k) | release
    (the worst case)."""

    dp_clip_norm: float = 0.01
    """Bound on each returned per-sample input-gradient (a batch-mean loss's, so about 1/B of a per-sample
    loss gradient); default 0.01. Why: the 90th percentile of those norms on digits, so most pass whole."""


@dataclass(frozen=True)
class RobustnessOptions:
    """What one poisoning site can do to the ensemble: the plausibility checks on the sites' replies and
    how their outputs are combined."""

    plausibility_checks: bool = True
    """Drop, as an invalid reply, a site whose logits or input-gradients are far larger than the other
    sites' in the same query, or whose class counts do not add up to its sample count
    (federation/plausibility.py); default true. Why: a finite reply scaled by 1e30 otherwise outvotes
    every honest site. false: accept them."""

    ensemble_combine: str = "mean"
    """How the sites' outputs form the ensemble: mean (default, the paper's weighted sum of logits) |
    median | trimmed-mean (the weighted median or trimmed mean of their probabilities, clipped at
    `combine_clip` and taken back to centred log-probabilities). Why: a minority of sites cannot move a
    median or trimmed mean far, whatever they send."""

    combine_trim: float = 0.2
    """trimmed-mean: the share of the sites whose probabilities are cut at each end, per class and sample
    (one at least, from three sites up); default 0.2."""

    combine_clip: float = 1e-4
    """median and trimmed-mean: the smallest probability kept before the log; default 1e-4."""
