"""Textured planes: the table top and the floor as ray-cast, mip-mapped texture images.

Why: surfels on a large flat surface are either too few to show its texture (calib-std's
table has a 4.2 cm checker; ~8,700 surfels of ~2 cm each blur it, and its edges are the
fixed cameras' best pose cue) or too many for the tile slots. A plane is cheap to render
exactly: intersect each pixel's ray with it, look the texture up with trilinear
filtering (mip level from the pixel's footprint, as OpenGL does), and composite it behind
the Gaussians. The gradient reaches the camera pose through the texture coordinates and
through the anti-aliased coverage of the rectangle's edges.

Planes are found in the MuJoCo model (`find_planes`): the up-facing, rectangular faces of
static geoms (box tops, plane geoms) with at least `min_area` m². Gaussians hidden from a
camera by a plane (the table's legs, the floor under it) are dropped for that camera by
`occluded_by_planes` (a Gaussian's centre decides).

Conventions: world frame, z up; a plane is a rectangle origin + a u + b v with |a| <= half_u,
|b| <= half_v, facing +normal (= u x v); texture [R, R, 3] with row index along v, column
index along u, texel centres at ((i + 0.5) / R) of the extent.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from realsim_core.types import CameraIntrinsics


class Planes(NamedTuple):
    """P horizontal textured rectangles (arrays; `names` is static metadata)."""

    origin: np.ndarray      # [P, 3] rectangle centre, world
    u: np.ndarray           # [P, 3] unit in-plane axis (texture columns)
    v: np.ndarray           # [P, 3] unit in-plane axis (texture rows), normal = u x v
    half: np.ndarray        # [P, 2] half extents along u, v (m)
    rgb: np.ndarray         # [P, 3] geom colour (initial texture)
    names: tuple = ()
    #: [P, 2] bool, True where the rectangle's edges along u / v are a clip of a larger
    #: (or infinite) plane geom, not its outline: those edges render hard and send no
    #: gradient (the real floor goes on past them). None: every edge is an outline.
    clipped: np.ndarray | None = None

    @property
    def normal(self):
        return np.cross(self.u, self.v)


# ----------------------------------------------------------------------------- detection
def plane_rect(vertices_world: np.ndarray, faces: np.ndarray, x_axis_world: np.ndarray,
               min_area: float = 0.25, tol: float = 1e-4):
    """Find the up-facing rectangle of one static mesh (world vertices).

    Returns (origin, u, v, half), or None when the up-facing,
    coplanar faces are smaller than `min_area` or do not form a rectangle aligned with the
    geom's x axis (`x_axis_world`, projected onto the plane).
    """
    tri = vertices_world[faces]
    n = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    area2 = np.linalg.norm(n, axis=1)
    up = (n[:, 2] > (1 - 1e-6) * area2) & (area2 > 0)
    if not up.any():
        return None
    top = tri[up][:, :, 2].max()
    mask = up & np.all(np.abs(tri[:, :, 2] - top) < tol, axis=1)
    area = 0.5 * area2[mask].sum()
    if area < min_area:
        return None
    u = np.array([x_axis_world[0], x_axis_world[1], 0.0])
    if np.linalg.norm(u) < 1e-6:
        u = np.array([1.0, 0.0, 0.0])
    u /= np.linalg.norm(u)
    v = np.cross([0.0, 0.0, 1.0], u)
    pts = tri[mask].reshape(-1, 3)
    a, b = pts @ u, pts @ v
    half = 0.5 * np.array([a.max() - a.min(), b.max() - b.min()])
    if abs(4 * half[0] * half[1] - area) > 1e-3 * area:      # not one full rectangle
        return None
    origin = 0.5 * (a.max() + a.min()) * u + 0.5 * (b.max() + b.min()) * v
    origin[2] = top
    return origin, u, v, half


def find_planes(model, max_extent_m: float = 1.5, min_area: float = 0.25) -> Planes:
    """Textured planes of a compiled MuJoCo model (see the module docstring)."""
    import mujoco

    from realsim_core.render.splatmesh import parts_from_mujoco

    data = mujoco.MjData(model)
    mujoco.mj_kinematics(model, data)
    rows = []
    for part in parts_from_mujoco(model, plane_extent=max_extent_m,
                                  max_plane_extent=max_extent_m):
        if int(model.body_weldid[part.body]) != 0:
            continue
        T = _world_part(data, part)
        vw = part.vertices @ T[:3, :3].T + T[:3, 3]
        rect = plane_rect(vw, np.asarray(part.faces), T[:3, 0], min_area)
        if rect is not None:
            rows.append((*rect, np.asarray(part.rgb, np.float64), part.name,
                         _clipped_axes(model, part.name, max_extent_m)))
    if not rows:
        return Planes(*(np.zeros((0, k)) for k in (3, 3, 3, 2, 3)), names=(),
                      clipped=np.zeros((0, 2), bool))
    return Planes(*(np.stack([r[i] for r in rows]).astype(np.float32) for i in range(5)),
                  names=tuple(r[5] for r in rows), clipped=np.stack([r[6] for r in rows]))


def _clipped_axes(model, geom_name: str, max_extent_m: float) -> np.ndarray:
    """[2] bool: is the geom a plane whose x / y half-size is infinite (0) or clipped?

    Clipped means larger than `max_extent_m`. `parts_from_mujoco` names a geom by its
    name, or `geom<id>` when it has none.
    """
    import mujoco

    gid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, geom_name)
    if gid < 0 and geom_name.startswith("geom") and geom_name[4:].isdigit():
        gid = int(geom_name[4:])
    if gid < 0 or int(model.geom_type[gid]) != mujoco.mjtGeom.mjGEOM_PLANE:
        return np.zeros(2, bool)
    size = np.asarray(model.geom_size[gid, :2])
    return (size <= 0) | (size > max_extent_m)


def hidden_or_on_planes(planes: Planes | None, tri: np.ndarray,
                        tol: float = 1e-4) -> np.ndarray:
    """[F] bool for world triangles [F, 3, 3] that the planes replace or hide.

    True when up-facing on a plane's rectangle (the plane renders it), or wholly below one
    inside its footprint (hidden from the cameras above). A face with some vertices on the
    plane and some below (a table top's side) is neither.
    """
    out = np.zeros(len(tri), bool)
    if planes is None:
        return out
    n = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    up = n[:, 2] > (1 - 1e-6) * np.linalg.norm(n, axis=1)
    for o, u, v, h in zip(planes.origin, planes.u, planes.v, planes.half):
        rel = tri - o
        a, b, height = np.abs(rel @ u), np.abs(rel @ v), rel[..., 2]
        on = up & np.all((np.abs(height) < tol) & (a <= h[0] + tol) & (b <= h[1] + tol), axis=1)
        # strictly inside the footprint: a wall on its boundary (the table top's side) is
        # seen from outside
        below = np.all((height < -1e-3) & (a < h[0] - tol) & (b < h[1] - tol), axis=1)
        out |= on | below
    return out


def _world_part(data, part) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = np.asarray(data.xmat[part.body]).reshape(3, 3)
    T[:3, 3] = data.xpos[part.body]
    return T @ part.local_pose


# ----------------------------------------------------------------------------- textures
def n_levels(res: int) -> int:
    """Mip levels of an R x R texture down to 4 x 4."""
    return max(1, int(np.log2(res)) - 1)


def pyramid(tex):
    """[P, R, R, 3] -> packed mip pyramid [P, sum_l (R/2^l)^2, 3] (2 x 2 box filter)."""
    levels = [tex]
    for _ in range(n_levels(tex.shape[1]) - 1):
        t = levels[-1]
        p, r = t.shape[0], t.shape[1] // 2
        levels.append(t.reshape(p, r, 2, r, 2, 3).mean(axis=(2, 4)))
    return jnp.concatenate([t.reshape(t.shape[0], -1, 3) for t in levels], axis=1)


def _sample(packed, res: int, plane, s, t, level):
    """Bilinear lookup at integer mip `level` [H, W] of texture coords s, t in [0, 1]."""
    r = jnp.right_shift(res, level)                              # texels per side
    offset = jnp.zeros_like(level)
    for lv in range(1, n_levels(res)):                           # sum of the finer levels
        offset = offset + jnp.where(level >= lv, (res >> (lv - 1)) ** 2, 0)
    rf = r.astype(s.dtype)
    x = jnp.clip(s * rf - 0.5, 0.0, rf - 1.0)
    y = jnp.clip(t * rf - 0.5, 0.0, rf - 1.0)
    x0 = jnp.clip(jnp.floor(x), 0, r - 1).astype(jnp.int32)
    y0 = jnp.clip(jnp.floor(y), 0, r - 1).astype(jnp.int32)
    x1, y1 = jnp.minimum(x0 + 1, r - 1), jnp.minimum(y0 + 1, r - 1)
    fx, fy = (x - x0)[..., None], (y - y0)[..., None]
    # one gather from the flattened pyramid: its gradient is a scatter-add of the looked-up
    # texels, not a dense texture-sized slice cotangent per lookup
    flat = packed.reshape(-1, packed.shape[-1])
    base = plane * packed.shape[1] + offset

    def at(yy, xx):
        return flat[base + yy * r + xx]

    return ((1 - fy) * ((1 - fx) * at(y0, x0) + fx * at(y0, x1))
            + fy * ((1 - fx) * at(y1, x0) + fx * at(y1, x1)))


def _trilinear(packed, res: int, plane, s, t, l0, l1, w):
    """Blend of the bilinear lookups at mip levels l0 and l1 = l0 + 1 (weight w of l1)."""
    return ((1 - w) * _sample(packed, res, plane, s, t, l0)
            + w * _sample(packed, res, plane, s, t, l1))


def pixel_rays(intr: CameraIntrinsics, dtype=jnp.float32):
    """Each pixel centre's ray in the optical frame, scaled to z = 1: [H, W, 3]."""
    ys, xs = jnp.meshgrid(jnp.arange(intr.height, dtype=dtype),
                          jnp.arange(intr.width, dtype=dtype), indexing="ij")
    return jnp.stack([(xs - intr.cx) / intr.fx, (ys - intr.cy) / intr.fy, jnp.ones_like(xs)], -1)


def render_planes(planes: Planes, packed, res: int, cam_pose, intr: CameraIntrinsics,
                  paint=None, lod_bias: float = 0.0):
    """Ray-cast the planes into one camera -> (rgb [H, W, 3], coverage [H, W]).

    packed: `pyramid(sigmoid(logits))` [P, L, 3]; cam_pose [4, 4] T_world_cam (optical).
    `rgb` is premultiplied by `coverage` (in [0, 1]), as the rasteriser's output is by its
    alpha: composite as `rgb + (1 - coverage) * background`.

    Anti-aliased edges: each plane covers the fraction `clip(0.5 + d_u, 0, 1) *
    clip(0.5 + d_v, 0, 1)` of a pixel, d the signed distance in pixels from the pixel
    centre to the rectangle's edge along each in-plane axis (the in-plane coordinate's
    margin over its image-space gradient), and the planes are composited front to back
    per pixel. Edges that only clip a larger plane (`Planes.clipped`: the floor) stay hard.
    The coverage is then a continuous function of the camera pose, so the rectangle's
    outline (the table top's, the fixed cameras' sharpest distance cue) sends a gradient
    to the pose; a hard inside test sends none (docs/calibration.md,
    "Session 13"). A pixel whose ray misses every plane has coverage 0.

    Trilinear filtering: the mip level is log2 of the pixel footprint along its longer axis
    on the plane (depth / (f cos)) over the texel size, plus `lod_bias` (levels; negative:
    sharper; at the truth -1 fits MuJoCo's images better, likely because a texture painted
    from images already holds their pixels' blur and the footprint filter adds it again:
    docs/calibration.md, "Session 37"). paint (scalar, may
    be traced): the textures get `paint` times this camera's gradient (0: the camera sees
    the planes but does not fit them); None is 1. The gradient to the camera pose is not
    scaled.
    """
    H, W = intr.height, intr.width
    dtype = cam_pose.dtype
    d_cam = pixel_rays(intr, dtype)
    rot = cam_pose[:3, :3]
    d = d_cam @ rot.T                                            # [H, W, 3] world, z_cam = 1
    e_x, e_y = rot[:, 0] / intr.fx, rot[:, 1] / intr.fy          # d's change per pixel
    c = cam_pose[:3, 3]
    origin, u, v, half = (jnp.asarray(a, dtype) for a in planes[:4])
    normal = jnp.cross(u, v)
    n_planes = origin.shape[0]
    clipped = (np.zeros((n_planes, 2), bool) if planes.clipped is None
               else np.asarray(planes.clipped, bool))
    f = 0.5 * (intr.fx + intr.fy)
    covs, cols, depths = [], [], []
    for p in range(n_planes):
        denom = d @ normal[p]                                    # < 0: ray meets the front
        front = denom < -1e-6
        safe = jnp.where(front, denom, -1.0)
        t = ((origin[p] - c) @ normal[p]) / safe                 # depth along the optical axis
        x = c + t[..., None] * d
        a, b = (x - origin[p]) @ u[p], (x - origin[p]) @ v[p]
        cov_ab = []
        for k, coord, axis in ((0, a, u[p]), (1, b, v[p])):
            if clipped[p, k]:       # hard: inside or not, no gradient
                cov_ab.append((jnp.abs(coord) <= half[p, k]).astype(dtype))
                continue
            # image-space gradient of the in-plane coordinate (m per pixel): with
            # x = c + t d and t = h / (d . n), dx/dpx = t (e - d (e . n) / (d . n))
            g = [(t[..., None] * (e - d * ((e @ normal[p]) / safe)[..., None])) @ axis
                 for e in (e_x, e_y)]
            grad = jnp.sqrt(g[0] ** 2 + g[1] ** 2 + 1e-30)
            cov_ab.append(jnp.clip(0.5 + (half[p, k] - jnp.abs(coord)) / grad, 0.0, 1.0))
        cov = cov_ab[0] * cov_ab[1]
        seen = front & (t > 0) & (cov > 0.0)
        cov = jnp.where(seen, cov, 0.0)
        s = 0.5 * (a / half[p, 0] + 1.0)
        tt = 0.5 * (b / half[p, 1] + 1.0)
        # footprint of one pixel on the plane (longer axis) over the texel size
        cos = -safe / jnp.linalg.norm(d, axis=-1)
        texel = jnp.sqrt(4 * half[p, 0] * half[p, 1]) / res
        foot = jax.lax.stop_gradient(
            jnp.where(seen, t * jnp.linalg.norm(d, axis=-1) / (f * jnp.maximum(cos, 0.05)), 1.0))
        lam = jnp.clip(lod_bias + jnp.log2(jnp.maximum(foot / texel, 1e-6)), 0.0,
                       n_levels(res) - 1.0)
        l0 = jnp.floor(lam).astype(jnp.int32)
        l1 = jnp.minimum(l0 + 1, n_levels(res) - 1)
        w = (lam - l0)[..., None]
        col = _trilinear(packed, res, p, s, tt, l0, l1, w)
        if paint is not None:   # same value and pose gradient; texture gradient x paint
            col = paint * col + (1.0 - paint) * _trilinear(jax.lax.stop_gradient(packed), res,
                                                          p, s, tt, l0, l1, w)
        covs.append(cov)
        cols.append(col)
        depths.append(jax.lax.stop_gradient(jnp.where(seen, t, jnp.inf)))
    if n_planes == 0:
        return jnp.zeros((H, W, 3), dtype), jnp.zeros((H, W), dtype)
    # front to back per pixel without a sort: plane p is seen through every plane nearer
    # along the ray (ties: the lower index is in front)
    rgb = jnp.zeros((H, W, 3), dtype)
    trans_all = jnp.ones((H, W), dtype)
    for p in range(n_planes):
        trans = jnp.ones((H, W), dtype)
        for q in range(n_planes):
            if q != p:
                nearer = (depths[q] < depths[p]) | ((depths[q] == depths[p]) & (q < p))
                trans = trans * jnp.where(nearer, 1.0 - covs[q], 1.0)
        rgb = rgb + (trans * covs[p])[..., None] * cols[p]
        trans_all = trans_all * (1.0 - covs[p])
    return rgb, 1.0 - trans_all


def occluded_by_planes(planes: Planes, points, cam_centre):
    """[N] bool: the segment camera -> point crosses a plane's rectangle before the point.

    Points on a plane (within 1 mm) count as not occluded. NumPy in, NumPy out (the host
    painting, up to 64 calls a painting, each ~40 eagerly dispatched ops in `jax.numpy`);
    otherwise `jax.numpy` (traced in the renderer).
    """
    host = isinstance(points, np.ndarray) and isinstance(cam_centre, np.ndarray)
    xp = np if host else jnp
    dtype = points.dtype
    origin, u, v, half = (xp.asarray(a, dtype) for a in planes[:4])
    normal = xp.cross(u, v)
    occ = xp.zeros(points.shape[0], bool)
    for p in range(origin.shape[0]):
        dc = (cam_centre - origin[p]) @ normal[p]              # camera height over the plane
        dx = (points - origin[p]) @ normal[p]                   # point height
        cross = (dc > 0) & (dx < -1e-3)
        s = dc / xp.where(cross, dc - dx, 1.0)                  # fraction along the segment
        x = cam_centre + s[:, None] * (points - cam_centre)
        a, b = (x - origin[p]) @ u[p], (x - origin[p]) @ v[p]
        occ = occ | (cross & (xp.abs(a) <= half[p, 0]) & (xp.abs(b) <= half[p, 1]))
    return occ


def fill_unseen_texels(colours: np.ndarray) -> np.ndarray:
    """Texture [R, R, 3] with NaN (unseen) texels -> every texel the nearest seen one's colour.

    Texture padding, as texture bakers pad their charts: the texels a camera cannot see
    (the floor under the table, a plane's far side of an outline) are still read by the
    bilinear and mip lookups of the pixels next to an occluding outline, so an arbitrary
    colour there draws a halo along that outline (docs/calibration.md, "Session 35").
    A texture with no seen texel is returned as it is.
    """
    from scipy import ndimage

    c = np.asarray(colours)
    seen = np.all(np.isfinite(c), axis=-1)
    if seen.all() or not seen.any():
        return c
    idx = ndimage.distance_transform_edt(~seen, return_distances=False, return_indices=True)
    return c[idx[0], idx[1]]


def near_plane_outline(planes: Planes, p: int, points: np.ndarray, cam_centre: np.ndarray,
                       focal_px: float, margin_px: float) -> np.ndarray:
    """[N] bool: points of plane `p` whose image lies within `margin_px` of a plane outline.

    The outlines are the rectangles' real edges (not `clipped` ones): plane p's own, and
    those of the planes the ray camera -> point crosses before the point. A pixel there
    mixes two surfaces (the renderer's anti-aliasing, the camera's own), so painting a
    texel from it bakes the outline, at the painting pose, into the texture. Distances
    in pixels use r / (f cos), r the distance from the camera and cos the incidence on
    the plane: the pixel footprint along the plane's slant (host NumPy).
    """
    pts = np.asarray(points, np.float64)
    c = np.asarray(cam_centre, np.float64)
    origin, u, v, half = (np.asarray(a, np.float64) for a in planes[:4])
    clipped = (np.zeros((len(origin), 2), bool) if planes.clipped is None
               else np.asarray(planes.clipped, bool))
    normal = np.cross(u, v)
    ray = pts - c
    out = np.zeros(len(pts), bool)
    for q in range(len(origin)):
        if clipped[q].all():
            continue
        if q == p:
            x, r = pts, np.linalg.norm(ray, axis=1)
            cos = np.abs(ray @ normal[q]) / np.maximum(r, 1e-9)
        else:
            denom = ray @ normal[q]
            s = np.where(np.abs(denom) > 1e-12,
                         ((origin[q] - c) @ normal[q]) / np.where(denom == 0, 1.0, denom), -1.0)
            ahead = (s > 0) & (s < 1)               # plane q between the camera and the point
            x = c + s[:, None] * ray
            r = s * np.linalg.norm(ray, axis=1)
            cos = np.abs(denom) / np.maximum(np.linalg.norm(ray, axis=1), 1e-9)
        px = r / (focal_px * np.maximum(cos, 0.1))  # metres per pixel on plane q
        a, b = (x - origin[q]) @ u[q], (x - origin[q]) @ v[q]
        da, db = half[q, 0] - np.abs(a), half[q, 1] - np.abs(b)   # > 0 inside
        near = np.zeros(len(pts), bool)
        for d, other, k in ((da, db, 0), (db, da, 1)):
            if not clipped[q, k]:   # near this pair of edges, within the other extent
                near |= (np.abs(d) < margin_px * px) & (other > -margin_px * px)
        out |= near if q == p else (near & ahead)
    return out


def texel_centres(planes: Planes, p: int, res: int) -> np.ndarray:
    """World positions [R, R, 3] of plane p's finest texel centres (row = v, column = u)."""
    g = (np.arange(res) + 0.5) / res * 2.0 - 1.0
    a = g[None, :] * planes.half[p, 0]
    b = g[:, None] * planes.half[p, 1]
    return (np.asarray(planes.origin[p], np.float64) + a[..., None] * planes.u[p]
            + b[..., None] * planes.v[p])
