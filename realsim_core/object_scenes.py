"""Procedural test objects and object-centric views rendered by MuJoCo (paper 5.1 protocol).

`procedural_mesh(kind)` makes the benchmark shapes (metres, object frame, centred):
box, cylinder, sphere, bent capsule (a capsule swept along a 90 degree arc) and a
non-convex L-shaped block. `object_centric_views(...)` renders one object from cameras on
the upper hemisphere at a distance of `distance_factor` x its extent, with MuJoCo's own
renderer (fixed directional lights, no specular, so appearance is view independent), and
returns `objects.View`s with the true masks from MuJoCo's segmentation render.
"""

from __future__ import annotations

import math

import numpy as np

from realsim_core.objects import View
from realsim_core.types import CameraIntrinsics

KINDS = ("box", "cylinder", "sphere", "bent_capsule", "l_shape")
COLOURS = {"box": (0.85, 0.2, 0.1), "cylinder": (0.1, 0.55, 0.9), "sphere": (0.95, 0.8, 0.1),
           "bent_capsule": (0.2, 0.75, 0.3), "l_shape": (0.75, 0.3, 0.75)}


def procedural_mesh(kind: str):
    """(vertices [V, 3] m, faces [F, 3]) of a benchmark shape, centred at its bbox centre."""
    import trimesh

    if kind == "box":
        m = trimesh.creation.box(extents=(0.05, 0.035, 0.04))
    elif kind == "cylinder":
        m = trimesh.creation.cylinder(radius=0.022, height=0.06, sections=48)
    elif kind == "sphere":
        m = trimesh.creation.icosphere(subdivisions=4, radius=0.025)
    elif kind == "bent_capsule":
        m = _swept_tube(0.03, 0.011)
    elif kind == "l_shape":
        m = _l_prism()
    else:
        raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
    v = np.asarray(m.vertices, np.float64)
    v = v - 0.5 * (v.min(0) + v.max(0))
    return v, np.asarray(m.faces, np.int64)


def _swept_tube(R: float, r: float, n_arc: int = 32, n_ring: int = 16):
    """Closed tube of radius r along a quarter circle of radius R with hemispherical caps."""
    import trimesh

    verts, faces = [], []
    # parametrise: arc angle a in [0, pi/2] plus cap angles beyond both ends
    n_cap = 8
    rings = []
    for i in range(n_cap - 1, 0, -1):  # start cap: rings shrink towards the pole
        t = 0.5 * math.pi * i / n_cap
        rings.append((0.0, r * math.cos(t), -r * math.sin(t)))
    for i in range(n_arc + 1):
        rings.append((0.5 * math.pi * i / n_arc, r, 0.0))
    for i in range(1, n_cap):
        t = 0.5 * math.pi * i / n_cap
        rings.append((0.5 * math.pi, r * math.cos(t), r * math.sin(t)))
    for a, rr, along in rings:
        c = np.array([R * math.cos(a), R * math.sin(a), 0.0])
        tangent = np.array([-math.sin(a), math.cos(a), 0.0])
        radial = np.array([math.cos(a), math.sin(a), 0.0])
        up = np.array([0.0, 0.0, 1.0])
        for j in range(n_ring):
            b = 2 * math.pi * j / n_ring
            verts.append(c + along * tangent + rr * (math.cos(b) * radial + math.sin(b) * up))
    nr = len(rings)
    for i in range(nr - 1):
        for j in range(n_ring):
            a0, a1 = i * n_ring + j, i * n_ring + (j + 1) % n_ring
            b0, b1 = a0 + n_ring, a1 + n_ring
            faces += [(a0, b0, b1), (a0, b1, a1)]
    verts = np.array(verts)
    # poles
    c0 = np.array([R, 0.0, 0.0]) - np.array([0.0, 1.0, 0.0]) * r
    c1 = np.array([0.0, R, 0.0]) + np.array([-1.0, 0.0, 0.0]) * r
    i0, i1 = len(verts), len(verts) + 1
    verts = np.vstack([verts, c0, c1])
    last = (nr - 1) * n_ring
    for j in range(n_ring):
        faces.append((i0, j, (j + 1) % n_ring))
        faces.append((i1, last + (j + 1) % n_ring, last + j))
    m = trimesh.Trimesh(verts, np.array(faces), process=True)
    if m.volume < 0:
        m.invert()
    return m


def _l_prism(h: float = 0.03):
    """L-shaped block (non-convex, watertight): an extruded L polygon, height h."""
    import trimesh

    p = np.array([(-0.03, -0.025), (0.03, -0.025), (0.03, 0.025), (0.01, 0.025),
                  (0.01, -0.005), (-0.03, -0.005)])
    tris = np.array([(0, 1, 4), (0, 4, 5), (1, 2, 3), (1, 3, 4)])  # ccw cover of the L
    n = len(p)
    verts = np.vstack([np.c_[p, np.full(n, -h / 2)], np.c_[p, np.full(n, h / 2)]])
    faces = [t[::-1] for t in tris] + [t + n for t in tris]
    for i in range(n):
        j = (i + 1) % n
        faces += [(i, j, j + n), (i, j + n, i + n)]
    m = trimesh.Trimesh(verts, np.array(faces), process=True)
    m = m.subdivide().subdivide()  # smaller faces: an even surface sampling for Chamfer
    if m.volume < 0:
        m.invert()
    return m


def hemisphere_directions(n: int, seed: int = 0, min_elevation_deg: float = 10.0):
    """N unit vectors on the upper hemisphere (Fibonacci spiral in z, elevation >= min)."""
    rng = np.random.default_rng(seed)
    zmin = math.sin(math.radians(min_elevation_deg))
    i = np.arange(n) + 0.5
    z = zmin + (1 - zmin) * i / n
    phi = i * math.pi * (3 - math.sqrt(5)) + rng.uniform(0, 2 * math.pi)
    r = np.sqrt(1 - z * z)
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], -1)


def look_at_optical(eye, target) -> np.ndarray:
    """T_world_optical [4, 4]: z towards target, y down-ish (world z up)."""
    z = np.asarray(target, float) - np.asarray(eye, float)
    z /= np.linalg.norm(z)
    up = np.array([0.0, 0.0, 1.0])
    x = np.cross(z, up)
    if np.linalg.norm(x) < 1e-6:
        x = np.array([1.0, 0.0, 0.0])
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    T = np.eye(4)
    T[:3, :3] = np.stack([x, y, z], 1)
    T[:3, 3] = eye
    return T


def object_centric_views(vertices: np.ndarray, faces: np.ndarray, rgb=(0.8, 0.3, 0.2),
                         n_views: int = 50, resolution: int = 512, fovy_deg: float = 45.0,
                         distance_factor: float = 2.5, seed: int = 0,
                         pose: np.ndarray | None = None):
    """Render the object (world pose `pose`, default identity) from the upper hemisphere.

    Returns (views [n] with true masks, T_world_object [4, 4]). Camera distance =
    distance_factor x the object's bounding-box diagonal.
    """
    import mujoco

    from realsim_core.rig import MJCF_TO_OPTICAL
    from realsim_core.se3 import matrix_to_quat_xyzw
    from realsim_core.synth import _ensure_gl, make_renderer

    _ensure_gl()
    pose = np.eye(4) if pose is None else np.asarray(pose, np.float64)
    spec = mujoco.MjSpec()
    spec.visual.headlight.ambient = [0.45, 0.45, 0.45]
    spec.visual.headlight.diffuse = [0.0, 0.0, 0.0]
    spec.visual.headlight.specular = [0.0, 0.0, 0.0]
    spec.visual.global_.offwidth = resolution
    spec.visual.global_.offheight = resolution
    for d in ((0.3, 0.2, -1.0), (-0.4, -0.3, -0.6)):
        spec.worldbody.add_light(type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL, dir=d,
                                 diffuse=[0.4, 0.4, 0.4], specular=[0, 0, 0], castshadow=False)
    spec.add_mesh(name="obj", uservert=np.asarray(vertices, np.float32).ravel(),
                  userface=np.asarray(faces, np.int32).ravel())
    spec.add_material(name="mat", rgba=[*rgb, 1.0], specular=0.0, shininess=0.0,
                      reflectance=0.0)
    x, y, z, w = matrix_to_quat_xyzw(pose[:3, :3])
    body = spec.worldbody.add_body(name="obj", pos=pose[:3, 3], quat=[w, x, y, z])
    body.add_geom(type=mujoco.mjtGeom.mjGEOM_MESH, meshname="obj", material="mat")
    spec.worldbody.add_camera(name="cam", fovy=fovy_deg)
    model = spec.compile()
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    v_world = np.asarray(vertices) @ pose[:3, :3].T + pose[:3, 3]
    centre = 0.5 * (v_world.min(0) + v_world.max(0))
    extent = float(np.linalg.norm(v_world.max(0) - v_world.min(0)))
    f = 0.5 * resolution / math.tan(math.radians(fovy_deg) / 2)
    c = (resolution - 1) / 2.0
    intr = CameraIntrinsics(resolution, resolution, f, f, c, c)
    cid = 0
    views = []
    rend = make_renderer(model, resolution, resolution)
    try:
        for d in hemisphere_directions(n_views, seed):
            T = look_at_optical(centre + distance_factor * extent * d, centre)
            Tm = T @ MJCF_TO_OPTICAL
            data.cam_xpos[cid] = Tm[:3, 3]
            data.cam_xmat[cid] = Tm[:3, :3].ravel()
            rend.disable_segmentation_rendering()
            rend.update_scene(data, camera=cid)
            img = rend.render().copy()
            rend.enable_segmentation_rendering()
            rend.update_scene(data, camera=cid)
            seg = rend.render()
            mask = (seg[..., 1] == int(mujoco.mjtObj.mjOBJ_GEOM)) & (seg[..., 0] >= 0)
            views.append(View(img, T, intr, len(views), mask))  # one camera per view
    finally:
        rend.close()
    return views, pose
