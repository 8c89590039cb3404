"""SplatMesh: allocation, surfel frames, rigid motion, gradients to vertices, MuJoCo geoms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import trimesh

from realsim_core.render import rasterize, render_reference
from realsim_core.render.splatmesh import (
    MAX_PER_FACE,
    MIN_PER_FACE,
    SURFEL_SCALE,
    MeshPart,
    allocate_counts,
    body_poses_from_mjdata,
    build_from_mujoco,
    build_model,
    gaussians_in_world,
)
from realsim_core.se3 import se3_exp
from realsim_core.types import CameraIntrinsics

# float32 geometry on ~0.1 m meshes: 1e-5 m is a few hundred ulps, far below any real error.
GEOM_ATOL = 1e-5
# float64 central differences (eps 1e-6) vs autodiff: see tests/test_render.py.
GRAD_RTOL = 1e-2

MJCF = """
<mujoco>
  <asset>
    <mesh name="tet" vertex="0 0 0  0.05 0 0  0 0.05 0  0 0 0.05"/>
  </asset>
  <worldbody>
    <geom name="floor" type="plane" size="0.3 0.3 0.01" rgba="0.5 0.5 0.5 1"/>
    <body name="a" pos="0.1 0 0.2" euler="0.3 0.2 0.1">
      <joint type="hinge" axis="0 0 1"/>
      <geom name="box" type="box" size="0.03 0.02 0.01" pos="0.01 0 0" rgba="1 0 0 1"/>
      <geom name="sphere" type="sphere" size="0.02" pos="0 0.05 0" rgba="0 1 0 1"/>
      <geom name="collision_only" type="sphere" size="0.02" group="3"/>
      <body name="b" pos="0 0 0.1">
        <joint type="hinge" axis="1 0 0"/>
        <geom name="capsule" type="capsule" size="0.01 0.03" rgba="0 0 1 1"/>
        <geom name="cylinder" type="cylinder" size="0.015 0.02" pos="0.05 0 0" rgba="1 1 0 1"/>
        <geom name="ellipsoid" type="ellipsoid" size="0.02 0.01 0.015" pos="0 0.05 0"/>
        <geom name="tet" type="mesh" mesh="tet" pos="0 -0.05 0"/>
      </body>
    </body>
  </worldbody>
</mujoco>
"""


def icosphere_part(body=0, subdivisions=1):
    m = trimesh.creation.icosphere(subdivisions=subdivisions, radius=0.05)
    return MeshPart("obj", m.vertices, m.faces, body, np.eye(4), np.array([0.8, 0.3, 0.2]))


def test_allocation_by_area_within_bounds():
    areas = np.r_[np.full(50, 1e-4), np.full(50, 1.5e-4)]
    counts = allocate_counts(areas, mean_per_face=12, seed=0)
    assert counts.min() >= MIN_PER_FACE and counts.max() <= MAX_PER_FACE
    assert counts[50:].mean() > counts[:50].mean() + 3  # 1.5x the area, ~1.5x the Gaussians
    assert abs(counts.mean() - 12) < 0.5  # stochastic rounding keeps the mean
    np.testing.assert_array_equal(counts, allocate_counts(areas, mean_per_face=12, seed=0))
    extremes = allocate_counts(np.r_[np.full(10, 1e-4), [1e-9, 1.0]], seed=0)
    assert extremes[-2] == MIN_PER_FACE and extremes[-1] == MAX_PER_FACE


def test_gaussians_are_surfels_on_their_faces():
    model, params = build_model([icosphere_part()], sh_degree=1)
    g = gaussians_in_world(model, params, jnp.eye(4)[None])
    n = g.means.shape[0]
    assert params["sh"].shape == (n, 4, 3) and params["log_scales"].shape == (n, 2)
    tri = np.asarray(params["vertices"])[model.faces[model.gauss_face]]
    normal = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    normal /= np.linalg.norm(normal, axis=1, keepdims=True)
    # on the face plane, inside the triangle
    assert np.abs(np.einsum("gi,gi->g", np.asarray(g.means) - tri[:, 0], normal)).max() < GEOM_ATOL
    np.testing.assert_allclose(np.asarray(g.normals), normal, atol=GEOM_ATOL)
    # the covariance's normal direction has variance eps^2 (surfel), in-plane it is bigger
    var_n = np.einsum("gi,gij,gj->g", normal, np.asarray(g.covars, np.float64), normal)
    assert np.all(var_n < 10 * SURFEL_SCALE**2 + 1e-12)
    assert np.all(np.linalg.eigvalsh(np.asarray(g.covars, np.float64))[:, -1] > 1e-8)
    assert np.all((np.asarray(g.opacities) > 0) & (np.asarray(g.opacities) < 1))
    clamped = gaussians_in_world(model, params, jnp.eye(4)[None], clamp_opacity=True)
    assert np.all(np.asarray(clamped.opacities) == 1.0)


def test_gaussians_follow_body_and_vertices():
    model, params = build_model([icosphere_part(body=1)])
    poses = jnp.stack([jnp.eye(4), se3_exp(jnp.asarray([0.1, -0.2, 0.3, 0.4, -0.5, 0.6]))])
    g0 = gaussians_in_world(model, params, jnp.stack([jnp.eye(4), jnp.eye(4)]))
    g1 = gaussians_in_world(model, params, poses)
    r, t = np.asarray(poses[1, :3, :3]), np.asarray(poses[1, :3, 3])
    np.testing.assert_allclose(np.asarray(g1.means), np.asarray(g0.means) @ r.T + t, atol=GEOM_ATOL)
    np.testing.assert_allclose(np.asarray(g1.covars), r @ np.asarray(g0.covars) @ r.T,
                               atol=GEOM_ATOL**2)
    moved = dict(params, vertices=params["vertices"] + jnp.asarray([0.0, 0.0, 0.01]))
    g2 = gaussians_in_world(model, moved, jnp.stack([jnp.eye(4), jnp.eye(4)]))
    np.testing.assert_allclose(np.asarray(g2.means - g0.means)[:, 2], 0.01, atol=GEOM_ATOL)


def test_render_gradients_reach_vertices_and_body_pose():
    intr = CameraIntrinsics(32, 24, 40.0, 40.0, 15.5, 11.5)
    with jax.enable_x64(True):
        # 20 faces x 6 Gaussians: few (pixel, Gaussian) pairs near the alpha >= 1/255 and
        # termination thresholds, whose jumps would otherwise pollute central differences
        model, params = build_model([icosphere_part(subdivisions=0)], mean_per_face=6)
        params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), params)
        cam = jnp.asarray(np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, -0.25], [0, 0, 0, 1.0]]))
        weights = jnp.asarray(np.random.default_rng(0).normal(size=(24, 32, 3)))

        def loss(vertices, xi, renderer=rasterize):
            g = gaussians_in_world(model, dict(params, vertices=vertices), se3_exp(xi)[None])
            opts = dict(capacity=256) if renderer is rasterize else {}
            out = renderer(g.means, None, None, g.opacities, g.sh, cam, intr, covars=g.covars,
                           sh_degree=0, **opts)
            return jnp.sum((out.rgb if renderer is rasterize else out["rgb"]) * weights)

        xi = jnp.asarray([0.01, 0.0, 0.0, 0.0, 0.1, 0.0])
        gv, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(params["vertices"], xi)
        assert float(jnp.abs(gv).sum()) > 0
        # the dense reference, differentiated by plain autodiff, agrees to round-off
        rv, rx = jax.grad(lambda v, x: loss(v, x, render_reference), argnums=(0, 1))(
            params["vertices"], xi)
        np.testing.assert_allclose(np.asarray(gv), np.asarray(rv), rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(np.asarray(gx), np.asarray(rx), rtol=1e-6, atol=1e-8)
        rng = np.random.default_rng(1)
        f = jax.jit(loss)
        eps = 1e-7
        for which, grad in ((0, gv), (1, gx)):
            args = [params["vertices"], xi]
            d = jnp.asarray(rng.normal(size=args[which].shape))
            plus, minus = list(args), list(args)
            plus[which] = args[which] + eps * d
            minus[which] = args[which] - eps * d
            fd = float(f(*plus) - f(*minus)) / (2 * eps)
            an = float(jnp.sum(grad * d))
            assert abs(fd - an) <= GRAD_RTOL * abs(fd), (which, fd, an)


def test_build_from_mujoco_places_every_visual_geom():
    m = mujoco.MjModel.from_xml_string(MJCF)
    d = mujoco.MjData(m)
    d.qpos[:] = [0.4, -0.3]
    mujoco.mj_forward(m, d)
    model, params = build_from_mujoco(m, seed=1)
    assert set(model.part_names) == {"floor", "box", "sphere", "capsule", "cylinder",
                                     "ellipsoid", "tet"}
    g = gaussians_in_world(model, params, jnp.asarray(body_poses_from_mjdata(d), jnp.float32))
    means = np.asarray(g.means)
    for i, name in enumerate(model.part_names):
        gid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, name)
        assert model.part_body[i] == m.geom_bodyid[gid]
        sel = means[np.asarray(model.gauss_part) == i]
        local = (sel - d.geom_xpos[gid]) @ d.geom_xmat[gid].reshape(3, 3)  # geom frame
        size = m.geom_size[gid]
        if name == "box":
            assert np.all(np.abs(local) <= size + GEOM_ATOL)
            assert np.all(np.max(np.abs(local) / size, axis=1) > 1 - 1e-3)  # on the surface
        elif name == "sphere":
            r = np.linalg.norm(local, axis=1)
            assert np.all(r <= size[0] + GEOM_ATOL) and np.all(r > 0.9 * size[0])
        elif name == "floor":
            assert np.abs(local[:, 2]).max() < GEOM_ATOL
        elif name == "capsule":
            radial = np.linalg.norm(local[:, :2], axis=1)
            assert np.all(radial <= size[0] + GEOM_ATOL)
            assert np.all(np.abs(local[:, 2]) <= size[0] + size[1] + GEOM_ATOL)
    assert len(model.part_names) == len(set(model.part_names))
