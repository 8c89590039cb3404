"""The background behind the rig and planes: colours over the ray's height (sky_background)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realsim_core import calibration as C
from realsim_core.errors import RealsimError
from realsim_core.se3 import se3_exp
from realsim_core.types import CameraIntrinsics

INTR = CameraIntrinsics(20, 14, 16.0, 17.0, 9.5, 6.5)


def _horizontal_camera(pitch: float) -> np.ndarray:
    """T_world_cam (optical: z forward, y down) looking along +x, pitched up by `pitch`."""
    level = np.array([[0.0, 0, 1], [-1, 0, 0], [0, -1, 0]])    # columns: x, y, z of the camera
    c, s = np.cos(pitch), np.sin(pitch)
    up = np.array([[c, 0, -s], [0, 1, 0], [s, 0, c]])         # rotation about world y
    T = np.eye(4)
    T[:3, :3] = up @ level
    T[:3, 3] = [0.1, -0.2, 0.4]
    return T


def _reference(bins: np.ndarray, pose: np.ndarray, intr: CameraIntrinsics) -> np.ndarray:
    """Pixel by pixel in float64: the ray's unit world direction, its height, the two bins."""
    K = len(bins)
    out = np.zeros((intr.height, intr.width, 3))
    for y in range(intr.height):
        for x in range(intr.width):
            ray = pose[:3, :3] @ np.array([(x - intr.cx) / intr.fx, (y - intr.cy) / intr.fy, 1.0])
            z = ray[2] / np.linalg.norm(ray)
            centres = (np.arange(K) + 0.5) / K * 2.0 - 1.0
            out[y, x] = [np.interp(z, centres, bins[:, ch]) for ch in range(3)]
    return out


@pytest.mark.parametrize("K", [1, 2, 7])
def test_sky_background_matches_float64_reference(K):
    rng = np.random.default_rng(K)
    bins = rng.uniform(0, 1, (K, 3))
    pose = _horizontal_camera(0.3) @ np.asarray(se3_exp(jnp.asarray(rng.normal(0, 0.2, 6))))
    got = np.asarray(C.sky_background(jnp.asarray(bins, jnp.float32),
                                      jnp.asarray(pose, jnp.float32), INTR))
    want = _reference(bins, pose, INTR)
    np.testing.assert_allclose(got, want, atol=2e-6)
    if K == 1:
        np.testing.assert_allclose(got, np.broadcast_to(bins[0], got.shape), atol=1e-7)
    else:   # the image does change over the rows (the camera sees the gradient)
        assert np.ptp(want[..., 0][:, INTR.width // 2]) > 0.05


def test_sky_background_rows_follow_the_horizon():
    """Two bins, dark below the horizon and light above it.

    A level camera's middle row is their mean, its top brighter, its bottom darker; pitched
    up, the camera sees more of the light bin.
    """
    bins = jnp.asarray([[0.1, 0.1, 0.1], [0.9, 0.9, 0.9]], jnp.float32)
    level = np.asarray(C.sky_background(bins, jnp.asarray(_horizontal_camera(0.0), jnp.float32),
                                        CameraIntrinsics(9, 9, 8.0, 8.0, 4.0, 4.0)))[..., 0]
    assert level[4, 4] == pytest.approx(0.5, abs=1e-6)
    assert level[0, 4] > 0.6 and level[8, 4] < 0.4
    up = np.asarray(C.sky_background(bins, jnp.asarray(_horizontal_camera(0.2), jnp.float32),
                                     CameraIntrinsics(9, 9, 8.0, 8.0, 4.0, 4.0)))[..., 0]
    assert up[4, 4] > level[4, 4] + 0.05


def test_sky_background_gradient_matches_finite_differences():
    bins0 = np.array([[0.2, 0.3, 0.1], [0.5, 0.4, 0.6], [0.9, 0.7, 0.8], [0.3, 0.2, 0.1]])
    w = np.random.default_rng(3).uniform(0, 1, (INTR.height, INTR.width, 3))
    with jax.enable_x64(True):
        base = jnp.asarray(_horizontal_camera(0.1))
        bins = jnp.asarray(bins0)

        def loss(xi, b):
            return jnp.sum(C.sky_background(b, base @ se3_exp(xi), INTR) * w)

        xi0 = jnp.zeros(6)
        g_pose, g_bins = jax.grad(loss, argnums=(0, 1))(xi0, bins)
        eps = 1e-6
        fd = np.array([(float(loss(xi0.at[k].set(eps), bins))
                        - float(loss(xi0.at[k].set(-eps), bins))) / (2 * eps) for k in range(6)])
        fd_b = np.array([(float(loss(xi0, bins.at[1, 2].add(eps)))
                          - float(loss(xi0, bins.at[1, 2].add(-eps)))) / (2 * eps)])
    # translation moves nothing at infinity; rotation does
    np.testing.assert_allclose(np.asarray(g_pose)[:3], 0.0, atol=1e-9)
    assert np.abs(fd[3:]).max() > 1.0
    np.testing.assert_allclose(np.asarray(g_pose), fd, rtol=2e-4, atol=1e-4 * np.abs(fd).max())
    np.testing.assert_allclose(float(g_bins[1, 2]), fd_b[0], rtol=1e-6)


@pytest.mark.parametrize("bad", [0, -2, 1.5])
def test_background_bins_must_be_a_positive_integer(bad):
    with pytest.raises(RealsimError, match="background_bins"):
        C.CalibrationConfig(background_bins=bad)


@pytest.mark.parametrize("textured_planes", [True, False])
def test_a_session_draws_its_binned_background_where_nothing_covers(textured_planes):
    """Where neither the rig's Gaussians nor a plane cover a pixel, it is the sky.

    render_batch composites the camera's sky_background there, with or without textured
    planes (the offline and the online paths).
    """
    from realsim_core.rig import load_mjmodel, load_rig

    rig = load_rig("builtin:aloha2")
    model = load_mjmodel(rig)
    W, H = 48, 27
    intr = {c: CameraIntrinsics(W, H, 0.9 * W, 0.9 * W, (W - 1) / 2, (H - 1) / 2)
            for c in rig.camera_names}
    gauss = C.rig_gaussians(model, 600, seed=0, layout="random")
    cfg = C.CalibrationConfig(levels=(1,), cycles_per_level=(1,), background_bins=5,
                              textured_planes=textured_planes, init_colours=False)
    s = C.CalibrationSession(rig, model, intr, gauss, cfg, max_frames=1)
    assert s.params["background_logits"].shape == (len(s.cameras), 5, 3)
    bins = np.random.default_rng(0).uniform(0.05, 0.95, (len(s.cameras), 5, 3))
    params = {**s.params, "background_logits": jnp.asarray(np.log(bins / (1 - bins)),
                                                            jnp.float32)}
    q = jnp.zeros((1, len(rig.joint_names)), jnp.float32)
    rgbs, alphas, _ = C.render_batch(s.static, params, q, jnp.zeros_like(q), 0, alpha=True)
    poses = C.kinematics.forward_batch_jit(s.static.km, q, params["joint_offsets"],
                                           jnp.zeros_like(q), params["fixed_deltas"],
                                           params["mounted_deltas"]).cameras[0]
    low = s.cameras.index("cam_low")     # looks over the table at the sky
    sky = np.asarray(C.sky_background(jnp.asarray(bins[low], jnp.float32), poses[low],
                                      intr["cam_low"]))
    rgb, a = np.asarray(rgbs[low][0]), np.asarray(alphas[low][0])
    if textured_planes:   # the floor and table are planes here: the sky is above them
        sky_rows = slice(0, H // 4)
    else:
        sky_rows = slice(0, H)
    free = (a[sky_rows] < 1e-4)
    assert free.sum() > 20
    far = np.abs(rgb[sky_rows][free] - sky[sky_rows][free]).max(-1)
    # the planes may still cover a few of these pixels; most must be exactly the sky
    assert np.mean(far < 1e-5) > 0.9
    # and the sky is not one colour over those pixels (the bins are used)
    assert np.ptp(sky[sky_rows][free][:, 0]) > 0.05
