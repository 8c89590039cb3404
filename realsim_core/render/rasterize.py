"""Tile-based differentiable Gaussian rasteriser in JAX (static shapes, jit once).

Pipeline (all shapes static, so a jitted caller compiles once per image size / capacity):

1. Projection (EWA splatting, Zwicker et al. 2002 as in 3DGS): world covariance
   `Sigma = R S S^T R^T` -> camera frame -> 2D with the Jacobian of the pinhole,
   `Sigma2d = J W Sigma W^T J^T + DILATION_PX2 * I` (0.3 px^2, the 3DGS low-pass filter,
   without opacity compensation, i.e. gsplat's "classic" mode). `antialiased=True`
   multiplies the opacity by `sqrt(det(Sigma2d_raw) / det(Sigma2d))` (Mip-Splatting,
   gsplat's "antialiased" mode): a Gaussian thinner than the filter fades instead of
   widening, e.g. a surfel seen edge-on no longer adds a ~0.6 px rim to a silhouette.
2. Screen bounds: the axis-aligned box of the ellipse where `alpha >= 1/255`, i.e.
   `d^T Sigma2d^-1 d <= k^2` with `k = sqrt(2 ln(255 o))` (k <= 3.33 for o <= 1; the "3 sigma"
   box of 3DGS, but opacity-aware and exact, so cutting at the box changes nothing: the
   tile renderer agrees with the dense reference to float32 round-off).
3. Binning, sort-based like 3DGS: Gaussians are sorted by view depth, each one emits one
   (tile, depth-rank) key per overlapped tile into a fixed-size list (`max_pairs`), keys are
   sorted, and each tile takes the first `capacity` Gaussians of its run (the nearest ones).
4. Compositing per pixel, front to back, with the 3DGS rules: `alpha = min(0.99, o G)`,
   skipped when `alpha < 1/255`, stop (this Gaussian and every later one) as soon as the
   transmittance would fall below 1e-4. Termination is a mask, so shapes stay static.
   It is a `lax.scan` over the `capacity` slots, vectorised over all pixels, with a
   hand-written backward (reverse scan that recovers transmittance by division, like the
   3DGS CUDA backward): memory is O(pixels x channels), independent of `capacity`.

Overflow is reported, never silent: `RenderOutput.n_overflow_tiles` counts tiles that
had more overlapping Gaussians than `capacity` (the farthest ones were dropped), and
`n_dropped_pairs` counts (Gaussian, tile) pairs that did not fit `max_pairs`.

Conventions: `cam_pose` is T_world_cam of the ROS optical frame (z forward, x right,
y down); pixel `(u, v) = (fx x / z + cx, fy y / z + cy)` with pixel centres at integer
coordinates. Quaternions are xyzw (as `realsim_core.se3`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from realsim_core.render.sh import eval_sh
from realsim_core.se3 import quat_xyzw_to_matrix
from realsim_core.types import CameraIntrinsics

# Compositing constants of 3D Gaussian Splatting (Kerbl et al. 2023), shared with the
# dense reference renderer and with gsplat.
DILATION_PX2 = 0.3  # px^2 added to the 2D covariance diagonal (anti-aliasing low-pass)
ALPHA_MIN = 1.0 / 255.0  # a Gaussian with alpha below this is skipped for that pixel
ALPHA_MAX = 0.99  # alpha clamp
T_MIN = 1e-4  # compositing stops before transmittance would fall below this
FOV_CLAMP = 1.3  # x/z, y/z clamped to 1.3 x half-FOV tangent in the EWA Jacobian (3DGS)
_BOUND_MARGIN = 1e-3  # relative enlargement of screen bounds (float round-off safety)


class RenderOutput(NamedTuple):
    """What `rasterize` returns for one camera (add a leading batch axis under vmap).

    rgb: [H, W, 3] composited colour plus background * (1 - alpha).
    alpha: [H, W] accumulated opacity (1 - final transmittance).
    depth: [H, W] accumulated view depth sum_i w_i z_i in metres (not normalised; divide by
        alpha for the expected depth of the visible surface).
    features: [H, W, F] accumulated extra per-Gaussian channels (no background), or None.
    n_overflow_tiles: [] int32, tiles with more overlapping Gaussians than `capacity`.
    n_dropped_pairs: [] int32, (Gaussian, tile) pairs that did not fit `max_pairs`.
    max_tile_count: [] int32, the largest number of Gaussians overlapping one tile.
    """

    rgb: jax.Array
    alpha: jax.Array
    depth: jax.Array
    features: jax.Array | None
    n_overflow_tiles: jax.Array
    n_dropped_pairs: jax.Array
    max_tile_count: jax.Array


class Projected(NamedTuple):
    """Per-Gaussian screen-space quantities. All [N, ...]; pixels unless stated."""

    mean2d: jax.Array  # [N, 2] (u, v)
    conic: jax.Array  # [N, 3] (A, B, C) of the inverse 2D covariance [[A, B], [B, C]]
    depth: jax.Array  # [N] view z, metres
    extent: jax.Array  # [N, 2] half-size of the alpha >= 1/255 box (u, v), pixels
    valid: jax.Array  # [N] bool: in front of the near plane, non-degenerate, visible opacity
    k2: jax.Array  # [N] support radius^2 in Mahalanobis units: alpha >= 1/255 iff q <= k2
    opacity: jax.Array | None = None  # [N] opacity used for compositing (None: the input)


def covariance_from_quat_scale(quats, scales):
    """quats: [N, 4] xyzw (normalised here); scales: [N, 3] metres -> [N, 3, 3] m^2."""
    rot = quat_xyzw_to_matrix(quats)
    m = rot * scales[:, None, :]
    return m @ jnp.swapaxes(m, -1, -2)


def project(means, covars, opacities, cam_pose, intr: CameraIntrinsics, near: float = 0.01,
            antialiased: bool = False, normals=None, dilation: str = "add",
            filter_px2: float = DILATION_PX2):
    """EWA projection of 3D Gaussians into a pinhole camera.

    means: [N, 3] metres (world); covars: [N, 3, 3] m^2 (world); opacities: [N] in [0, 1];
    cam_pose: [4, 4] T_world_cam. Returns `Projected`. antialiased: opacity x
    sqrt(det(Sigma2d without dilation) / det(Sigma2d)) (Mip-Splatting compensation).
    normals: optional [N, 3] world normals; a Gaussian whose normal points away from the
    camera centre is culled (back faces of closed, opaque surfel meshes).
    dilation: "add" (3DGS: Sigma2d + 0.3 px^2 I) or "clamp" (raise each principal variance
    to at least 0.3 px^2: footprints wider than the filter keep their true size, so a mesh
    of small surfels is not fattened by ~0.5 px; edge-on surfels still get its width).
    filter_px2: the low-pass variance in px^2 (3DGS and gsplat: 0.3). A smaller one keeps
    the outline of a mesh of sub-pixel surfels closer to the mesh's (docs/renderer.md).
    """
    rot = cam_pose[:3, :3]
    p = (means - cam_pose[:3, 3]) @ rot  # R^T (m - t): [N, 3] camera frame
    x, y, z = p[:, 0], p[:, 1], p[:, 2]
    in_front = z > near
    zs = jnp.where(in_front, z, 1.0)
    limx = FOV_CLAMP * 0.5 * intr.width / intr.fx
    limy = FOV_CLAMP * 0.5 * intr.height / intr.fy
    tx = jnp.clip(x / zs, -limx, limx) * zs
    ty = jnp.clip(y / zs, -limy, limy) * zs
    zero = jnp.zeros_like(zs)
    jac = jnp.stack(
        [jnp.stack([intr.fx / zs, zero, -intr.fx * tx / (zs * zs)], -1),
         jnp.stack([zero, intr.fy / zs, -intr.fy * ty / (zs * zs)], -1)], -2)  # [N, 2, 3]
    m = jac @ rot.T  # J W with W = R^T
    cov2d = m @ covars @ jnp.swapaxes(m, -1, -2)
    if dilation == "clamp":
        a0, b, c0 = cov2d[:, 0, 0], cov2d[:, 0, 1], cov2d[:, 1, 1]
        half = 0.5 * (a0 - c0)
        r2 = half * half + b * b
        r = jnp.sqrt(jnp.where(r2 > 1e-12, r2, 1.0))
        rr = jnp.where(r2 > 1e-12, r, 0.0)
        lift_min = jnp.maximum(filter_px2 - (0.5 * (a0 + c0) - rr), 0.0)
        lift_max = jnp.maximum(filter_px2 - (0.5 * (a0 + c0) + rr), 0.0)
        # minor-axis projector P = v v^T = (lam_max I - Sigma) / (lam_max - lam_min), major
        # I - P; for an isotropic footprint (r = 0) every direction is minor (P = I)
        aniso = r2 > 1e-12
        pa = jnp.where(aniso, (r - half) / (2.0 * r), 1.0)
        pb = jnp.where(aniso, -b / (2.0 * r), 0.0)
        pc = jnp.where(aniso, (r + half) / (2.0 * r), 1.0)
        a = a0 + lift_min * pa + lift_max * (1.0 - pa)
        b = b + (lift_min - lift_max) * pb
        c = c0 + lift_min * pc + lift_max * (1.0 - pc)
    elif dilation == "add":
        a = cov2d[:, 0, 0] + filter_px2
        b = cov2d[:, 0, 1]
        c = cov2d[:, 1, 1] + filter_px2
    else:
        raise ValueError(f"dilation must be 'add' or 'clamp', got {dilation!r}")
    det = a * c - b * b
    if antialiased:
        det_raw = cov2d[:, 0, 0] * cov2d[:, 1, 1] - cov2d[:, 0, 1] ** 2
        ratio = jnp.clip(det_raw / jnp.where(det > 0.0, det, 1.0), 1e-12, 1.0)
        opacities = opacities * jnp.sqrt(ratio)
    ok = in_front & (det > 0.0) & (opacities > ALPHA_MIN)
    if normals is not None:
        ok = ok & (jnp.sum(normals * (cam_pose[:3, 3] - means), -1) > 0.0)
    inv_det = 1.0 / jnp.where(ok, det, 1.0)
    conic = jnp.stack([c * inv_det, -b * inv_det, a * inv_det], -1)
    mean2d = jnp.stack([intr.fx * x / zs + intr.cx, intr.fy * y / zs + intr.cy], -1)
    # alpha = o exp(-q/2) >= 1/255  <=>  q <= 2 ln(255 o) = k^2; box half-size k sqrt(Sigma_ii)
    k2 = 2.0 * jnp.log(jnp.maximum(opacities, ALPHA_MIN) / ALPHA_MIN)
    k2 = jax.lax.stop_gradient(jnp.maximum(k2, 0.0) * (1.0 + _BOUND_MARGIN) ** 2)
    k = jnp.sqrt(k2)
    extent = jax.lax.stop_gradient(
        k[:, None] * jnp.sqrt(jnp.maximum(jnp.stack([a, c], -1), 0.0)) + _BOUND_MARGIN)
    return Projected(mean2d, conic, z, extent, ok, k2, opacities if antialiased else None)


class _Bins(NamedTuple):
    gauss: jax.Array  # [T, K] int32 Gaussian index per tile slot (0 where empty)
    slot_valid: jax.Array  # [T, K] bool
    n_overflow_tiles: jax.Array
    n_dropped_pairs: jax.Array
    max_tile_count: jax.Array


def _ellipse_hits_rect(mean, conic, k2, x0, y0, size):
    """Whether {d: d^T Q d <= k2} around `mean` meets [x0, x0+size] x [y0, y0+size].

    mean: [E, 2]; conic: [E, 3] (A, B, C) of Q = [[A, B], [B, C]]; k2, x0, y0: [E].
    Exact: 0 if the centre is inside, else the minimum of the quadratic over the 4 edges.
    """
    ca, cb, cc = conic[:, 0], conic[:, 1], conic[:, 2]
    lx, hx = x0 - mean[:, 0], x0 + size - mean[:, 0]
    ly, hy = y0 - mean[:, 1], y0 + size - mean[:, 1]
    inside = (lx <= 0) & (hx >= 0) & (ly <= 0) & (hy >= 0)

    def q(dx, dy):
        return ca * dx * dx + 2.0 * cb * dx * dy + cc * dy * dy

    def vertical_edge(dx):  # x fixed, minimise over dy in [ly, hy]
        dy = jnp.clip(-cb * dx / cc, ly, hy)
        return q(dx, dy)

    def horizontal_edge(dy):
        dx = jnp.clip(-cb * dy / ca, lx, hx)
        return q(dx, dy)

    qmin = jnp.minimum(jnp.minimum(vertical_edge(lx), vertical_edge(hx)),
                       jnp.minimum(horizontal_edge(ly), horizontal_edge(hy)))
    return inside | (qmin <= k2)


def _tile_ranges(proj: Projected, ntx: int, nty: int, tile: int):
    """Tile rectangle of every Gaussian's box -> (tx0, ty0, lx, ly, count) [N] int32.

    count = lx * ly, the (Gaussian, tile) pairs it can take (0 when culled).
    """
    mean2d = jax.lax.stop_gradient(proj.mean2d)
    lo = mean2d - proj.extent
    hi = mean2d + proj.extent
    # tile t covers pixels [t*tile, t*tile + tile - 1]; pixel centres at integers
    t0 = jnp.floor(jnp.ceil(lo) / tile)
    t1 = jnp.floor(jnp.floor(hi) / tile) + 1.0
    tx0 = jnp.clip(t0[:, 0], 0, ntx).astype(jnp.int32)
    tx1 = jnp.clip(t1[:, 0], 0, ntx).astype(jnp.int32)
    ty0 = jnp.clip(t0[:, 1], 0, nty).astype(jnp.int32)
    ty1 = jnp.clip(t1[:, 1], 0, nty).astype(jnp.int32)
    lx = jnp.maximum(tx1 - tx0, 0)
    ly = jnp.maximum(ty1 - ty0, 0)
    return tx0, ty0, lx, ly, jnp.where(proj.valid, lx * ly, 0)


def pair_count(means, quats, scales, opacities, cam_pose, intrinsics: CameraIntrinsics, *,
               tile_size: int = 8, near: float = 0.01, cull_backfaces: bool = False,
               dilation: str = "add", filter_px2: float = DILATION_PX2):
    """(Gaussian, tile) pairs `rasterize` would list for this view (int32 scalar).

    The binning sorts a list of `max_pairs` entries; a caller that knows its scenes can
    size it from this count instead of the default 8 per Gaussian (the sort is most of
    the binning's time). Pairs beyond `max_pairs` are dropped (`n_dropped_pairs`).
    """
    normals = (jax.lax.stop_gradient(quat_xyzw_to_matrix(quats)[:, :, 2])
               if cull_backfaces else None)
    proj = project(means, covariance_from_quat_scale(quats, scales), opacities, cam_pose,
                   intrinsics, near, False, normals, dilation, filter_px2)
    ntx = -(-intrinsics.width // tile_size)
    nty = -(-intrinsics.height // tile_size)
    return jnp.sum(_tile_ranges(proj, ntx, nty, tile_size)[-1])


def _bin(proj: Projected, ntx: int, nty: int, tile: int, capacity: int, max_pairs: int):
    """Sort-based binning: per tile the `capacity` nearest overlapping Gaussians."""
    n = proj.depth.shape[0]
    n_tiles = ntx * nty
    if n_tiles * n + 1 >= 2**31:
        raise ValueError(f"tiles x Gaussians = {n_tiles} x {n} does not fit int32 sort keys")
    mean2d = jax.lax.stop_gradient(proj.mean2d)
    tx0, ty0, lx, ly, count = _tile_ranges(proj, ntx, nty, tile)

    order = jnp.argsort(jnp.where(proj.valid, jax.lax.stop_gradient(proj.depth), jnp.inf))
    count_s = count[order]  # in depth order
    ends = jnp.cumsum(count_s)
    total = ends[-1]
    starts = ends - count_s
    e = jnp.arange(max_pairs, dtype=jnp.int32)
    rank = jnp.searchsorted(ends, e, side="right").astype(jnp.int32)
    rank_c = jnp.minimum(rank, n - 1)
    g = order[rank_c]
    local = e - starts[rank_c]
    lxg = jnp.maximum(lx[g], 1)
    tile_id = (ty0[g] + local // lxg) * ntx + tx0[g] + local % lxg
    # exact ellipse-rectangle test: min over the tile of the Mahalanobis distance q <= k^2
    tyi, txi = jnp.divmod(tile_id, ntx)
    hit = _ellipse_hits_rect(mean2d[g], jax.lax.stop_gradient(proj.conic[g]), proj.k2[g],
                             (txi * tile).astype(mean2d.dtype), (tyi * tile).astype(mean2d.dtype),
                             tile - 1.0)
    sentinel = n_tiles * n
    keys = jnp.where((e < total) & hit, tile_id * n + rank_c, sentinel)
    keys = jnp.sort(keys)
    bounds = jnp.arange(n_tiles + 1, dtype=jnp.int32) * n
    pos = jnp.searchsorted(keys, bounds, side="left").astype(jnp.int32)
    tstart, tcount = pos[:-1], pos[1:] - pos[:-1]
    slot = jnp.arange(capacity, dtype=jnp.int32)
    idx = jnp.minimum(tstart[:, None] + slot[None, :], max_pairs - 1)
    slot_valid = slot[None, :] < tcount[:, None]
    gauss = jnp.where(slot_valid, order[keys[idx] % n], 0)
    return _Bins(
        gauss, slot_valid,
        jnp.sum(tcount > capacity).astype(jnp.int32),
        jnp.maximum(total - max_pairs, 0).astype(jnp.int32),
        jnp.max(tcount).astype(jnp.int32),
    )


def _pixel_grid(ntx: int, nty: int, tile: int, dtype):
    """[T, P] pixel centre coordinates (u, v) of every tile, T = ntx*nty, P = tile^2."""
    ty, tx = jnp.divmod(jnp.arange(ntx * nty), ntx)
    py, px = jnp.divmod(jnp.arange(tile * tile), tile)
    u = (tx[:, None] * tile + px[None, :]).astype(dtype)
    v = (ty[:, None] * tile + py[None, :]).astype(dtype)
    return u, v


def _alpha(u, v, mx, my, ca, cb, cc, op):
    """Per-pixel alpha of one slot per tile: u, v [T, P]; the rest [T]."""
    dx = u - mx[:, None]
    dy = v - my[:, None]
    power = -0.5 * (ca[:, None] * dx * dx + cc[:, None] * dy * dy) - cb[:, None] * dx * dy
    gval = jnp.exp(power)
    raw = op[:, None] * gval
    a = jnp.minimum(raw, ALPHA_MAX)
    valid = (a >= ALPHA_MIN) & (power <= 0.0)
    return dx, dy, gval, raw, a, valid


def _fwd_chunk(u, v, mx, my, ca, cb, cc, op, feat):
    """Forward compositing of a chunk of tiles.

    u, v: [Tc, P]; mx..op: [K, Tc]; feat: [K, Tc, C]. Returns out [Tc, P, C], final
    transmittance [Tc, P], and the slot index at which each pixel terminated (K if not).
    """
    n_k = op.shape[0]

    def body(carry, x):
        trans, done, nstop, out = carry
        kmx, kmy, kca, kcb, kcc, kop, kf, k = x
        _, _, _, _, a, valid = _alpha(u, v, kmx, kmy, kca, kcb, kcc, kop)
        test = trans * (1.0 - a)
        live = valid & ~done
        stop = live & (test < T_MIN)
        keep = live & ~stop
        w = jnp.where(keep, a * trans, 0.0)
        out = out + w[..., None] * kf[:, None, :]
        trans = jnp.where(keep, test, trans)
        nstop = jnp.where(stop, k, nstop)
        return (trans, done | stop, nstop, out), None

    init = (jnp.ones(u.shape, u.dtype), jnp.zeros(u.shape, bool),
            jnp.full(u.shape, n_k, jnp.int32), jnp.zeros(u.shape + feat.shape[-1:], u.dtype))
    xs = (mx, my, ca, cb, cc, op, feat, jnp.arange(n_k, dtype=jnp.int32))
    (trans, _, nstop, out), _ = jax.lax.scan(body, init, xs)
    return out, trans, nstop


def _bwd_chunk(u, v, mx, my, ca, cb, cc, op, feat, trans_f, nstop, g_out, g_trans):
    """Backward of `_fwd_chunk` (3DGS-style, back to front).

    Shapes as `_fwd_chunk` plus trans_f, nstop, g_trans [Tc, P] and g_out [Tc, P, C].
    Returns per-slot cotangents [K, Tc] for mx, my, ca, cb, cc, op and [K, Tc, C] for feat.
    """
    n_k, n_c = op.shape[0], feat.shape[-1]
    g_tf = g_trans * trans_f  # dL/dT_final * T_final
    # Channel-major cotangent, one [Tc, P] array per channel, and one reduction per
    # quantity: XLA:CPU runs a channel-last [Tc, P, C] (C ~ 4) product or a stacked
    # [Tc, P, 6 + C] reduction in the scan body ~5x slower (render-std, 2026-12-02).
    g_ch = [g_out[..., c] for c in range(n_c)]

    def psum(x):  # sum over each tile's pixels: [Tc, P] -> [Tc]
        return jnp.sum(x, 1)

    def body(carry, x):
        # trans: transmittance after this slot; g_acc: g . sum_{j > i} w_j f_j  (both [Tc, P])
        trans, g_acc = carry
        kmx, kmy, kca, kcb, kcc, kop, kf, k = x
        dx, dy, gval, raw, a, valid = _alpha(u, v, kmx, kmy, kca, kcb, kcc, kop)
        keep = valid & (k < nstop)
        one_m = 1.0 - a
        t_before = jnp.where(keep, trans / one_m, trans)
        w = jnp.where(keep, a * t_before, 0.0)
        g_dot_f = sum(g_ch[c] * kf[:, c, None] for c in range(n_c))
        d_a = jnp.where(keep, t_before * g_dot_f - (g_acc + g_tf) / one_m, 0.0)
        g_acc = g_acc + w * g_dot_f
        d_raw = jnp.where(raw < ALPHA_MAX, d_a, 0.0)
        d_pow = d_raw * raw
        r_dx, r_dy = psum(d_pow * dx), psum(d_pow * dy)
        d_mx = kca * r_dx + kcb * r_dy
        d_my = kcc * r_dy + kcb * r_dx
        d_f = jnp.stack([psum(w * g_ch[c]) for c in range(n_c)], -1)
        grads = (d_mx, d_my, -0.5 * psum(d_pow * dx * dx), -psum(d_pow * dx * dy),
                 -0.5 * psum(d_pow * dy * dy), psum(d_raw * gval), d_f)
        return (t_before, g_acc), grads

    xs = (mx, my, ca, cb, cc, op, feat, jnp.arange(n_k, dtype=jnp.int32))
    _, grads = jax.lax.scan(body, (trans_f, jnp.zeros_like(trans_f)), xs, reverse=True)
    return grads


@functools.cache
def _make_composite(ntx: int, nty: int, tile: int, chunk_pixels: int = 1 << 30):
    """Front-to-back compositing over slots with a custom (reverse-scan) VJP.

    Inputs [T, K] (mx, my, A, B, C, opacity) and feat [T, K, C]; empty slots have
    opacity 0. Returns out [T, P, C] = sum_i w_i f_i and final transmittance [T, P].
    Tiles can be processed in chunks of `chunk_pixels` pixels (`lax.map`) to keep the scan
    state in cache; measured slower on the 2-core dev machine, so the default is one chunk.
    """
    n_tiles = ntx * nty
    tc = max(1, min(n_tiles, chunk_pixels // (tile * tile)))
    n_chunks = -(-n_tiles // tc)
    pad = n_chunks * tc - n_tiles

    def chunked(x):  # [T, K, ...] -> [n_chunks, K, Tc, ...] (padded tiles are empty)
        x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
        x = x.reshape((n_chunks, tc) + x.shape[1:])
        return jnp.swapaxes(x, 1, 2)

    def unchunked(x):  # [n_chunks, K, Tc, ...] -> [T, K, ...]
        x = jnp.swapaxes(x, 1, 2)
        return x.reshape((n_chunks * tc,) + x.shape[2:])[:n_tiles]

    def pix_chunks(x):  # [n_chunks, Tc, ...] <-> [T, ...]
        x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
        return x.reshape((n_chunks, tc) + x.shape[1:])

    def unpix(x):
        return x.reshape((n_chunks * tc,) + x.shape[2:])[:n_tiles]

    def forward(*args):
        u, v = _pixel_grid(ntx, nty, tile, args[-1].dtype)
        xs = (pix_chunks(u), pix_chunks(v)) + tuple(chunked(a) for a in args)
        out, trans, nstop = jax.lax.map(lambda c: _fwd_chunk(*c), xs)
        return unpix(out), unpix(trans), unpix(nstop)

    @jax.custom_vjp
    def composite(mx, my, ca, cb, cc, op, feat):
        out, trans, _ = forward(mx, my, ca, cb, cc, op, feat)
        return out, trans

    def fwd(*args):
        out, trans, nstop = forward(*args)
        return (out, trans), (args, trans, nstop)

    def bwd(res, cts):
        args, trans_f, nstop = res
        g_out, g_trans = cts
        u, v = _pixel_grid(ntx, nty, tile, args[-1].dtype)
        xs = ((pix_chunks(u), pix_chunks(v)) + tuple(chunked(a) for a in args)
              + tuple(pix_chunks(x) for x in (trans_f, nstop, g_out, g_trans)))
        grads = jax.lax.map(lambda c: _bwd_chunk(*c), xs)
        return tuple(unchunked(g) for g in grads)

    composite.defvjp(fwd, bwd)
    return composite


def _check_shapes(means, opacities, colors, features, sh_degree):
    n = means.shape[0]
    assert means.shape == (n, 3), f"means must be [N, 3], got {means.shape}"
    assert opacities.shape == (n,), f"opacities must be [N], got {opacities.shape}"
    if sh_degree is None:
        assert colors.shape == (n, 3), f"colors must be [N, 3], got {colors.shape}"
    else:
        nb = (sh_degree + 1) ** 2
        assert colors.ndim == 3 and colors.shape[0] == n and colors.shape[1] >= nb, (
            f"SH colors must be [N, >={nb}, 3], got {colors.shape}")
    if features is not None:
        assert features.ndim == 2 and features.shape[0] == n, (
            f"features must be [N, F], got {features.shape}")


def rasterize(
    means,
    quats,
    scales,
    opacities,
    colors,
    cam_pose,
    intrinsics: CameraIntrinsics,
    *,
    covars=None,
    sh_degree: int | None = None,
    features=None,
    background=None,
    tile_size: int = 8,
    capacity: int = 64,
    max_pairs: int | None = None,
    near: float = 0.01,
    backend: str = "jax",
    antialiased: bool = False,
    cull_backfaces: bool = False,
    dilation: str = "add",
    filter_px2: float = DILATION_PX2,
) -> RenderOutput:
    """Render 3D Gaussians into one pinhole camera (differentiable in every array input).

    means: [N, 3] metres, world frame.
    quats: [N, 4] xyzw rotations (need not be normalised); ignored when `covars` is given.
    scales: [N, 3] metres (standard deviations along the rotated axes); ignored with `covars`.
    opacities: [N] in [0, 1].
    colors: [N, 3] RGB, or SH coefficients [N, (sh_degree+1)**2, 3] when `sh_degree` is set.
    cam_pose: [4, 4] T_world_cam (optical frame: z forward, x right, y down).
    intrinsics: static `CameraIntrinsics` (pixels).
    covars: optional [N, 3, 3] world covariances (m^2) instead of quats/scales.
    features: optional [N, F] extra channels composited like colour (normals, ids, masks).
    background: optional [3] colour behind the Gaussians (default black).
    tile_size, capacity: tile edge in pixels and Gaussians kept per tile (static).
    max_pairs: static size of the (Gaussian, tile) pair list (default 8 N).
    near: metres; Gaussians closer than this are culled.
    antialiased: Mip-Splatting opacity compensation of the 0.3 px^2 dilation (static; jax
    backend only): default off, the 3DGS "classic" rule.
    cull_backfaces: drop Gaussians whose local z axis (the surfel normal, from `quats`)
    points away from the camera (static; jax backend; needs quats). For closed meshes
    with outward normals: the hidden back layer then takes no tile slots.
    dilation: "add" (3DGS, default) or "clamp" (principal variances raised to the filter; see
    `project`). Static; jax backend.
    filter_px2: variance of the low-pass filter in px^2 (static; the gsplat backend has
    only the default 0.3).
    backend: "jax" (this file, any device) or "gsplat" (CUDA + torch + gsplat).
    """
    if cull_backfaces and (covars is not None or quats is None):
        raise ValueError("cull_backfaces needs quats (the surfel normals), not covars")
    if backend == "gsplat":
        if antialiased or cull_backfaces or dilation != "add" or filter_px2 != DILATION_PX2:
            raise ValueError("antialiased/cull_backfaces/dilation/filter_px2 are implemented "
                             "for the jax backend only")
        from realsim_core.render.gsplat_backend import rasterize_gsplat

        return rasterize_gsplat(
            means, quats, scales, opacities, colors, cam_pose, intrinsics, covars=covars,
            sh_degree=sh_degree, features=features, background=background, near=near)
    if backend != "jax":
        raise ValueError(f"unknown backend {backend!r} (expected 'jax' or 'gsplat')")
    return _rasterize_jax(
        means, quats, scales, opacities, colors, cam_pose, features, background, covars,
        intrinsics=intrinsics, sh_degree=sh_degree, tile_size=tile_size, capacity=capacity,
        max_pairs=max_pairs, near=near, antialiased=antialiased, cull_backfaces=cull_backfaces,
        dilation=dilation, filter_px2=float(filter_px2))


@functools.partial(jax.jit, static_argnames=(
    "intrinsics", "sh_degree", "tile_size", "capacity", "max_pairs", "near", "antialiased",
    "cull_backfaces", "dilation", "filter_px2"))
def _rasterize_jax(means, quats, scales, opacities, colors, cam_pose, features, background,
                   covars, *, intrinsics, sh_degree, tile_size, capacity, max_pairs, near,
                   antialiased=False, cull_backfaces=False, dilation="add",
                   filter_px2=DILATION_PX2):
    _check_shapes(means, opacities, colors, features, sh_degree)
    n = means.shape[0]
    dtype = means.dtype
    normals = None
    if cull_backfaces:
        normals = jax.lax.stop_gradient(quat_xyzw_to_matrix(quats)[:, :, 2])
    if covars is None:
        covars = covariance_from_quat_scale(quats, scales)
    proj = project(means, covars, opacities, cam_pose, intrinsics, near, antialiased, normals,
                   dilation, filter_px2)
    if proj.opacity is not None:
        opacities = proj.opacity
    if sh_degree is not None:
        rgb = eval_sh(sh_degree, colors, means - cam_pose[:3, 3])
    else:
        rgb = colors
    feats = [rgb.astype(dtype), proj.depth[:, None]]
    if features is not None:
        feats.append(features.astype(dtype))
    feats = jnp.concatenate(feats, -1)

    ntx = -(-intrinsics.width // tile_size)
    nty = -(-intrinsics.height // tile_size)
    pairs = max_pairs if max_pairs is not None else 8 * n
    bins = _bin(proj, ntx, nty, tile_size, capacity, pairs)
    # one row gather (and one row scatter-add in the backward) instead of one per attribute
    packed = jnp.concatenate(
        [proj.mean2d, proj.conic, opacities[:, None].astype(dtype), feats], -1)  # [N, 6 + C]
    rows = packed[bins.gauss]  # [T, K, 6 + C]
    op = jnp.where(bins.slot_valid, rows[..., 5], 0.0)
    composite = _make_composite(ntx, nty, tile_size)
    out, trans = composite(rows[..., 0], rows[..., 1], rows[..., 2], rows[..., 3],
                           rows[..., 4], op, rows[..., 6:])

    def to_image(x):  # [T, P, ...] -> [H, W, ...]
        rest = x.shape[2:]
        x = x.reshape((nty, ntx, tile_size, tile_size) + rest)
        x = jnp.moveaxis(x, 2, 1).reshape((nty * tile_size, ntx * tile_size) + rest)
        return x[: intrinsics.height, : intrinsics.width]

    out = to_image(out)
    trans = to_image(trans)
    bg = jnp.zeros(3, dtype) if background is None else background.astype(dtype)
    rgb_img = out[..., :3] + trans[..., None] * bg
    feat_img = out[..., 4:] if features is not None else None
    return RenderOutput(rgb_img, 1.0 - trans, out[..., 3], feat_img, bins.n_overflow_tiles,
                        bins.n_dropped_pairs, bins.max_tile_count)
