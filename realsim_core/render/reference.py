"""Dense reference renderer: every Gaussian x every pixel, float64, no tiles.

Slow and readable, for tests only. It re-derives the projection independently of
`rasterize.py` (explicit rotation, Jacobian and covariance algebra per Gaussian) and
applies the same compositing rules (3DGS): 2D covariance dilated by `DILATION_PX2`,
`alpha = min(ALPHA_MAX, o exp(-d^T Sigma2d^-1 d / 2))`, skip `alpha < ALPHA_MIN`, stop
before transmittance falls below `T_MIN`, Gaussians in increasing view depth.

Needs `jax.config.update("jax_enable_x64", True)` to actually run in float64 (otherwise
it silently runs in float32, which is still a useful cross-check).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from realsim_core.render.rasterize import ALPHA_MAX, ALPHA_MIN, DILATION_PX2, FOV_CLAMP, T_MIN
from realsim_core.render.sh import eval_sh
from realsim_core.types import CameraIntrinsics


def _quat_to_rot(q):
    q = q / jnp.linalg.norm(q)
    x, y, z, w = q
    return jnp.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def render_reference(means, quats, scales, opacities, colors, cam_pose,
                     intrinsics: CameraIntrinsics, *, covars=None, sh_degree=None,
                     features=None, background=None, near: float = 0.01,
                     dilation: str = "add", filter_px2: float = DILATION_PX2):
    """Same arguments and meaning as `rasterize` (no tiling options).

    dilation "clamp" is computed here by an eigendecomposition of the 2D covariance
    (eigenvalues raised to at least `filter_px2`), independently of the closed form in
    `rasterize.project`.

    Returns a dict: rgb [H, W, 3], alpha [H, W], depth [H, W], features [H, W, F] or None.
    """
    intr = intrinsics
    f64 = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    means = jnp.asarray(means, f64)
    opacities = jnp.asarray(opacities, f64)
    cam_pose = jnp.asarray(cam_pose, f64)
    n = means.shape[0]
    if covars is None:
        def cov_one(q, s):
            r = _quat_to_rot(jnp.asarray(q, f64))
            return r @ jnp.diag(jnp.asarray(s, f64) ** 2) @ r.T
        covars = jax.vmap(cov_one)(quats, scales)
    covars = jnp.asarray(covars, f64)

    r_wc = cam_pose[:3, :3]
    t_wc = cam_pose[:3, 3]
    r_cw = r_wc.T

    def project_one(mean, cov):
        pc = r_cw @ (mean - t_wc)
        x, y, z = pc
        limx = FOV_CLAMP * (intr.width / 2.0) / intr.fx
        limy = FOV_CLAMP * (intr.height / 2.0) / intr.fy
        xc = jnp.clip(x / z, -limx, limx) * z
        yc = jnp.clip(y / z, -limy, limy) * z
        jac = jnp.array([[intr.fx / z, 0.0, -intr.fx * xc / z**2],
                         [0.0, intr.fy / z, -intr.fy * yc / z**2]])
        cov2d = jac @ r_cw @ cov @ r_cw.T @ jac.T
        if dilation == "clamp":
            w, v = jnp.linalg.eigh(cov2d)
            cov2d = v @ jnp.diag(jnp.maximum(w, filter_px2)) @ v.T
        else:
            cov2d = cov2d + filter_px2 * jnp.eye(2)
        uv = jnp.array([intr.fx * x / z + intr.cx, intr.fy * y / z + intr.cy])
        return uv, jnp.linalg.inv(cov2d), z

    uv, inv_cov, depth = jax.vmap(project_one)(means, covars)
    if sh_degree is None:
        rgb = jnp.asarray(colors, f64)
    else:
        rgb = eval_sh(sh_degree, jnp.asarray(colors, f64), means - t_wc)
    chans = [rgb, depth[:, None]]
    if features is not None:
        chans.append(jnp.asarray(features, f64))
    chans = jnp.concatenate(chans, -1)  # [N, C]

    visible = depth > near
    order = jnp.argsort(jnp.where(visible, depth, jnp.inf))
    vv, uu = np.mgrid[0 : intr.height, 0 : intr.width]
    pix = jnp.asarray(np.stack([uu, vv], -1).reshape(-1, 2), f64)  # [HW, 2] (u, v)

    def step(state, i):
        trans, done, acc = state
        d = pix - uv[i]  # [HW, 2]
        q = jnp.einsum("pi,ij,pj->p", d, inv_cov[i], d)
        alpha = jnp.minimum(ALPHA_MAX, opacities[i] * jnp.exp(-0.5 * q))
        ok = visible[i] & (alpha >= ALPHA_MIN) & ~done
        stop = ok & (trans * (1.0 - alpha) < T_MIN)
        use = ok & ~stop
        acc = acc + jnp.where(use, alpha * trans, 0.0)[:, None] * chans[i][None, :]
        trans = jnp.where(use, trans * (1.0 - alpha), trans)
        return (trans, done | stop, acc), None

    hw = pix.shape[0]
    init = (jnp.ones(hw, f64), jnp.zeros(hw, bool), jnp.zeros((hw, chans.shape[1]), f64))
    (trans, _, acc), _ = jax.lax.scan(step, init, order[:n])
    bg = jnp.zeros(3, f64) if background is None else jnp.asarray(background, f64)
    shape = (intr.height, intr.width)
    return {
        "rgb": (acc[:, :3] + trans[:, None] * bg).reshape(shape + (3,)),
        "alpha": (1.0 - trans).reshape(shape),
        "depth": acc[:, 3].reshape(shape),
        "features": acc[:, 4:].reshape(shape + (-1,)) if features is not None else None,
    }
