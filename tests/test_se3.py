"""se3 helpers against scipy's Rotation (float64) and finite differences."""

import jax
import numpy as np
import pytest
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
    rng = np.random.default_rng(5)
    for deg in (0.0, 1e-3, 0.05, 1.0, 90.0, 179.0):
        for _ in range(5):
            base = Rotation.random(random_state=rng).as_matrix()
            delta = Rotation.from_rotvec(np.radians(deg) * Rotation.random(
                random_state=rng).apply([1.0, 0.0, 0.0])).as_matrix()
            assert se3.rotation_error_deg(base, base @ delta) == pytest.approx(deg, abs=1e-9)
            # a pose made in float32 (as the engine's estimates are): the error stays at
            # float32 round-off, not its square root (arccos of the trace gave ~0.01°)
            est = (base @ delta).astype(np.float32)
            assert se3.rotation_error_deg(base, est) == pytest.approx(deg, abs=2e-5)


def test_se3_log_inverts_exp_and_has_the_identity_jacobian_at_zero():
    rng = np.random.default_rng(3)
    for scale in (0.0, 1e-7, 1e-3, 0.05, 0.5, 2.0):
        for xi in rng.normal(size=(4, 6)) * scale:
            if np.linalg.norm(xi[3:]) > 3.0:
                continue
            np.testing.assert_allclose(se3.se3_log(se3.se3_exp(xi)), xi, atol=1e-12)
    # the float64 numpy log of the rotation part agrees
    T = se3.se3_exp(np.array([0.01, -0.02, 0.03, 0.2, -0.1, 0.3]))
    np.testing.assert_allclose(se3.se3_log(T)[3:], se3.so3_log(np.asarray(T)[:3, :3]),
                               atol=1e-12)
    J0 = jax.jacobian(lambda x: se3.se3_log(se3.se3_exp(x)))(np.zeros(6))
    np.testing.assert_allclose(J0, np.eye(6), atol=1e-12)
    check_grads(lambda x: se3.se3_log(se3.se3_exp(x) @ se3.se3_exp(np.full(6, 0.1))),
                (np.array([0.02, 0.0, -0.01, 0.03, -0.02, 0.01]),), order=1, modes=["rev"])
    check_grads(se3.se3_log, (np.eye(4),), order=1, modes=["rev"], eps=1e-6)


@pytest.mark.parametrize("theta", np.logspace(-6, np.log10(3.0), 25))
def test_float32_exp_log_and_jacobian_match_float64(theta):
    """The engine runs in float32: exp, log and exp's Jacobian within round-off of float64.

    The closed forms (1 - cos t) / t^2 and (t - sin t) / t^3 cancel for small angles: before
    session 29 the float32 Jacobian of `se3_exp` was 1.4 % off at 1e-4 rad and `se3_log`
    returned NaN at 1.3-2e-4 rad and translations centimetres off up to ~1e-2 rad.
    """
    import jax.numpy as jnp

    rng = np.random.default_rng(int(theta * 1e6) % 2**31)
    for _ in range(4):
        axis = rng.normal(size=3)
        xi = np.r_[rng.normal(size=3) * 0.1, axis / np.linalg.norm(axis) * theta]
        x64, x32 = jnp.asarray(xi, jnp.float64), jnp.asarray(xi, jnp.float32)
        np.testing.assert_allclose(se3.se3_exp(x32), se3.se3_exp(x64), rtol=0, atol=5e-7)
        jac64 = jax.jacfwd(lambda x: se3.se3_exp(x)[:3].ravel())(x64)
        jac32 = jax.jacrev(lambda x: se3.se3_exp(x)[:3].ravel())(x32)
        np.testing.assert_allclose(jac32, jac64, rtol=0, atol=5e-7)
        back = se3.se3_log(se3.se3_exp(x32))
        assert back.dtype == jnp.float32
        np.testing.assert_allclose(back, xi, rtol=0, atol=2e-6 if theta < 2.5 else 2e-5)
        grad = jax.grad(lambda x: jnp.sum(se3.se3_log(se3.se3_exp(x)) * jnp.arange(1.0, 7.0)))(x32)
        np.testing.assert_allclose(grad, np.arange(1.0, 7.0), rtol=0, atol=2e-3)
