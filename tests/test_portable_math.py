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

from fedistill.data import portable_math
from fedistill.data.medical import brain_synthetic, lesion_randomisation, lesions, nuclei_synthetic


def other_rounding(result: Any) -> Any:
    """`result` off by up to a thousandth, by an amount that varies from value to value."""
    return result * (1 + 1e-3 * np.sin(1e3 * np.asarray(result)))


class OtherCpu(ModuleType):
    """NumPy whose exp, log and power round differently, everything else NumPy's own."""

    def __init__(self) -> None:
        super().__init__("numpy")

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def exp(*args: Any, **kwargs: Any) -> Any:
        return other_rounding(np.exp(*args, **kwargs))

    @staticmethod
    def log(*args: Any, **kwargs: Any) -> Any:
        return other_rounding(np.log(*args, **kwargs))

    @staticmethod
    def power(*args: Any, **kwargs: Any) -> Any:
        return other_rounding(np.power(*args, **kwargs))


def on_another_cpu(monkeypatch: pytest.MonkeyPatch, *modules: ModuleType) -> None:
    for module in (*modules, _filters):
        monkeypatch.setattr(module, "np", OtherCpu())


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
