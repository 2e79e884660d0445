"""`nuclei-synthetic-sites`: a semi-synthetic cross-site nuclei set built from 125 real nuclei.

The only labelled nuclei here are the 125 instances of one fluorescence image (2018 Data Science Bowl,
512×512). Each synthetic image is composed by cutting real nuclei out by their masks (their real shape
and chromatin texture), turning them by a random angle, maybe flipping them, rescaling them, and placing
them on an empty background, without overlap; the instance map is exact by construction. Sites differ
the way the paper's sources (CPM-17, TCGA, TNBC) do:
  stain   - fluorescence (bright nuclei on black) or an H&E-like rendering (Beer-Lambert mix of
            haematoxylin in the nuclei and eosin in a textured stroma, with site-specific stain vectors);
  scale   - nuclei of a different size, as 20× and 40× tiles differ;
  density - sparse to crowded (touching) nuclei;
  quality - blur and noise.
The H&E tiles in the same folder are not used as backgrounds: their own nuclei carry no labels and
would teach a model that real nuclei are background. The nuclei are split between training and test
images (80% / 20%, seeded), so no test nucleus was seen in training, even turned. Every number
measured on this set is a semi-synthetic number.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tifffile
from scipy import ndimage

from fedistill.data import portable_math
from fedistill.data.base import LoadedDataset
from fedistill.data.image_files import IMAGE_READ_ERRORS
from fedistill.data.medical import options as opt
from fedistill.data.medical.nuclei_sets import WholeImage, nuclei_dataset, patching_options
from fedistill.data.medical.patches import relabel
from fedistill.errors import DataError

NAME = "nuclei-synthetic-sites"
IMAGE_FILE = "fluorescence_image.tif"
INSTANCE_FILE = "fluorescence_instances.tif"
TEST_NUCLEI_FRACTION = 0.2


@dataclass(frozen=True)
class Site:
    """How one synthetic site looks: its stain, nucleus size and density, spacing, blur, noise and colours."""

    name: str
    stain: str  # "fluorescence" or "he"
    nucleus_scale: float
    density: float  # nuclei per 10,000 pixels
    gap: int  # pixels kept free around each nucleus (0: nuclei may touch)
    blur: float  # Gaussian sigma in pixels
    noise: float  # std of additive noise, in [0, 1] units
    colour: tuple[tuple[float, float, float], ...]  # fluorescence: (tint,); H&E: (haematoxylin, eosin)


SITES = (
    Site("synthetic-fluorescence", "fluorescence", 1.0, 4.5, 2, 0.5, 0.02, ((0.45, 0.6, 1.0),)),
    # Ruifrok and Johnston's H&E optical-density vectors
    Site(
        "synthetic-he-sparse-large", "he", 1.5, 1.5, 4, 1.0, 0.015, ((0.65, 0.70, 0.29), (0.07, 0.99, 0.11))
    ),
    # a bluer haematoxylin and a stronger, redder eosin, as another lab's staining would give
    Site("synthetic-he-dense-small", "he", 0.8, 9.0, 0, 0.6, 0.04, ((0.55, 0.75, 0.37), (0.15, 0.95, 0.27))),
)


@dataclass(frozen=True)
class Sprite:
    """One nucleus to place: its signal (0 outside it) and its mask."""

    signal: np.ndarray  # float32 nucleus signal, 0 outside
    mask: np.ndarray  # bool


def describe(folder: str) -> str:
    """Which stardist test image and instance map the synthetic sites take their nuclei from, and where to put
    them."""
    return (
        f"nuclei-synthetic-sites reads {folder}/{IMAGE_FILE} (fluorescence nuclei, 512×512) and "
        f"{folder}/{INSTANCE_FILE} (its instance map, 125 nuclei), from the stardist package's test data."
    )


def read_nuclei(folder: Path) -> list[Sprite]:
    """Each real nucleus cut out by its mask, with its signal: (intensity - background) / nuclei's p95."""
    paths = [folder / IMAGE_FILE, folder / INSTANCE_FILE]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise DataError(
            f"{NAME}: no {', '.join(missing)} in {folder}; expected stardist's test image {IMAGE_FILE} "
            f"and its instance map {INSTANCE_FILE} there"
        )
    try:
        image = tifffile.imread(paths[0]).astype(np.float32)
        instances = relabel(tifffile.imread(paths[1]))
    except IMAGE_READ_ERRORS as e:  # a damaged or cut-short TIFF
        raise DataError(f"{NAME}: cannot read {folder} ({e})") from e
    if image.shape != instances.shape or image.ndim != 2:
        raise DataError(
            f"{NAME}: {paths[0]} {image.shape} and {paths[1]} {instances.shape} must be one 2-D size"
        )
    background = float(np.median(image[instances == 0]))
    top = float(np.percentile(image[instances > 0], 95))
    signal = np.clip((image - background) / max(top - background, 1e-6), 0.0, 1.5)
    sprites = []
    for label, box in enumerate(ndimage.find_objects(instances), start=1):
        if box is None:
            continue
        mask = instances[box] == label
        sprites.append(Sprite(np.where(mask, np.maximum(signal[box], 0.05), 0.0).astype(np.float32), mask))
    return sprites


def _transform(sprite: Sprite, scale: float, rng: np.random.Generator) -> Sprite:
    signal, mask = sprite.signal, sprite.mask.astype(np.float32)
    if rng.random() < 0.5:
        signal, mask = signal[:, ::-1], mask[:, ::-1]
    angle = float(rng.uniform(0.0, 360.0))
    factor = scale * float(rng.uniform(0.85, 1.15))
    out = []
    for array in (signal, mask):
        turned = ndimage.rotate(array, angle, reshape=True, order=1)
        out.append(ndimage.zoom(turned, factor, order=1))
    keep = out[1] >= 0.5
    return Sprite(np.where(keep, out[0], 0.0).astype(np.float32), keep)


def compose(
    pool: list[Sprite], site: Site, size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(nucleus signal, instance map) of one size×size image; nuclei may be cut by the border."""
    signal = np.zeros((size, size), np.float32)
    instances = np.zeros((size, size), np.int64)
    wanted = round(site.density * size * size / 10_000 * rng.uniform(0.8, 1.2))
    reach = np.ones((2 * site.gap + 1, 2 * site.gap + 1), bool) if site.gap else None
    for _ in range(wanted):
        sprite = _transform(pool[rng.integers(len(pool))], site.nucleus_scale, rng)
        h, w = sprite.mask.shape
        for _attempt in range(20):
            top, left = int(rng.integers(-h // 2, size - h // 2)), int(rng.integers(-w // 2, size - w // 2))
            r0, c0, r1, c1 = max(top, 0), max(left, 0), min(top + h, size), min(left + w, size)
            if r1 <= r0 or c1 <= c0:
                continue
            piece = sprite.mask[r0 - top : r1 - top, c0 - left : c1 - left]
            claimed = ndimage.binary_dilation(piece, reach) if reach is not None else piece
            if not (claimed & (instances[r0:r1, c0:c1] > 0)).any():
                instances[r0:r1, c0:c1][piece] = instances.max() + 1
                signal[r0:r1, c0:c1][piece] = sprite.signal[r0 - top : r1 - top, c0 - left : c1 - left][piece]
                break
    return signal, relabel(instances)


def _smooth_noise(shape: tuple[int, int], sigma: float, rng: np.random.Generator) -> np.ndarray:
    field = portable_math.gaussian_filter(rng.standard_normal(shape), sigma)
    return (field - field.mean()) / max(float(field.std()), 1e-8)


def render(signal: np.ndarray, instances: np.ndarray, site: Site, rng: np.random.Generator) -> np.ndarray:
    """RGB uint8 (3, H, W) of a composed image in the site's stain, blur and noise."""
    shape = signal.shape
    nuclei = instances > 0
    if site.stain == "fluorescence":
        glow = 0.04 + 0.015 * _smooth_noise(shape, 6.0, rng) + 0.85 * np.minimum(signal, 1.2)
        rgb = glow[None] * np.asarray(site.colour[0], np.float32)[:, None, None]
    else:
        haematoxylin_vector, eosin_vector = (np.asarray(v) / portable_math.norm(v) for v in site.colour)
        chromatin = np.where(nuclei, 0.35 + 0.65 * np.minimum(signal, 1.2), 0.0)
        stroma = 0.45 + 0.15 * _smooth_noise(shape, 8.0, rng) + 0.08 * _smooth_noise(shape, 1.5, rng)
        lumen = _smooth_noise(shape, 20.0, rng) > 1.2  # pale gaps (fat, lumina) with little eosin
        eosin = np.clip(np.where(lumen, 0.1 * stroma, stroma), 0.0, None) * np.where(nuclei, 0.5, 1.0)
        density = (
            1.1 * chromatin[None] * haematoxylin_vector[:, None, None]
            + 0.6 * eosin[None] * eosin_vector[:, None, None]
        )
        rgb = portable_math.exp(-density)
    rgb = portable_math.gaussian_filter(rgb, sigma=(0, site.blur, site.blur))
    rgb = rgb + rng.standard_normal(rgb.shape) * site.noise
    return np.round(np.clip(rgb, 0.0, 1.0) * 255.0).astype(np.uint8)


def synthetic_images(
    pool: list[Sprite], site_index: int, split: int, count: int, size: int, seed: int
) -> list[WholeImage]:
    """`count` images of one site, composed from the nuclei `pool` and rendered in its look, each seeded by
    its site, split and index."""
    site = SITES[site_index]
    out = []
    for i in range(count):
        rng = np.random.default_rng([seed, site_index, split, i])
        signal, instances = compose(pool, site, size, rng)
        kind = "train" if split == 0 else "test"
        out.append(
            WholeImage(
                f"{site.name}-{kind}-{i:03d}", render(signal, instances, site, rng), instances, site_index
            )
        )
    return out


def load_nuclei_synthetic(
    folder: Path,
    *,
    image_size: int = 256,
    patch_size: int = 128,
    stride: int | None = None,
    train_images: int = 8,
    test_images: int = 2,
    seed: int = 0,
) -> LoadedDataset:
    """Per site `train_images` + `test_images` whole images of `image_size`, cut into patches."""
    size = opt.positive_int(NAME, "image_size", image_size, minimum=32)
    patching = patching_options(NAME, patch_size, stride, 1.0)
    train_n = opt.positive_int(NAME, "train_images", train_images)
    test_n = opt.positive_int(NAME, "test_images", test_images)
    seed = opt.positive_int(NAME, "seed", seed, minimum=0)
    nuclei = read_nuclei(Path(folder))
    order = np.random.default_rng([seed, 99]).permutation(len(nuclei))
    cut = round(len(nuclei) * TEST_NUCLEI_FRACTION)
    test_pool, train_pool = [nuclei[i] for i in order[:cut]], [nuclei[i] for i in order[cut:]]
    train, test = [], []
    for site in range(len(SITES)):
        train += synthetic_images(train_pool, site, 0, train_n, size, seed)
        test += synthetic_images(test_pool, site, 1, test_n, size, seed)
    return nuclei_dataset(NAME, train, test, patching, tuple(s.name for s in SITES))
