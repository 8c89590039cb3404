"""Real spherical harmonics colours, degree 0-3, with the 3D Gaussian Splatting conventions.

Coefficients are `sh: [N, (degree + 1)**2, 3]`; the colour of a Gaussian seen along the unit
direction `d` (world frame, from the camera centre to the Gaussian) is
`max(sum_k C_k Y_k(d) sh_k + 0.5, 0)`, exactly as in Kerbl et al. 2023 / gsplat, so a
degree-0 Gaussian with colour `c` has `sh[:, 0] = (c - 0.5) / SH_C0`.
"""

from __future__ import annotations

import jax.numpy as jnp

SH_C0 = 0.28209479177387814
SH_C1 = 0.4886025119029199
SH_C2 = (1.0925484305920792, -1.0925484305920792, 0.31539156525252005,
         -1.0925484305920792, 0.5462742152960396)
SH_C3 = (-0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154,
         -0.4570457994644658, 1.445305721320277, -0.5900435899266435)


def num_sh_bases(degree: int) -> int:
    """Number of SH coefficients per colour channel for `degree` (0-3)."""
    if degree not in (0, 1, 2, 3):
        raise ValueError(f"SH degree must be 0..3, got {degree}")
    return (degree + 1) ** 2


def rgb_to_sh0(rgb):
    """[..., 3] colour in [0, 1] -> [..., 3] degree-0 coefficient."""
    return (rgb - 0.5) / SH_C0


def eval_sh(degree: int, sh, dirs):
    """Colours from SH coefficients.

    degree: static int 0..3; sh: [N, >=(degree+1)**2, 3]; dirs: [N, 3] (normalised here).
    Returns [N, 3] colours (>= 0, unbounded above, like 3DGS).
    """
    num_sh_bases(degree)
    res = SH_C0 * sh[:, 0]
    if degree > 0:
        d = dirs / jnp.linalg.norm(dirs, axis=-1, keepdims=True)
        x, y, z = d[:, 0:1], d[:, 1:2], d[:, 2:3]
        res = res - SH_C1 * y * sh[:, 1] + SH_C1 * z * sh[:, 2] - SH_C1 * x * sh[:, 3]
        if degree > 1:
            xx, yy, zz = x * x, y * y, z * z
            xy, yz, xz = x * y, y * z, x * z
            res = (res + SH_C2[0] * xy * sh[:, 4] + SH_C2[1] * yz * sh[:, 5]
                   + SH_C2[2] * (2.0 * zz - xx - yy) * sh[:, 6]
                   + SH_C2[3] * xz * sh[:, 7] + SH_C2[4] * (xx - yy) * sh[:, 8])
            if degree > 2:
                res = (res + SH_C3[0] * y * (3.0 * xx - yy) * sh[:, 9]
                       + SH_C3[1] * xy * z * sh[:, 10]
                       + SH_C3[2] * y * (4.0 * zz - xx - yy) * sh[:, 11]
                       + SH_C3[3] * z * (2.0 * zz - 3.0 * xx - 3.0 * yy) * sh[:, 12]
                       + SH_C3[4] * x * (4.0 * zz - xx - yy) * sh[:, 13]
                       + SH_C3[5] * z * (xx - yy) * sh[:, 14]
                       + SH_C3[6] * x * (xx - 3.0 * yy) * sh[:, 15])
    return jnp.maximum(res + 0.5, 0.0)
