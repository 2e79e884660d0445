"""Seeded synthetic data are the same on every x86-64 CPU. NumPy rounds float64 exp and log, and powers,
with AVX-512 code on CPUs that have it and with the C library elsewhere, and SciPy's Gaussian kernel is
built with NumPy's exp: a last-bit difference that an 8-bit pixel or a threshold turned into another grey
level or mask pixel. Here NumPy's exp, log and power round differently, as another CPU's would (by far more
than a last bit, so that any use shows), and the data must not change."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from scipy import ndimage
from scipy.ndimage import _filters

from fedistill.algorithms.fediod import draws
from fedistill.algorithms.fediod.task_view import TaskView
from fedistill.data import portable_math
from fedistill.data.base import DatasetInfo
from fedistill.data.medical import (
    brain_extraction,
    brain_synthetic,
    lesion_randomisation,
    lesions,
    nuclei_synthetic,
)
from fedistill.data.mri import foreground
from fedistill.tasks import InstanceSegmentation, SemanticSegmentation


def on_another_cpu(monkeypatch: pytest.MonkeyPatch, *modules: ModuleType, by: float = 1e-3) -> None:
    """NumPy's exp, log, power and vector norm (OpenBLAS's dot, whose kernel follows the CPU too) in
    `modules` and in SciPy's filters off by up to `by` (relative), by an amount that varies from value to
    value; everything else NumPy's own."""

    def off(function: Any) -> Any:
        return lambda *args, **kwargs: (
            (r := function(*args, **kwargs)) * (1 + by * np.sin(1e3 * np.asarray(r)))
        )

    other = ModuleType("numpy")
    other.__getattr__ = lambda name: getattr(np, name)  # type: ignore[method-assign]
    for name in ("exp", "log", "power"):
        setattr(other, name, off(getattr(np, name)))
    other.linalg = ModuleType("numpy.linalg")
    other.linalg.__getattr__ = lambda name: getattr(np.linalg, name)  # type: ignore[method-assign]
    other.linalg.norm = off(np.linalg.norm)
    for module in (*modules, _filters):
        monkeypatch.setattr(module, "np", other)


def test_the_kernel_and_the_filter_are_scipy_s():
    for sigma in (0.5, 1.0, 1.7, 2.0, 4.0, 8.0):
        expected = _filters._gaussian_kernel1d(sigma, 0, int(4 * sigma + 0.5))
        assert np.allclose(portable_math.gaussian_kernel(sigma), expected, rtol=1e-15, atol=0)
    x = np.random.default_rng(0).standard_normal((5, 12, 9))
    for values in (x, x.astype(np.float32)):
        for sigma in (1.3, (0.0, 1.0, 2.5)):
            smoothed = portable_math.gaussian_filter(values, sigma)
            assert smoothed.dtype == values.dtype
            assert np.allclose(smoothed, ndimage.gaussian_filter(values, sigma), rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="float arrays; got dtype int64"):
        portable_math.gaussian_filter(np.zeros((3, 3), dtype=np.int64), 1.0)


def test_exp_and_power_keep_the_dtype():
    x = np.linspace(-2, 2, 11)
    assert np.allclose(portable_math.exp(x), np.exp(x), rtol=1e-15) and portable_math.exp(x).dtype == x.dtype
    y = np.linspace(0, 1, 11, dtype=np.float32)
    assert portable_math.power(y, 0.8).dtype == np.float32
    assert np.allclose(portable_math.power(y, 0.8), y**0.8, rtol=1e-6)


@pytest.mark.parametrize("synthesis", ["plain", "randomised"])
def test_synthetic_lesions_do_not_follow_the_cpu(monkeypatch, synthesis):
    options = {"image_size": 32, "train_subjects": 3, "test_subjects": 1, "synthesis": synthesis}
    here = brain_synthetic.load_mni152_synthetic(**options)
    on_another_cpu(monkeypatch, brain_synthetic, lesions, lesion_randomisation)
    there = brain_synthetic.load_mni152_synthetic(**options)
    assert torch.equal(here.train.x, there.train.x) and torch.equal(here.train.y, there.train.y)
    assert torch.equal(here.test.x, there.test.x) and torch.equal(here.test.y, there.test.y)


@pytest.mark.parametrize("site", nuclei_synthetic.SITES, ids=lambda s: s.name)
def test_synthetic_nuclei_do_not_follow_the_cpu(monkeypatch, site):
    yy, xx = np.mgrid[:48, :48]
    instances = ((yy - 20) ** 2 + (xx - 24) ** 2 < 60).astype(np.int64)
    signal = instances * 0.8
    here = nuclei_synthetic.render(signal, instances, site, np.random.default_rng(5))
    on_another_cpu(monkeypatch, nuclei_synthetic)
    there = nuclei_synthetic.render(signal, instances, site, np.random.default_rng(5))
    assert np.array_equal(here, there)


@pytest.mark.parametrize("task", [SemanticSegmentation(), InstanceSegmentation()], ids=lambda t: t.name)
@pytest.mark.parametrize("size", [32, 64])
def test_fediod_s_prior_masks_do_not_follow_the_cpu(monkeypatch, task, size):
    """The server's own masks are thresholded noise smoothed with sigma size / 16: SciPy's kernels for
    sigma 2 and 4 are among those whose last bits follow the CPU."""
    view = TaskView(task, DatasetInfo("toy", 1, size, 2, (0.5,), (0.25,), task=task.name), 0)
    here = draws.prior_masks(view, 6, torch.Generator().manual_seed(3))
    on_another_cpu(monkeypatch, draws, by=0.05)  # a thresholded mask needs a larger change to show
    assert torch.equal(here, draws.prior_masks(view, 6, torch.Generator().manual_seed(3)))


def _head() -> np.ndarray:
    """Slices (Z, H, W) of a noisy grey brain inside a bright scalp, float32, 1 mm pixels."""
    yy, xx = np.mgrid[:96, :96] - 48.0
    radius = np.broadcast_to(np.hypot(yy, xx), (3, 96, 96))
    head = np.select([radius <= 32, (radius > 34) & (radius <= 40)], [0.4, 1.0], 0.0)
    noise = 0.25 * np.random.default_rng(0).standard_normal(head.shape) * (head > 0)
    return (head + noise).clip(0).astype(np.float32)


def _masks(volume: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    level = foreground.reference_level(volume)
    return brain_extraction.tissue_brain(volume, (1.0, 1.0)), foreground.foreground_mask(
        volume[1], level, 0.5
    )


def test_brain_and_foreground_masks_do_not_follow_the_cpu(monkeypatch):
    """Both smooth a scan before a threshold: the tissue rule's brain, and the foreground of a slice."""
    volume = _head()
    here = _masks(volume)
    assert here[0].any() and here[1].any()
    on_another_cpu(monkeypatch, brain_extraction, foreground, by=0.05)
    there = _masks(volume)
    assert np.array_equal(here[0], there[0])
    assert np.array_equal(here[1], there[1])


def test_norm():
    assert (
        portable_math.norm([3.0, 4.0]) == 5.0 and portable_math.norm(np.array([[1.0], [2.0], [2.0]])) == 3.0
    )
    v = np.random.default_rng(1).standard_normal(3)
    assert portable_math.norm(v) == pytest.approx(float(np.linalg.norm(v)), rel=1e-15)
