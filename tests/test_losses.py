"""Losses against slow float64 references (scipy) and finite differences."""

import jax
import numpy as np
from jax.test_util import check_grads
from scipy.ndimage import gaussian_filter

from realsim_core import losses

jax.config.update("jax_enable_x64", True)


def _ssim_reference(a, b):
    """Wang et al. SSIM with scipy's Gaussian filter (σ 1.5, 11 taps), per channel, float64."""
    out = []
    for c in range(a.shape[-1]):
        x, y = a[..., c], b[..., c]
        f = lambda z: gaussian_filter(z, 1.5, truncate=5 / 1.5, mode="nearest")  # noqa: E731
        mx, my = f(x), f(y)
        sxx, syy, sxy = f(x * x) - mx * mx, f(y * y) - my * my, f(x * y) - mx * my
        c1, c2 = 0.01 ** 2, 0.03 ** 2
        num = (2 * mx * my + c1) * (2 * sxy + c2)
        out.append(num / ((mx * mx + my * my + c1) * (sxx + syy + c2)))
    return np.mean(out, axis=0)


def test_ssim_matches_reference_and_identity():
    rng = np.random.default_rng(0)
    a = rng.random((24, 30, 3))
    b = np.clip(a + 0.1 * rng.normal(size=a.shape), 0, 1)
    np.testing.assert_allclose(losses.ssim_map(a, b), _ssim_reference(a, b), atol=1e-10)
    np.testing.assert_allclose(losses.ssim_map(a, a), 1.0, atol=1e-12)
    assert float(losses.ssim_map(a, b).mean()) < 0.97  # noise lowers it (0.946 here)


def test_batched_ssim_equals_per_image():
    rng = np.random.default_rng(1)
    a, b = rng.random((2, 3, 16, 20, 3)), rng.random((2, 3, 16, 20, 3))
    batched = np.asarray(losses.ssim_map(a, b))
    for i in range(2):
        for j in range(3):
            np.testing.assert_allclose(batched[i, j], losses.ssim_map(a[i, j], b[i, j]), atol=1e-12)


def test_pose_loss_gradient_matches_finite_differences():
    rng = np.random.default_rng(2)
    t = rng.random((12, 14, 3))
    w = (rng.random((12, 14)) > 0.3).astype(float)
    r = np.clip(t + 0.2 * rng.normal(size=t.shape), 0.05, 0.95)
    check_grads(lambda x: losses.pose_loss(x, t, w), (r,), order=1, modes=["rev"])


def test_downsample_box_filter():
    img = np.arange(4 * 6 * 1, dtype=float).reshape(4, 6, 1)
    d = np.asarray(losses.downsample(img, 2))
    assert d.shape == (2, 3, 1)
    assert d[0, 0, 0] == np.mean([0, 1, 6, 7])
