"""Semi-synthetic stand-ins for BraTS: real brain anatomy, synthetic labelled lesions.

No BraTS volume can be shipped or fetched, so these sets put the lesions of `lesions.py` into real,
openly licensed brains: `brats-synthetic-lesions` uses the skull-stripped Colin 27 brain (one adult, 27
averaged T1 scans) and the ICBM 2009a template (152 adults averaged, T1), alternating subject by
subject; `mni152-synthetic-lesions` uses only the template copy inside the nilearn package, so it needs
no data files (the segmentation demo's dataset). Each "subject" is one host with its own lesion and a
mild, seeded change of the host (left-right flip, in-plane rotation up to 8°, shift up to 6 mm, gamma
0.8-1.25, a linear bias field up to ±10%, noise), so subjects differ in more than the lesion; but only
one or two real anatomies exist, and the same anatomy appears in training and test subjects.

The hosts are T1-weighted (no T2 brain was available) while the lesions mimic T2's bright oedema and
core, so the images look like neither modality exactly: every number measured on these sets is a
semi-synthetic number, not a BraTS one. `brain-lesions-real` holds the only real lesions here: two
patients' contrast-enhanced T1 scans with their lesion masks (test only; its training set is empty),
also available as extra test subjects of `brats-synthetic-lesions` with `real_test = true`. The
patients' scans keep the skull (no brain mask exists for them) and have 6.5 mm slices, so a model
trained on the skull-stripped synthetic slices meets a shift of domain there, which is the point.

With `synthesis = "randomised"` a share (`randomised_fraction`) of the training subjects is drawn by
`lesion_randomisation` instead: random tissue contrasts, lesions, bias, blur, noise and a synthetic head,
so that a model may meet the real patients as one more draw; the test subjects stay plain.

Volumes are padded to the 240 mm field of view and resampled isotropically to 240/`image_size` mm
voxels, so slices are `image_size` square and slice spacing follows the same scale; subjects, slice
rule and size-ranked sites then follow `slice_sets` exactly as for BraTS.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

from fedistill.data import portable_math
from fedistill.data.base import LoadedDataset
from fedistill.data.medical import lesion_randomisation as randomisation
from fedistill.data.medical import options as opt
from fedistill.data.medical.brain_extraction import extract_brain
from fedistill.data.medical.lesions import draw_look, paint_lesion
from fedistill.data.medical.slice_sets import SubjectSlices, slice_dataset, subject_slices
from fedistill.data.medical.volumes import (
    FIELD_OF_VIEW_MM,
    SLICE_RULES,
    axial_slices,
    read_volume,
    scale_to_uint8,
    to_field_of_view,
)
from fedistill.errors import DataError

COLIN27 = "colin27_t1_brain.nii.gz"
MNI152 = "mni152_2009a_t1.nii.gz"
PATIENTS = ("lesion_brain1", "lesion_brain2")
NILEARN_MNI152 = "datasets/data/mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz"
HOST_PEAK = 0.75  # the host brain's 99.5th percentile; lesions are brighter (see load_host)
#: the hosts' brain median on that scale (Colin 27 0.517, MNI152 0.503 at their own resolution), where
#: `scan_scale`'s "brain-median" rule puts a scan's brain median
HOST_MEDIAN = 0.51
#: how a scan that is not a host is put on the hosts' scale (`scan_scale`; the real patients, `predict`)
SCAN_SCALES = ("brain-median", "percentile")
_TRAIN, _TEST = 0, 1  # seed stream of each split, so the test subjects do not move when train_subjects does
SYNTHESES = ("plain", "randomised")  # option `synthesis`: randomised = lesion_randomisation, training only
#: the real patients' scans: brain extraction first (brain_extraction's "outline" rule, or its "tissue"
#: rule), or the whole head
SKULLS = ("stripped", "stripped-tissue", "on")
EXTRACTION_RULES = {"stripped": "outline", "stripped-tissue": "tissue"}
#: the datasets whose brains sit on the hosts' scale (`host_scale`): predict scales a scan so for their models
HOST_SCALED = ("brats-synthetic-lesions", "mni152-synthetic-lesions")
_CHOICE = 2  # seed stream of "is this training subject randomised", apart from the subject's own


@dataclass(frozen=True)
class Host:
    """A brain on the output grid: intensities in [0, 1], its mask and depth (voxels from the mask's edge)."""

    name: str
    volume: np.ndarray  # (X, Y, Z) RAS
    brain: np.ndarray
    depth: np.ndarray
    voxel_mm: float


def _resample(volume: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    """Box-averaged ("area") resampling: antialiased when shrinking, which is the usual case."""
    x = torch.from_numpy(np.ascontiguousarray(volume, dtype=np.float32))[None, None]
    mode = "area" if all(s <= h for s, h in zip(shape, volume.shape, strict=True)) else "trilinear"
    return F.interpolate(x, size=shape, mode=mode)[0, 0].numpy()


@functools.lru_cache(maxsize=4)
def load_host(path: str, name: str, image_size: int) -> Host:
    """The skull-stripped volume at `path` (non-zero = brain) on the 240 mm grid of `image_size` voxels.

    Its brain's 0.5th-99.5th percentiles span 0..HOST_PEAK, leaving the top of the range to the lesions:
    the hosts are T1, where white matter is the brightest tissue, and T2-like lesions must outshine it.
    """
    volume, (zx, zy, zz) = read_volume(Path(path))
    brain = volume > 0
    scaled = host_scale(volume, brain)
    voxel_mm = FIELD_OF_VIEW_MM / image_size
    shape = tuple(max(1, round(n * z / voxel_mm)) for n, z in zip(volume.shape, (zx, zy, zz), strict=True))
    small_brain = _resample(brain.astype(np.float32), shape)
    small = _resample(scaled, shape)
    # pad (or crop) x and y to the field of view; the helper pads (N, H, W) stacks, so z goes first
    fov = (voxel_mm, voxel_mm)
    out_brain = to_field_of_view(small_brain.transpose(2, 0, 1), fov).transpose(1, 2, 0) >= 0.5
    out_brain = ndimage.binary_fill_holes(out_brain)
    out = np.clip(to_field_of_view(small.transpose(2, 0, 1), fov).transpose(1, 2, 0), 0.0, 1.0) * out_brain
    depth = ndimage.distance_transform_edt(out_brain)
    return Host(name, np.ascontiguousarray(out, dtype=np.float32), out_brain, depth, voxel_mm)


def host_scale(volume: np.ndarray, brain: np.ndarray) -> np.ndarray:
    """The hosts' intensity scale: the brain's 0.5th-99.5th percentiles span 0..HOST_PEAK, 0 outside it."""
    lo, hi = np.percentile(volume[brain], [0.5, 99.5])
    return (np.clip((volume - lo) / max(float(hi - lo), 1e-8), 0.0, 1.0) * (HOST_PEAK * brain)).astype(
        np.float32
    )


def scan_scale(volume: np.ndarray, brain: np.ndarray, rule: str = "brain-median") -> np.ndarray:
    """A scan that is not a host (a real patient's, one given to `predict`) on the hosts' intensity scale,
    0 outside `brain`. "brain-median": its brain's median goes to HOST_MEDIAN, zero stays zero, clipped to
    [0, 1]; normal tissue sets the scale, as it does in the lesion-free hosts, whatever bright structures
    the scan also holds (an enhancing lesion, vessels, scalp left by brain extraction). "percentile":
    `host_scale`, as the hosts themselves were scaled, so the scan's brightest 0.5% set its top: on the two
    real patients that put the brain's median near 0.29 instead of the hosts' 0.51, and every lesion
    below the level the models learned lesions at."""
    if rule == "percentile":
        return host_scale(volume, brain)
    if rule != "brain-median":
        raise ValueError(f"unknown scan scale {rule!r}; valid: {', '.join(SCAN_SCALES)}")
    median = float(np.median(volume[brain]))
    if median <= 0:
        raise DataError("the scan's brain has a median intensity of 0 or less; is it a magnitude image?")
    return (np.clip(volume * (HOST_MEDIAN / median), 0.0, 1.0) * brain).astype(np.float32)


def _augment(
    image: np.ndarray, lesion: np.ndarray, brain: np.ndarray, voxel_mm: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A mild, seeded change of the host, on axial stacks (Z, H, W): left-right flip, in-plane rotation
    and shift (one bilinear resampling of all three stacks), a shift along z, gamma, bias field, noise."""
    flip = rng.random() < 0.5
    angle = np.deg2rad(rng.uniform(-8.0, 8.0))
    size = image.shape[1]
    shift_xy = rng.uniform(-6.0, 6.0, size=2) / voxel_mm * 2.0 / size  # in grid_sample's [-1, 1] units
    shift_z = int(rng.integers(-round(4.0 / voxel_mm), round(4.0 / voxel_mm) + 1))
    gamma = math.exp(rng.uniform(math.log(0.8), math.log(1.25)))  # math, not NumPy: see portable_math
    direction = rng.standard_normal(3)
    direction /= portable_math.norm(direction)
    bias_amplitude = float(rng.uniform(0.0, 0.1))
    noise_std = float(rng.uniform(0.01, 0.03))

    # where each output pixel samples the input, in grid_sample's [-1, 1] pixel-centre coordinates
    cos, sin = np.cos(angle), np.sin(angle)
    sign = -1.0 if flip else 1.0
    centres = (2.0 * np.arange(size) + 1.0) / size - 1.0
    x, y = np.meshgrid(centres, centres, indexing="xy")
    source_x = sign * (cos * x - sin * y) + shift_xy[0]
    source_y = sin * x + cos * y + shift_xy[1]
    grid = torch.from_numpy(np.stack([source_x, source_y], axis=-1)[None].astype(np.float32))
    # every slice of the three stacks is one channel of a single image: one grid serves them all
    stack = torch.from_numpy(np.concatenate([image, lesion, brain]).astype(np.float32))[None]
    moved = F.grid_sample(stack, grid, mode="bilinear", padding_mode="zeros", align_corners=False)[0].numpy()
    moved = np.roll(moved.reshape(3, *image.shape), shift_z, axis=1)
    if shift_z:  # the slices rolled round from the other end are emptied, not wrapped
        moved[:, slice(0, shift_z) if shift_z > 0 else slice(shift_z, None)] = 0.0
    image, lesion_out, brain_out = moved[0], moved[1] >= 0.5, moved[2] >= 0.5

    coords = np.meshgrid(*(np.linspace(-1.0, 1.0, n, dtype=np.float32) for n in image.shape), indexing="ij")
    bias = 1.0 + bias_amplitude * sum(float(d) * c for d, c in zip(direction, coords, strict=True))
    noise = rng.standard_normal(image.shape, dtype=np.float32) * noise_std
    image = np.clip(portable_math.power(np.clip(image, 0.0, 1.0), gamma) * bias + noise, 0.0, 1.0) * brain_out
    return image, lesion_out & brain_out, brain_out


def synthetic_subject(
    host: Host, name: str, rng: np.random.Generator, rule: str, image_size: int, randomised: bool = False
) -> SubjectSlices:
    """One semi-synthetic subject: a lesion of a drawn look painted into a real brain, augmented, and cut into
    axial slices chosen by `rule`; `randomised`: domain-randomised instead (lesion_randomisation)."""
    if randomised:
        host_volume = randomisation.remap_intensities(host.volume, host.brain, rng)
        painted, lesion = randomisation.paint_random_lesions(
            host_volume, host.brain, host.depth, host.voxel_mm, rng
        )
    else:
        look = draw_look(rng)
        painted, lesion = paint_lesion(host.volume, host.brain, host.depth, host.voxel_mm, look, rng)
    image, lesion, brain = _augment(
        axial_slices(painted), axial_slices(lesion), axial_slices(host.brain), host.voxel_mm, rng
    )
    if randomised:  # the label keeps only what the image still shows
        image, shown = randomisation.corrupt(image, brain, host.voxel_mm, rng)
        lesion = lesion & shown
    slices = np.round(image * 255.0).astype(np.uint8)
    vox = host.voxel_mm
    return subject_slices(name, slices, lesion, brain, (vox, vox, vox), rule, image_size)


def _subjects(
    hosts: list[Host],
    split: int,
    count: int,
    seed: int,
    rule: str,
    image_size: int,
    randomised_fraction: float = 0.0,
) -> list[SubjectSlices]:
    """`count` subjects of `split`; each is randomised with probability `randomised_fraction`, drawn from a
    stream of its own, so the plain subjects stay those of the plain synthesis."""
    prefix = "train" if split == _TRAIN else "test"
    out = []
    for i in range(count):
        host = hosts[i % len(hosts)]
        rng = np.random.default_rng([seed, split, i])
        randomised = randomised_fraction > 0 and (
            np.random.default_rng([seed, split, i, _CHOICE]).random() < randomised_fraction
        )
        name = f"synthetic-{host.name}-{prefix}-{i:03d}"
        out.append(synthetic_subject(host, name, rng, rule, image_size, randomised))
    return out


def _require(folder: Path, names: list[str], dataset: str) -> list[Path]:
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise DataError(
            f"{dataset}: no {', '.join(missing)} in {folder}; expected the real brain volumes it reads there "
            f"({', '.join(names)})"
        )
    return [folder / n for n in names]


def describe_brain_mri(folder: str) -> str:
    """Which real brain volumes the semi-synthetic brain sets read, and where to put them."""
    return (
        f"The semi-synthetic brain sets read real brains from {folder}/:\n"
        f"  {folder}/{COLIN27}  Colin 27 T1, skull-stripped (MRIcron templates, mricron-data package)\n"
        f"  {folder}/{MNI152}  ICBM 2009a symmetric T1 template (shipped in nilearn as "
        "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz)\n"
        f"  {folder}/lesion_brain1_image.nii.gz, _label.nii.gz and lesion_brain2_...  two patients' "
        "contrast T1 scans with lesion masks (pyradiomics test data, NRRD converted to NIfTI), "
        "for brain-lesions-real and real_test.\n"
        "mni152-synthetic-lesions needs none of them."
    )


def _check_common(
    dataset: str, image_size: object, train: object, test: object, seed: object, slices: object
) -> tuple[int, int, int, int, str]:
    return (
        opt.positive_int(dataset, "image_size", image_size, minimum=16),
        opt.positive_int(dataset, "train_subjects", train),
        opt.positive_int(dataset, "test_subjects", test),
        opt.positive_int(dataset, "seed", seed, minimum=0),
        opt.choice(dataset, "slices", slices, SLICE_RULES),
    )


def randomised_share(dataset: str, synthesis: object, randomised_fraction: object) -> float:
    """The share of training subjects to randomise: 0 for the plain synthesis, else `randomised_fraction`
    (a number in (0, 1])."""
    share = opt.positive_float(dataset, "randomised_fraction", randomised_fraction, maximum=1.0)
    return share if opt.choice(dataset, "synthesis", synthesis, SYNTHESES) == "randomised" else 0.0


def real_patients(
    folder: Path,
    image_size: int,
    rule: str,
    dataset: str,
    skull: str = "stripped",
    intensity: str = "brain-median",
) -> list[SubjectSlices]:
    """The two patients' slices with their real lesion masks. `skull = "stripped"`: the brain alone
    (`brain_extraction`'s outline rule; "stripped-tissue": its tissue rule), put on the hosts' intensity
    scale by `intensity` (`scan_scale`), as the models trained; `"on"`: the whole head, its 0.5th-99.5th
    percentiles spanning 0..255. That mask is also the one the "brain" slice rule uses. `skull` and
    `intensity` are checked by the loader that names them."""
    out = []
    for patient in PATIENTS:
        image_path, label_path = _require(
            folder, [f"{patient}_image.nii.gz", f"{patient}_label.nii.gz"], dataset
        )
        volume, (zx, zy, zz) = read_volume(image_path)
        label, _ = read_volume(label_path)
        if label.shape != volume.shape:
            raise DataError(f"{label_path} has shape {label.shape} but {image_path} has {volume.shape}")
        images, lesion = axial_slices(volume), axial_slices(label) > 0
        if skull == "on":
            inside = images > 0
            scaled = scale_to_uint8(images, inside, "volume-percentile", str(image_path))
        else:
            inside = extract_brain(images, (zy, zx), rule=EXTRACTION_RULES[skull])
            if not inside.any():
                raise DataError(
                    f"{image_path}: brain extraction ({EXTRACTION_RULES[skull]} rule) found no brain; "
                    "is it a head scan?"
                )
            scaled = np.round(scan_scale(images, inside, intensity) * 255.0).astype(np.uint8)
        out.append(subject_slices(f"real-{patient}", scaled, lesion, inside, (zy, zx, zz), rule, image_size))
    return out


def load_brats_synthetic(
    folder: Path,
    *,
    image_size: int = 128,
    train_subjects: int = 40,
    test_subjects: int = 10,
    seed: int = 0,
    slices: str = "tumour",
    synthesis: str = "plain",
    randomised_fraction: float = 1.0,
    real_test: bool = False,
    real_skull: str = "stripped",
    real_intensity: str = "brain-median",
) -> LoadedDataset:
    """Lesions painted into the Colin 27 and MNI152 brains, seeded per subject; with `real_test` the real
    patients are added to the test set; `synthesis = "randomised"` domain-randomises that share of the
    training subjects (the test subjects stay plain)."""
    name = "brats-synthetic-lesions"
    image_size, train_n, test_n, seed, rule = _check_common(
        name, image_size, train_subjects, test_subjects, seed, slices
    )
    real_test = opt.flag(name, "real_test", real_test)
    real_skull = opt.choice(name, "real_skull", real_skull, SKULLS)
    real_intensity = opt.choice(name, "real_intensity", real_intensity, SCAN_SCALES)
    share = randomised_share(name, synthesis, randomised_fraction)
    colin, mni = _require(Path(folder), [COLIN27, MNI152], name)
    hosts = [load_host(str(colin), "colin27", image_size), load_host(str(mni), "mni152", image_size)]
    train = _subjects(hosts, _TRAIN, train_n, seed, rule, image_size, share)
    test = _subjects(hosts, _TEST, test_n, seed, rule, image_size)
    extra = None
    if real_test:
        patients = real_patients(Path(folder), image_size, rule, name, real_skull, real_intensity)
        flags = [(s, 0) for s in test] + [(s, 1) for s in patients]
        extra = {"real": np.concatenate([np.full(len(s.images), f, np.int64) for s, f in flags])}
        test = [*test, *patients]
    return slice_dataset(name, train, test, image_size, extra_test_meta=extra)


def nilearn_mni152() -> Path:
    """The MNI152 (ICBM 2009a) T1 template inside the installed nilearn package, found without importing
    nilearn (its import is slow and pulls in much of scikit-learn)."""
    spec = importlib.util.find_spec("nilearn")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / NILEARN_MNI152
        if path.is_file():
            return path
    raise DataError(
        f"mni152-synthetic-lesions needs nilearn's copy of the MNI152 template ({NILEARN_MNI152}); "
        "install the project's dependencies (pip install -e .), which include nilearn"
    )


def load_mni152_synthetic(
    *,
    image_size: int = 64,
    train_subjects: int = 40,
    test_subjects: int = 10,
    seed: int = 0,
    slices: str = "tumour",
    synthesis: str = "plain",
    randomised_fraction: float = 1.0,
) -> LoadedDataset:
    """Lesions painted into nilearn's MNI152 template alone, so it needs no files of its own."""
    name = "mni152-synthetic-lesions"
    image_size, train_n, test_n, seed, rule = _check_common(
        name, image_size, train_subjects, test_subjects, seed, slices
    )
    share = randomised_share(name, synthesis, randomised_fraction)
    hosts = [load_host(str(nilearn_mni152()), "mni152", image_size)]
    train = _subjects(hosts, _TRAIN, train_n, seed, rule, image_size, share)
    test = _subjects(hosts, _TEST, test_n, seed, rule, image_size)
    return slice_dataset(name, train, test, image_size)


def load_real_lesions(
    folder: Path,
    *,
    image_size: int = 128,
    slices: str = "tumour",
    skull: str = "stripped",
    intensity: str = "brain-median",
) -> LoadedDataset:
    """Test only: the training set is empty; evaluate a model trained elsewhere at the same image_size.
    `skull`: "stripped" (the default: brain extraction, as the training brains are), "stripped-tissue"
    (brain_extraction's tissue rule) or "on"; `intensity`:
    how the extracted brain is put on the hosts' scale (`scan_scale`)."""
    name = "brain-lesions-real"
    image_size = opt.positive_int(name, "image_size", image_size, minimum=16)
    rule = opt.choice(name, "slices", slices, SLICE_RULES)
    skull = opt.choice(name, "skull", skull, SKULLS)
    intensity = opt.choice(name, "intensity", intensity, SCAN_SCALES)
    patients = real_patients(Path(folder), image_size, rule, name, skull, intensity)
    return slice_dataset(name, [], patients, image_size)
