"""Rigid-body helpers (JAX, differentiable; also accept numpy).

Conventions:
- quaternions are `xyzw` (ROS order);
- a pose is a 4x4 homogeneous matrix `T_parent_child` mapping child coordinates to parent;
- a pose delta is a 6-vector `xi = [rho (m, 3), phi (rad, 3)]` applied on the right of a
  nominal pose: `T = T_nominal @ exp(xi)` (so the delta lives in the child frame).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

_EPS = 1e-12


def skew(v):
    """[..., 3] -> [..., 3, 3] cross-product matrix."""
    x, y, z = v[..., 0], v[..., 1], v[..., 2]
    o = jnp.zeros_like(x)
    return jnp.stack(
        [jnp.stack([o, -z, y], -1), jnp.stack([z, o, -x], -1), jnp.stack([-y, x, o], -1)], -2
    )


def _sinc_terms(theta2):
    """A = sin(t)/t, B = (1-cos t)/t^2, C = (t - sin t)/t^3, safe (and smooth) at t = 0.

    Below t = 0.5 their Taylor series (next terms < 1e-7 relative): the closed forms
    cancel in float32 (1 - cos t, t - sin t), and their derivatives far more (the Jacobian
    of `se3_exp` was off by 1.4 % at t = 1e-4 and 0.06 % at 1e-3; docs/calibration.md
    "Session 29").
    """
    small = theta2 < 0.25
    t2 = jnp.where(small, 1.0, theta2)
    t = jnp.sqrt(t2)
    x, x2 = theta2, theta2 * theta2
    a = jnp.where(small, 1.0 - x / 6.0 + x2 / 120.0 - x2 * x / 5040.0, jnp.sin(t) / t)
    b = jnp.where(small, 0.5 - x / 24.0 + x2 / 720.0 - x2 * x / 40320.0,
                  (1.0 - jnp.cos(t)) / t2)
    c = jnp.where(small, 1.0 / 6.0 - x / 120.0 + x2 / 5040.0 - x2 * x / 362880.0,
                  (t - jnp.sin(t)) / (t2 * t))
    return a, b, c


def so3_exp(phi):
    """[..., 3] axis-angle (rad) -> [..., 3, 3] rotation matrix (Rodrigues)."""
    phi = jnp.asarray(phi)
    theta2 = jnp.sum(phi * phi, -1)[..., None, None]
    a, b, _ = _sinc_terms(theta2)
    k = skew(phi)
    eye = jnp.eye(3, dtype=phi.dtype)
    return eye + a * k + b * (k @ k)


def se3_exp(xi):
    """[..., 6] (rho, phi) -> [..., 4, 4] homogeneous transform."""
    xi = jnp.asarray(xi)
    rho, phi = xi[..., :3], xi[..., 3:]
    theta2 = jnp.sum(phi * phi, -1)[..., None, None]
    a, b, c = _sinc_terms(theta2)
    k = skew(phi)
    eye = jnp.eye(3, dtype=xi.dtype)
    rot = eye + a * k + b * (k @ k)
    v = eye + b * k + c * (k @ k)
    t = (v @ rho[..., None])[..., 0]
    return make_pose(rot, t)


def se3_log(T):
    """[..., 4, 4] rigid transform -> [..., 6] (rho, phi), the inverse of `se3_exp`.

    Differentiable (JAX) and smooth at the identity; meant for the small to moderate
    rotations of pose deltas (angles well below pi, where the axis is ill-defined).
    """
    T = jnp.asarray(T)
    rot, t = T[..., :3, :3], T[..., :3, 3]
    # sin(theta) * axis from the skew part, cos(theta) from the trace
    w = 0.5 * jnp.stack([rot[..., 2, 1] - rot[..., 1, 2], rot[..., 0, 2] - rot[..., 2, 0],
                         rot[..., 1, 0] - rot[..., 0, 1]], -1)
    cos = 0.5 * (jnp.trace(rot, axis1=-2, axis2=-1) - 1.0)
    s2 = jnp.sum(w * w, -1)
    small = s2 < 1e-10
    s = jnp.sqrt(jnp.where(small, 1.0, s2))
    ratio = jnp.where(small, 1.0 + s2 / 6.0, jnp.arctan2(s, cos) / s)   # theta / sin(theta)
    phi = ratio[..., None] * w
    th2 = jnp.sum(phi * phi, -1)
    # V(phi)^-1 = I - K / 2 + c K^2, c = (1 - theta sin(theta) / (2 (1 - cos(theta)))) / theta^2
    #   = (1 - x cot(x)) / theta^2 with x = theta / 2
    # The closed form cancels: in float32, 1 - cos(theta) is 0 below theta ~ 3e-4 (c = inf,
    # NaN poses) and wrong by up to 100 % below ~1e-2. Below theta = 0.5 the series (its
    # next term theta^6 / 1209600 is < 2e-7 of c) is exact to float32 round-off.
    small = th2 < 0.25
    th2s = jnp.where(small, 1.0, th2)
    x = 0.5 * jnp.sqrt(th2s)
    c = jnp.where(small, 1.0 / 12.0 + th2 / 720.0 + th2 * th2 / 30240.0,
                  (1.0 - x * jnp.cos(x) / jnp.sin(x)) / th2s)
    k = skew(phi)
    eye = jnp.eye(3, dtype=T.dtype)
    vinv = eye - 0.5 * k + c[..., None, None] * (k @ k)
    rho = (vinv @ t[..., None])[..., 0]
    return jnp.concatenate([rho, phi], -1)


def so3_log(rot):
    """[3, 3] rotation -> axis-angle [3] (numpy, float64; for evaluation, not for gradients)."""
    rot = np.asarray(rot, dtype=np.float64)
    w = np.array([rot[2, 1] - rot[1, 2], rot[0, 2] - rot[2, 0], rot[1, 0] - rot[0, 1]])
    # atan2 with the sine from the antisymmetric part: arccos of the trace alone turns a
    # rounding error ε of a float32-made rotation into an angle of ~sqrt(2ε) (0.014°)
    theta = np.arctan2(0.5 * np.linalg.norm(w), 0.5 * (np.trace(rot) - 1.0))
    if theta < 1e-7:
        return 0.5 * w
    if np.pi - theta < 1e-4:
        # near pi: axis from the symmetric part
        sym = (rot + np.eye(3)) / 2.0
        axis = sym[np.argmax(np.diag(sym))]
        axis = axis / np.linalg.norm(axis)
        return theta * axis
    return theta / (2.0 * np.sin(theta)) * w


def make_pose(rot, t):
    """[..., 3, 3], [..., 3] -> [..., 4, 4]."""
    rot = jnp.asarray(rot)
    t = jnp.asarray(t)
    top = jnp.concatenate([rot, t[..., None]], -1)
    bottom = jnp.broadcast_to(
        jnp.array([0.0, 0.0, 0.0, 1.0], dtype=top.dtype), top.shape[:-2] + (1, 4)
    )
    return jnp.concatenate([top, bottom], -2)


def pose_inverse(T):
    """Inverse of [..., 4, 4] rigid transforms."""
    rot = T[..., :3, :3]
    t = T[..., :3, 3]
    rt = jnp.swapaxes(rot, -1, -2)
    return make_pose(rt, -(rt @ t[..., None])[..., 0])


def quat_xyzw_to_matrix(q):
    """[..., 4] xyzw (normalised here) -> [..., 3, 3]."""
    q = jnp.asarray(q)
    q = q / jnp.linalg.norm(q, axis=-1, keepdims=True)
    x, y, z, w = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    return jnp.stack(
        [
            jnp.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
            jnp.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
            jnp.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1),
        ],
        -2,
    )


def matrix_to_quat_xyzw(rot) -> np.ndarray:
    """[3, 3] -> xyzw with w >= 0 (numpy float64; I/O helper, not differentiated)."""
    m = np.asarray(rot, dtype=np.float64)
    tr = np.trace(m)
    if tr > 0:
        s = np.sqrt(tr + 1.0) * 2
        q = [(m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s, 0.25 * s]
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = np.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2]) * 2
        q = [0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s, (m[2, 1] - m[1, 2]) / s]
    elif m[1, 1] > m[2, 2]:
        s = np.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2]) * 2
        q = [(m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s, (m[0, 2] - m[2, 0]) / s]
    else:
        s = np.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1]) * 2
        q = [(m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s, (m[1, 0] - m[0, 1]) / s]
    q = np.array(q)
    q /= np.linalg.norm(q)
    return q if q[3] >= 0 else -q


def rotation_error_deg(rot_est, rot_true) -> float:
    """Angle of R_est^-1 R_true in degrees (numpy; `so3_log`'s angle, exact to round-off)."""
    r = np.asarray(rot_est, np.float64).T @ np.asarray(rot_true, np.float64)
    return float(np.degrees(np.linalg.norm(so3_log(r))))
