"""Textured planes (realsim_core.planes).

Detection, ray casting against a float64 reference, pose gradients against finite
differences, mip filtering, occlusion.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realsim_core import calibration as C
from realsim_core.planes import (
    Planes,
    fill_unseen_texels,
    find_planes,
    n_levels,
    near_plane_outline,
    occluded_by_planes,
    pyramid,
    render_planes,
    texel_centres,
)
from realsim_core.rig import load_mjmodel, load_rig
from realsim_core.types import CameraIntrinsics

ONE = Planes(origin=np.array([[0.1, -0.05, 0.0]]), u=np.array([[1.0, 0, 0]]),
             v=np.array([[0, 1.0, 0]]), half=np.array([[0.4, 0.25]]),
             rgb=np.array([[0.5, 0.5, 0.5]]), names=("p",))


def _look_down(height: float, tilt: float = 0.0) -> np.ndarray:
    """T_world_cam (optical: z forward) above the origin, looking down, tilted about x."""
    c, s = np.cos(tilt), np.sin(tilt)
    down = np.array([[1.0, 0, 0], [0, -1.0, 0], [0, 0, -1.0]])     # z_cam = -z_world
    tilt_x = np.array([[1, 0, 0], [0, c, -s], [0, s, c]])
    T = np.eye(4)
    T[:3, :3] = tilt_x @ down
    T[:3, 3] = [0.05, 0.02, height]
    return T


def test_find_planes_on_aloha2_and_no_gaussians_on_or_under_them():
    rig = load_rig("builtin:aloha2")
    model = load_mjmodel(rig)
    p = find_planes(model)
    assert set(p.names) == {"table_top", "floor"}
    t = p.names.index("table_top")
    np.testing.assert_allclose(p.origin[t], [0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(sorted(p.half[t]), [0.38, 0.7], atol=1e-6)
    f = p.names.index("floor")
    np.testing.assert_allclose(p.origin[f][2], -0.75, atol=1e-6)
    np.testing.assert_allclose(p.half[f], [1.5, 1.5], atol=1e-6)     # clipped to +-1.5 m
    # the floor's rectangle is a clip of a larger plane: its edges are not an outline
    np.testing.assert_array_equal(p.clipped[f], [True, True])
    np.testing.assert_array_equal(p.clipped[t], [False, False])

    g = C.rig_gaussians(model, 8000, near_bodies=C.mount_subtree_bodies(rig, model))
    still = np.asarray(model.body_weldid)[g.body] == 0
    import mujoco
    data = mujoco.MjData(model)
    mujoco.mj_kinematics(model, data)
    world = (np.einsum("nij,nj->ni", data.xmat[g.body].reshape(-1, 3, 3), g.means)
             + data.xpos[g.body])
    inside = (np.abs(world[:, 0]) < 0.69) & (np.abs(world[:, 1]) < 0.37)
    assert not np.any(still & inside & (np.abs(world[:, 2]) < 1e-3)), "surfels on the top"
    assert not np.any(still & inside & (world[:, 2] < -0.05)), "surfels under the table"
    # the old behaviour on request
    g_all = C.rig_gaussians(model, 8000, exclude_planes=False)
    w_all = np.einsum("nij,nj->ni", data.xmat[g_all.body].reshape(-1, 3, 3),
                      g_all.means) + data.xpos[g_all.body]
    s_all = np.asarray(model.body_weldid)[g_all.body] == 0
    assert np.any(s_all & (np.abs(w_all[:, 0]) < 0.69) & (np.abs(w_all[:, 1]) < 0.37)
                  & (np.abs(w_all[:, 2]) < 1e-3))


def _reference(planes, tex, pose, intr, sub=8):
    """float64 numpy reference of one plane: (rgb, hit, cover).

    Ray-plane intersection and bilinear lookup at the finest level at each pixel centre,
    and the covered fraction of each pixel's box (sub x sub rays).
    """
    H, W = intr.height, intr.width
    rgb = np.zeros((H, W, 3))
    hit = np.zeros((H, W), bool)
    cover = np.zeros((H, W))
    R = tex.shape[1]
    o, u, v, h = planes.origin[0], planes.u[0], planes.v[0], planes.half[0]
    n = np.cross(u, v)

    def ab(x, y):
        d = pose[:3, :3] @ np.array([(x - intr.cx) / intr.fx, (y - intr.cy) / intr.fy, 1.0])
        if d @ n >= 0:
            return None
        t = (o - pose[:3, 3]) @ n / (d @ n)
        p = pose[:3, 3] + t * d - o
        a, b = p @ u, p @ v
        return None if t <= 0 or abs(a) > h[0] or abs(b) > h[1] else (a, b)

    offs = (np.arange(sub) + 0.5) / sub - 0.5
    for y in range(H):
        for x in range(W):
            cover[y, x] = np.mean([ab(x + dx, y + dy) is not None for dy in offs for dx in offs])
            centre = ab(x, y)
            if centre is None:
                continue
            a, b = centre
            hit[y, x] = True
            fx = np.clip((a / h[0] + 1) / 2 * R - 0.5, 0, R - 1)
            fy = np.clip((b / h[1] + 1) / 2 * R - 0.5, 0, R - 1)
            x0, y0 = int(np.floor(fx)), int(np.floor(fy))
            x1, y1 = min(x0 + 1, R - 1), min(y0 + 1, R - 1)
            wx, wy = fx - x0, fy - y0
            rgb[y, x] = ((1 - wy) * ((1 - wx) * tex[0, y0, x0] + wx * tex[0, y0, x1])
                         + wy * ((1 - wx) * tex[0, y1, x0] + wx * tex[0, y1, x1]))
    return rgb, hit, cover


#: the anti-aliased edge is a linear ramp across one pixel along the edge's normal; the
#: exact box coverage of a straight edge differs from it by at most 1/8 (a 45 degree edge)
#: plus the 8 x 8 sampling's 1/64 steps, and at a corner the product of two ramps is used
COVER_TOL = 0.15


def test_render_planes_matches_float64_reference():
    # close and coarse texture: every pixel's footprint is below a texel (mip level 0)
    intr = CameraIntrinsics(40, 30, 30.0, 30.0, 19.5, 14.5)
    pose = _look_down(0.5, tilt=0.35)
    tex = np.random.default_rng(0).uniform(0, 1, (1, 16, 16, 3))
    with jax.enable_x64(True):
        rgb, cover = render_planes(ONE, pyramid(jnp.asarray(tex)), 16, jnp.asarray(pose), intr)
    rgb, cover = np.asarray(rgb), np.asarray(cover)
    ref, ref_hit, ref_cover = _reference(ONE, tex, pose, intr)
    inside, outside = ref_cover == 1.0, ref_cover == 0.0
    edge = ~inside & ~outside
    assert inside.sum() > 200 and outside.sum() > 50 and edge.sum() > 20   # edges in view
    np.testing.assert_allclose(cover[inside], 1.0, atol=1e-9)
    np.testing.assert_array_equal(cover[outside], 0.0)
    np.testing.assert_allclose(rgb[inside], ref[inside], atol=1e-9)
    assert np.abs(cover[edge] - ref_cover[edge]).max() < COVER_TOL
    assert np.abs(cover[edge] - ref_cover[edge]).mean() < 0.05
    # premultiplied: an edge pixel's colour is its coverage times the texture's colour
    e = edge & ref_hit & (cover > 0.05)
    np.testing.assert_allclose(rgb[e] / cover[e][:, None], ref[e], atol=0.05)


def test_the_outline_of_a_plane_sends_a_gradient_to_the_camera_pose():
    """Moving closer grows a rectangle's image area as 1/h^2.

    The coverage's derivative along the optical axis must say so (a hard inside test has
    none).
    """
    # principal point off the half-pixel grid: no edge lands exactly on a ramp's end
    # (there jnp.clip's derivative is one half)
    intr = CameraIntrinsics(64, 48, 40.0, 40.0, 31.2, 23.3)
    h = 2.0
    R = 16
    from realsim_core.se3 import se3_exp

    with jax.enable_x64(True):
        packed = pyramid(jnp.full((1, R, R, 3), 0.5))
        base = jnp.asarray(_look_down(h))

        def area(s):  # px covered, camera moved s metres forward along its optical axis
            return jnp.sum(render_planes(ONE, packed, R, base @ se3_exp(
                jnp.array([0.0, 0.0, s, 0.0, 0.0, 0.0])), intr)[1])

        a0, g = float(area(0.0)), float(jax.grad(area)(0.0))
        eps = 1e-3
        fd = (float(area(eps)) - float(area(-eps))) / (2 * eps)
        clip = ONE._replace(clipped=np.array([[True, True]]))   # a clip, not an outline
        g_clip = float(jax.grad(lambda s: jnp.sum(render_planes(clip, packed, R, base @ se3_exp(
            jnp.array([0.0, 0.0, s, 0.0, 0.0, 0.0])), intr)[1]))(0.0))
    expected = 0.8 * 0.5 * 40.0 ** 2 / h ** 2           # 160 px: the rectangle's image area
    assert a0 == pytest.approx(expected, rel=0.02)
    assert g == pytest.approx(2.0 * expected / h, rel=0.05)   # d area / d s = 2 A / h
    assert g == pytest.approx(fd, rel=0.02)
    assert g_clip == 0.0


def test_render_planes_pose_gradient_matches_finite_differences():
    intr = CameraIntrinsics(32, 24, 26.0, 26.0, 15.5, 11.5)
    R = 64
    g = (np.arange(R) + 0.5) / R
    smooth = 0.5 + 0.4 * np.sin(9 * g)[None, :, None] * np.cos(7 * g)[:, None, None]
    tex = np.broadcast_to(smooth, (R, R, 3))[None] * np.array([1.0, 0.8, 0.6])
    w = np.random.default_rng(1).uniform(0, 1, (24, 32, 3))
    from realsim_core.se3 import se3_exp

    with jax.enable_x64(True):
        packed = pyramid(jnp.asarray(tex))
        base = jnp.asarray(_look_down(0.25, tilt=0.2))

        def loss(xi):
            pose = base @ se3_exp(xi)
            rgb, _ = render_planes(ONE, packed, R, pose, intr)
            return jnp.sum(rgb * w)

        xi0 = jnp.zeros(6)
        grad = np.asarray(jax.grad(loss)(xi0))
        eps = 1e-6
        fd = np.array([(float(loss(xi0.at[k].set(eps))) - float(loss(xi0.at[k].set(-eps))))
                       / (2 * eps) for k in range(6)])
    assert np.abs(fd).max() > 1.0
    np.testing.assert_allclose(grad, fd, rtol=2e-3, atol=1e-3 * np.abs(fd).max())


def test_paint_scales_the_texture_gradient_only():
    intr = CameraIntrinsics(32, 24, 26.0, 26.0, 15.5, 11.5)
    R = 16
    tex = np.random.default_rng(2).uniform(0.2, 0.8, (1, R, R, 3))
    w = np.random.default_rng(3).uniform(0, 1, (24, 32, 3))
    from realsim_core.se3 import se3_exp

    with jax.enable_x64(True):
        base = jnp.asarray(_look_down(0.25, tilt=0.2))

        def loss(t, xi, paint):
            rgb, _ = render_planes(ONE, pyramid(t), R, base @ se3_exp(xi), intr, paint=paint)
            return jnp.sum(rgb * w)

        args = (jnp.asarray(tex), jnp.zeros(6))
        g1 = jax.grad(loss, argnums=(0, 1))(*args, None)
        g0 = jax.grad(loss, argnums=(0, 1))(*args, 0.0)
        gh = jax.grad(loss, argnums=(0, 1))(*args, 0.5)
        v1, v0 = loss(*args, None), loss(*args, 0.0)
    assert float(jnp.abs(g1[0]).max()) > 0 and float(jnp.abs(g1[1]).max()) > 0
    assert float(v0) == pytest.approx(float(v1), rel=1e-12)
    assert float(jnp.abs(g0[0]).max()) == 0.0                   # no texture gradient
    np.testing.assert_allclose(g0[1], g1[1], rtol=1e-6)         # same pose gradient
    np.testing.assert_allclose(gh[0], 0.5 * g1[0], rtol=1e-6, atol=1e-12)


def test_far_checker_is_filtered_not_aliased():
    """A 1 cm checker seen at ~4 px per 10 cm shows its mean (mip filtering), not noise."""
    R = 256
    ij = np.add.outer(np.arange(R), np.arange(R)) % 2
    tex = np.repeat(ij[None, :, :, None].astype(float), 3, -1)        # texels 0/1
    intr = CameraIntrinsics(40, 30, 20.0, 20.0, 19.5, 14.5)
    rgb, cover = render_planes(ONE, pyramid(jnp.asarray(tex, jnp.float32)), R,
                               jnp.asarray(_look_down(2.0), jnp.float32), intr)
    cover = np.asarray(cover)
    part = cover > 0.2          # edge pixels too: their colour is premultiplied by coverage
    vals = np.asarray(rgb)[part] / cover[part][:, None]
    assert vals.size > 100
    assert np.all(np.abs(vals - 0.5) < 0.05), (vals.min(), vals.max())
    assert n_levels(R) == 7


@pytest.mark.parametrize("bias", [-1.0, 0.0, 0.5])
def test_lod_bias_shifts_the_mip_level_against_a_float64_reference(bias):
    """`lod_bias` adds to the mip level, against a float64 reference.

    A 1-texel checker (0/1 at level 0, 0.5 at every coarser level) rendered trilinearly
    equals (1 - w) level0 + w 0.5 with the level lam = clip(bias + log2(range / (f cos) /
    texel)) computed here in float64.
    """
    R = 64
    ij = np.add.outer(np.arange(R), np.arange(R)) % 2
    tex = np.repeat(ij[None, :, :, None].astype(float), 3, -1)
    intr = CameraIntrinsics(40, 30, 30.0, 30.0, 19.5, 14.5)
    pose = _look_down(0.33, tilt=0.3)
    with jax.enable_x64(True):
        rgb, cover = render_planes(ONE, pyramid(jnp.asarray(tex)), R, jnp.asarray(pose), intr,
                                   lod_bias=bias)
    rgb, cover = np.asarray(rgb), np.asarray(cover)
    level0, _, ref_cover = _reference(ONE, tex, pose, intr)
    texel = np.sqrt(4 * ONE.half[0, 0] * ONE.half[0, 1]) / R
    lam = np.zeros((intr.height, intr.width))
    for y in range(intr.height):
        for x in range(intr.width):
            d = pose[:3, :3] @ np.array([(x - intr.cx) / intr.fx, (y - intr.cy) / intr.fy, 1.0])
            t = (ONE.origin[0] - pose[:3, 3])[2] / d[2]
            cos = -d[2] / np.linalg.norm(d)
            foot = t * np.linalg.norm(d) / (intr.fx * max(cos, 0.05))
            lam[y, x] = np.clip(bias + np.log2(foot / texel), 0.0, n_levels(R) - 1.0)
    w = np.where(lam < 1.0, lam, 1.0)[..., None]      # weight of level >= 1 (all 0.5)
    expected = (1.0 - w) * level0 + w * 0.5
    inside = ref_cover == 1.0
    assert inside.sum() > 600
    np.testing.assert_allclose(rgb[inside], expected[inside], atol=1e-9)
    # the levels this view spans: at bias 0 every pixel blends levels 0 and 1, at -1 the
    # checker is sampled unfiltered, at +0.5 part of the view is past level 1
    lo, hi = lam[inside].min(), lam[inside].max()
    assert {-1.0: hi == 0.0, 0.0: 0.0 < lo and hi < 1.0, 0.5: lo < 1.0 < hi}[bias], (lo, hi)


def test_occlusion_by_planes():
    cam = jnp.asarray([0.1, 0.0, 1.0])
    pts = jnp.asarray([[0.1, 0.0, -0.3],     # under the plane, below the camera: hidden
                       [0.1, 0.0, 0.2],      # above the plane: visible
                       [0.9, 0.0, -0.3],     # under, but the ray passes beside the rectangle
                       [0.2, 0.1, 0.0]])     # on the plane: visible
    occ = np.asarray(occluded_by_planes(ONE, pts, cam))
    np.testing.assert_array_equal(occ, [True, False, False, False])
    # a camera under the plane sees what is under it
    assert not np.asarray(occluded_by_planes(ONE, pts[:1], jnp.asarray([0.1, 0.0, -1.0])))[0]


def test_occlusion_by_planes_on_the_host_matches_the_traced_form():
    """NumPy in (the host painting), NumPy out, the same answer as the jax.numpy form."""
    rng = np.random.default_rng(3)
    pts = rng.uniform([-1.5, -1.5, -1.0], [1.5, 1.5, 1.0], (5000, 3)).astype(np.float32)
    for cam in ([0.1, 0.0, 1.0], [0.4, -0.2, 0.3], [0.1, 0.0, -1.0]):
        cam = np.asarray(cam, np.float32)
        host = occluded_by_planes(ONE, pts, cam)
        traced = jax.jit(lambda p, c: occluded_by_planes(ONE, p, c))(pts, cam)
        assert isinstance(host, np.ndarray) and host.dtype == bool
        np.testing.assert_array_equal(host, np.asarray(traced))
        if cam[2] > 0:
            assert 0 < host.sum() < len(pts)          # some points hidden, not all


def test_texel_centres_span_the_rectangle():
    c = texel_centres(ONE, 0, 8)
    assert c.shape == (8, 8, 3)
    np.testing.assert_allclose(c[0, 0], [0.1 - 0.4 + 0.05, -0.05 - 0.25 + 0.03125, 0.0])
    np.testing.assert_allclose(c[:, :, 2], 0.0)


@pytest.mark.parametrize("res", [3, 6])
def test_plane_texels_must_be_a_power_of_two(res):
    with pytest.raises(Exception, match="power of two"):
        C.CalibrationConfig(plane_texels=res)


def test_a_nearer_plane_hides_a_farther_one_and_blends_at_its_edge():
    """Two planes from above: the higher (nearer) one in front; its outline a blend."""
    two = Planes(origin=np.array([[0.0, 0.0, 0.0], [0.0, 0.0, -0.5]]),
                 u=np.array([[1.0, 0, 0], [1.0, 0, 0]]), v=np.array([[0, 1.0, 0], [0, 1.0, 0]]),
                 half=np.array([[0.2, 0.15], [1.0, 1.0]]),
                 rgb=np.array([[1.0, 0, 0], [0, 0, 1.0]]), names=("top", "floor"))
    R = 8
    tex = np.stack([np.broadcast_to([1.0, 0.0, 0.0], (R, R, 3)),      # top: red
                    np.broadcast_to([0.0, 0.0, 1.0], (R, R, 3))])     # floor: blue
    intr = CameraIntrinsics(48, 36, 40.0, 40.0, 23.2, 17.3)
    rgb, cover = render_planes(two, pyramid(jnp.asarray(tex, jnp.float32)), R,
                               jnp.asarray(_look_down(1.0), jnp.float32), intr)
    rgb, cover = np.asarray(rgb), np.asarray(cover)
    np.testing.assert_allclose(cover, 1.0, atol=1e-6)          # the floor fills the view
    red, blue = rgb[..., 0], rgb[..., 2]
    np.testing.assert_allclose(red + blue, 1.0, atol=1e-5)     # every pixel: red or blue
    assert (red > 0.999).sum() > 100 and (blue > 0.999).sum() > 500
    edge = (red > 0.01) & (red < 0.99)
    assert edge.sum() > 20                                     # the top's outline blends
    # the top covers its image area: 0.4 x 0.3 m at 1 m with f = 40 px
    assert red.sum() == pytest.approx(0.4 * 0.3 * 40.0 ** 2, rel=0.03)


def test_fill_unseen_texels_takes_the_nearest_seen_colour():
    c = np.full((4, 5, 3), np.nan)
    c[0, 0], c[3, 4] = (0.2, 0.4, 0.6), (0.9, 0.8, 0.7)
    f = fill_unseen_texels(c)
    np.testing.assert_array_equal(f[0, 0], c[0, 0])            # seen texels kept
    np.testing.assert_array_equal(f[3, 4], c[3, 4])
    np.testing.assert_array_equal(f[1, 1], c[0, 0])            # nearer to (0, 0)
    np.testing.assert_array_equal(f[3, 2], c[3, 4])            # nearer to (3, 4)
    assert np.isnan(fill_unseen_texels(np.full((2, 2, 3), np.nan))).all()  # nothing to copy


def test_unseen_floor_under_a_table_draws_no_halo_once_filled():
    """The floor texels a table hides are read by the lookups next to its outline.

    Painted from above, the floor under the table top is seen by no camera. Left at an
    arbitrary colour (green here), the bilinear / mip lookups of the floor pixels beside
    the top's outline read it and draw a halo; filled from the nearest seen texel, every
    pixel is a blend of the top (red) and the floor (blue) only.
    """
    two = Planes(origin=np.array([[0.0, 0.0, 0.0], [0.0, 0.0, -0.5]]),
                 u=np.array([[1.0, 0, 0], [1.0, 0, 0]]), v=np.array([[0, 1.0, 0], [0, 1.0, 0]]),
                 half=np.array([[0.2, 0.15], [3.0, 3.0]]),
                 rgb=np.array([[1.0, 0, 0], [0, 0, 1.0]]), names=("top", "floor"),
                 clipped=np.array([[False, False], [True, True]]))
    R = 64
    pose = _look_down(1.0, tilt=0.2)
    floor_pts = texel_centres(two, 1, R).reshape(-1, 3)
    hidden = occluded_by_planes(two, floor_pts.astype(np.float32),
                                pose[:3, 3].astype(np.float32)).reshape(R, R)
    assert 0 < hidden.sum() < R * R // 4
    floor = np.broadcast_to(np.array([0.0, 0.0, 1.0]), (R, R, 3)).copy()
    floor[hidden] = (0.0, 1.0, 0.0)                      # never painted: any colour
    painted = floor.copy()
    painted[hidden] = np.nan                             # what the painting saw
    intr = CameraIntrinsics(96, 72, 80.0, 80.0, 47.5, 35.5)

    def render(floor_tex):
        tex = np.stack([np.broadcast_to([1.0, 0.0, 0.0], (R, R, 3)), floor_tex])
        rgb, _ = render_planes(two, pyramid(jnp.asarray(tex, jnp.float32)), R,
                               jnp.asarray(pose, jnp.float32), intr)
        return np.asarray(rgb)

    kept = render(floor)
    assert kept[..., 1].max() > 0.5, kept[..., 1].max()   # the halo along the outline
    filled = render(fill_unseen_texels(painted))
    np.testing.assert_allclose(filled[..., 1], 0.0, atol=1e-6)
    np.testing.assert_allclose(filled[..., 0] + filled[..., 2], 1.0, atol=1e-5)


def test_near_plane_outline_marks_texels_painted_from_mixed_pixels():
    """Texels whose pixel is within the margin of an outline: the plane's own or one in front."""
    two = Planes(origin=np.array([[0.0, 0.0, 0.0], [0.0, 0.0, -0.5]]),
                 u=np.array([[1.0, 0, 0], [1.0, 0, 0]]), v=np.array([[0, 1.0, 0], [0, 1.0, 0]]),
                 half=np.array([[0.2, 0.15], [3.0, 3.0]]),
                 rgb=np.full((2, 3), 0.5), names=("top", "floor"),
                 clipped=np.array([[False, False], [True, True]]))
    c = np.array([0.0, 0.0, 1.0])
    f = 80.0                                   # 1 px = 12.5 mm on the top, 1 m away

    def floor_behind(x_on_top):                # the floor point seen past (x, 0, 0)
        e = np.array([x_on_top, 0.0, 0.0])
        return c + 1.5 * (e - c)

    own = np.array([[0.0, 0.0, 0.0], [0.195, 0.0, 0.0], [0.15, 0.0, 0.0], [0.0, 0.145, 0.0]])
    np.testing.assert_array_equal(near_plane_outline(two, 0, own, c, f, 1.0),
                                  [False, True, False, True])
    floor = np.stack([floor_behind(x) for x in (0.2, 0.2 + 0.5 / f, 0.2 + 5.0 / f)]
                     + [np.array([2.0, 0.0, -0.5])])
    np.testing.assert_array_equal(near_plane_outline(two, 1, floor, c, f, 1.0),
                                  [True, True, False, False])
    # the floor's own edges are clips, not outlines
    assert not near_plane_outline(two, 1, np.array([[2.999, 0.0, -0.5]]), c, f, 1.0)[0]
    with pytest.raises(C.RealsimError, match="plane_paint_margin_px"):
        C.CalibrationConfig(plane_paint_margin_px=-1.0)


def test_plane_edges_option_picks_hard_or_soft_outlines_per_level():
    def at(edges, level):
        static = C._Static(None, None, (), None, None, flat_levels=1, planes=FLOOR_AND_TOP,
                           plane_edges=edges)
        return np.asarray(C._planes_at_level(static, level).clipped)

    clips = np.asarray(FLOOR_AND_TOP.clipped)          # the floor's clip is hard in every mode
    np.testing.assert_array_equal(at("soft", 0), clips)
    np.testing.assert_array_equal(at("textured", 1), clips)
    assert at("textured", 0).all() and at("hard", 0).all() and at("hard", 1).all()
    # "repaint": hard at every level; the session softens them for its repaint passes
    assert at("repaint", 0).all() and at("repaint", 1).all()
    with pytest.raises(C.RealsimError, match="plane_edges"):
        C.CalibrationConfig(plane_edges="fuzzy")
    with pytest.raises(C.RealsimError, match="plane_fill"):
        C.CalibrationConfig(plane_fill="blur")


FLOOR_AND_TOP = Planes(origin=np.array([[0.0, 0.0, 0.0], [0.0, 0.0, -0.75]]),
                       u=np.array([[1.0, 0, 0], [1.0, 0, 0]]),
                       v=np.array([[0, 1.0, 0], [0, 1.0, 0]]),
                       half=np.array([[0.7, 0.38], [1.5, 1.5]]),
                       rgb=np.full((2, 3), 0.5), names=("table_top", "floor"),
                       clipped=np.array([[False, False], [True, True]]))


def test_a_session_draws_its_planes_with_the_configured_lod_bias():
    """`plane_lod_bias` reaches the planes a session renders.

    Where no Gaussian covers a pixel, render_batch draws render_planes(..., lod_bias) over
    the background; a tuple gives each camera its own bias.
    """
    rig = load_rig("builtin:aloha2")
    model = load_mjmodel(rig)
    W, H = 48, 27
    intr = {c: CameraIntrinsics(W, H, 0.9 * W, 0.9 * W, (W - 1) / 2, (H - 1) / 2)
            for c in rig.camera_names}
    gauss = C.rig_gaussians(model, 600, seed=0, layout="random", exclude_planes=True)
    R = 64
    draws = {}
    for bias in (0.0, -1.0):
        cfg = C.CalibrationConfig(levels=(1,), cycles_per_level=(1,), init_colours=False,
                                  plane_texels=R, plane_lod_bias=bias)
        s = C.CalibrationSession(rig, model, intr, gauss, cfg, max_frames=1)
        assert s.static.plane_lod_bias == bias
        tex = np.random.default_rng(1).uniform(0.05, 0.95, s.params["plane_logits"].shape)
        params = {**s.params, "plane_logits": jnp.asarray(np.log(tex / (1 - tex)), jnp.float32)}
        q = jnp.zeros((1, len(rig.joint_names)), jnp.float32)
        rgbs, alphas, _ = C.render_batch(s.static, params, q, jnp.zeros_like(q), 0, alpha=True)
        cams = C.kinematics.forward_batch_jit(s.static.km, q, params["joint_offsets"],
                                              jnp.zeros_like(q), params["fixed_deltas"],
                                              params["mounted_deltas"]).cameras[0]
        hi = s.cameras.index("cam_high")
        planes = C._planes_at_level(s.static, 0)
        prgb, cover = render_planes(planes, pyramid(jnp.asarray(tex, jnp.float32)), R, cams[hi],
                                    intr["cam_high"], lod_bias=bias)
        bg = np.asarray(jax.nn.sigmoid(params["background_logits"]))[hi, 0]
        want = np.asarray(prgb) + (1.0 - np.asarray(cover))[..., None] * bg
        free = np.asarray(alphas[hi][0]) < 1e-4
        assert free.sum() > 200
        np.testing.assert_allclose(np.asarray(rgbs[hi][0])[free], want[free], atol=1e-5)
        draws[bias] = np.asarray(rgbs[hi][0])[free]
    assert np.abs(draws[0.0] - draws[-1.0]).max() > 0.05     # the bias changes the picture
    with pytest.raises(C.RealsimError, match="repaint_lod_bias_cameras: no camera cam_top"):
        C.CalibrationSession(rig, model, intr, gauss, C.CalibrationConfig(
            levels=(1,), cycles_per_level=(1,), repaint_lod_bias_cameras=("cam_top",)))
    # one bias per camera (a tuple, camera order): each camera draws as with its own bias
    whole = {b: C.render_batch(s.static._replace(plane_lod_bias=b), params, q,
                               jnp.zeros_like(q), 0) for b in (0.0, -1.0)}
    per_cam = tuple(0.0 if c == "cam_high" else -1.0 for c in s.cameras)
    mixed = C.render_batch(s.static._replace(plane_lod_bias=per_cam), params, q,
                           jnp.zeros_like(q), 0)
    for i, c in enumerate(s.cameras):
        np.testing.assert_array_equal(np.asarray(mixed[i]), np.asarray(whole[per_cam[i]][i]))
        if c in ("cam_high", "cam_low"):     # (the wrists at q = 0 hardly see a plane)
            assert np.abs(np.asarray(whole[0.0][i]) - np.asarray(whole[-1.0][i])).max() > 0.01
