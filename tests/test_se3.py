"""se3 helpers against scipy's Rotation (float64) and finite differences."""

import jax
import numpy as np
from jax.test_util import check_grads
from scipy.spatial.transform import Rotation

from realsim_core import se3

jax.config.update("jax_enable_x64", True)


def test_so3_exp_matches_scipy():
    rng = np.random.default_rng(0)
    for phi in [*rng.normal(size=(5, 3)), np.array([1e-9, 0, 0]), np.zeros(3)]:
        np.testing.assert_allclose(
            se3.so3_exp(phi), Rotation.from_rotvec(phi).as_matrix(), atol=1e-12
        )
        if np.linalg.norm(phi) > 1e-6:
            np.testing.assert_allclose(se3.so3_log(se3.so3_exp(phi)), phi, atol=1e-9)


def test_se3_exp_translation_and_inverse():
    xi = np.array([0.1, -0.2, 0.3, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(se3.se3_exp(xi)[:3, 3], xi[:3], atol=1e-15)
    xi = np.array([0.1, -0.2, 0.3, 0.4, -0.5, 0.6])
    T = se3.se3_exp(xi)
    np.testing.assert_allclose(T @ se3.pose_inverse(T), np.eye(4), atol=1e-12)
    # exp(xi) of a pure rotation about z by 90 deg moves x to y
    Tz = se3.se3_exp(np.array([0, 0, 0, 0, 0, np.pi / 2]))
    np.testing.assert_allclose(Tz[:3, :3] @ np.array([1.0, 0, 0]), [0, 1, 0], atol=1e-12)


def test_quaternion_roundtrip_xyzw():
    rng = np.random.default_rng(1)
    for q in Rotation.random(6, random_state=2).as_quat():  # scipy: xyzw
        m = np.asarray(se3.quat_xyzw_to_matrix(q))
        np.testing.assert_allclose(m, Rotation.from_quat(q).as_matrix(), atol=1e-12)
        q2 = se3.matrix_to_quat_xyzw(m)
        assert min(np.abs(q2 - q).max(), np.abs(q2 + q).max()) < 1e-12
    assert rng is not None


def test_exp_gradients_match_finite_differences_including_zero():
    check_grads(se3.se3_exp, (np.array([0.1, 0.2, -0.1, 0.3, -0.2, 0.1]),), order=1, modes=["rev"])
    check_grads(se3.se3_exp, (np.zeros(6),), order=1, modes=["rev"], eps=1e-6)


def test_rotation_error_deg():
    r = Rotation.from_euler("z", 1.0, degrees=True).as_matrix()
    assert abs(se3.rotation_error_deg(np.eye(3), r) - 1.0) < 1e-9


def test_se3_log_inverts_exp_and_has_finite_gradients():
    """`se3_log` against `se3_exp` (round trip) and the numpy `so3_log`, and its gradients.

    Float64; gradients against central differences, at a small delta and at zero rotation.
    """
    import jax.numpy as jnp

    from realsim_core.se3 import se3_exp, se3_log, so3_log

    rng = np.random.default_rng(3)
    with jax.enable_x64(True):
        for scale in (1e-9, 1e-3, 0.3, 0.8):   # rotation angles below pi
            xi = rng.normal(size=6) * scale
            back = np.asarray(se3_log(se3_exp(jnp.asarray(xi))))
            np.testing.assert_allclose(back, xi, atol=1e-10 + 1e-8 * scale)
            T = np.asarray(se3_exp(jnp.asarray(xi)))
            np.testing.assert_allclose(back[3:], so3_log(T[:3, :3]), atol=1e-10)
        w = jnp.asarray(rng.normal(size=6))
        for xi in (jnp.asarray(rng.normal(size=6) * 0.05), jnp.zeros(6)):
            def f(x):
                return jnp.sum(w * se3_log(se3_exp(x) @ se3_exp(jnp.asarray(
                    [0.01, -0.02, 0.03, 0.02, 0.01, -0.01]))))
            g = np.asarray(jax.grad(f)(xi))
            assert np.all(np.isfinite(g))
            h = 1e-6
            fd = np.array([(f(xi + h * e) - f(xi - h * e)) / (2 * h) for e in jnp.eye(6)])
            np.testing.assert_allclose(g, fd, atol=1e-6)
