"""SplatMesh: 3D Gaussians bound to triangle-mesh faces (paper 2506.04120, appendix B.1).

Per face, a fixed number of Gaussians (6-20, by area with stochastic rounding). Each
Gaussian has barycentric logits (softmax -> weights of the face's three vertices), two
in-plane log-scales, SH colours and an opacity logit. Its frame is the face frame
(tangent = first edge, normal = face normal, bitangent = normal x tangent) and its scale
along the normal is float32 machine epsilon (surfel constraint). Means and frames are
computed from the *current* vertices and the body's rigid transform, so Gaussians follow
vertex edits and kinematics, and gradients reach vertex positions and body poses.

Static model vs dynamic state (style.md): `SplatMeshModel` holds what never changes
during optimisation (faces, face -> geom -> body maps, geom poses in their body); the
trainable parameters are a plain dict of arrays (`init_params`). Both are pytrees; pass
both explicitly to `gaussians_in_world`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from realsim_core.render.sh import num_sh_bases, rgb_to_sh0
from realsim_core.se3 import quat_xyzw_to_matrix

SURFEL_SCALE = float(np.finfo(np.float32).eps)  # metres, scale along the face normal
MIN_PER_FACE, MAX_PER_FACE = 6, 20  # paper: 6-20 Gaussians per face


class MeshPart(NamedTuple):
    """One triangle mesh attached to a body (a MuJoCo geom or a free object).

    vertices: [V, 3] metres in the part's own frame; faces: [F, 3] int;
    body: body id it moves with; local_pose: [4, 4] T_body_part; rgb: [3] initial colour.
    """

    name: str
    vertices: np.ndarray
    faces: np.ndarray
    body: int
    local_pose: np.ndarray
    rgb: np.ndarray


class SplatMeshModel(NamedTuple):
    """Frozen structure of a set of SplatMeshes (numpy; G Gaussians, F faces, V vertices).

    faces: [F, 3] int32 indices into the concatenated vertex array.
    gauss_face: [G] int32 face of each Gaussian.
    face_part: [F] int32 part (geom) of each face.
    part_body: [P] int32 body of each part; part_pose: [P, 4, 4] T_body_part.
    gauss_part: [G] int32 part of each Gaussian (object ids for masks).
    part_names: tuple of P names; vert_part: [V] int32.

    Use it as a constant: close over it in jitted functions (its arrays become constants),
    do not pass it as a traced argument.
    """

    faces: np.ndarray
    gauss_face: np.ndarray
    face_part: np.ndarray
    part_body: np.ndarray
    part_pose: np.ndarray
    gauss_part: np.ndarray
    vert_part: np.ndarray
    part_names: tuple


def allocate_counts(areas, mean_per_face: float = 12.0, lo: int = MIN_PER_FACE,
                    hi: int = MAX_PER_FACE, seed: int = 0) -> np.ndarray:
    """Gaussians per face, proportional to area, stochastic rounding, clipped to [lo, hi].

    areas: [F] m^2 -> [F] int32 with mean about `mean_per_face`.
    """
    areas = np.asarray(areas, np.float64)
    rng = np.random.default_rng(seed)
    target = mean_per_face * len(areas) * areas / max(areas.sum(), 1e-30)
    base = np.floor(target)
    counts = base + (rng.uniform(size=len(areas)) < (target - base))
    return np.clip(counts, lo, hi).astype(np.int32)


def build_model(parts: list[MeshPart], *, mean_per_face: float = 12.0, sh_degree: int = 0,
                opacity: float = 0.9, seed: int = 0, min_per_face: int = MIN_PER_FACE,
                max_per_face: int = MAX_PER_FACE):
    """SplatMeshModel + initial params for a list of mesh parts.

    `min_per_face`/`max_per_face` clip the per-face counts (paper: 6-20; lower them for
    small CPU budgets, e.g. object reconstruction with 1-4 Gaussians per face).

    Returns (model, params) with params:
      vertices [V, 3] m (each part's own frame), bary_logits [G, 3], log_scales [G, 2]
      (log metres, in-plane), sh [G, (sh_degree+1)^2, 3], opacity_logits [G].
    """
    rng = np.random.default_rng(seed)
    verts, faces, face_part, vert_part, rgbs = [], [], [], [], []
    offset = 0
    for i, p in enumerate(parts):
        v = np.asarray(p.vertices, np.float64).reshape(-1, 3)
        f = np.asarray(p.faces, np.int64).reshape(-1, 3)
        verts.append(v)
        faces.append(f + offset)
        face_part.append(np.full(len(f), i))
        vert_part.append(np.full(len(v), i))
        rgbs.append(np.broadcast_to(np.asarray(p.rgb, np.float64)[:3], (len(f), 3)))
        offset += len(v)
    verts = np.concatenate(verts)
    faces = np.concatenate(faces).astype(np.int32)
    face_part = np.concatenate(face_part).astype(np.int32)
    tri = verts[faces]
    areas = 0.5 * np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)
    counts = allocate_counts(areas, mean_per_face, lo=min_per_face, hi=max_per_face, seed=seed)
    gauss_face = np.repeat(np.arange(len(faces)), counts).astype(np.int32)
    g = len(gauss_face)
    # uniform barycentric samples (reflection trick) -> logits
    r1, r2 = rng.uniform(size=(2, g))
    flip = r1 + r2 > 1
    r1, r2 = np.where(flip, 1 - r1, r1), np.where(flip, 1 - r2, r2)
    w = np.stack([1 - r1 - r2, r1, r2], -1).clip(1e-3)
    # in-plane std: each Gaussian covers about its share of the face area
    s = np.sqrt(areas[gauss_face] / counts[gauss_face]) * 0.5
    nb = num_sh_bases(sh_degree)
    sh = np.zeros((g, nb, 3))
    sh[:, 0] = rgb_to_sh0(np.concatenate(rgbs)[gauss_face])
    params = {
        "vertices": jnp.asarray(verts, jnp.float32),
        "bary_logits": jnp.asarray(np.log(w), jnp.float32),
        "log_scales": jnp.asarray(np.log(np.maximum(s, 1e-6))[:, None].repeat(2, 1), jnp.float32),
        "sh": jnp.asarray(sh, jnp.float32),
        "opacity_logits": jnp.full((g,), np.log(opacity / (1 - opacity)), jnp.float32),
    }
    model = SplatMeshModel(
        faces=faces, gauss_face=gauss_face, face_part=face_part,
        part_body=np.array([p.body for p in parts], np.int32),
        part_pose=np.stack([np.asarray(p.local_pose, np.float64) for p in parts]).astype(
            np.float32),
        gauss_part=face_part[gauss_face], vert_part=np.concatenate(vert_part).astype(np.int32),
        part_names=tuple(p.name for p in parts))
    return model, params


class WorldGaussians(NamedTuple):
    """Gaussians placed in the world, ready for `rasterize(..., covars=covars)`.

    means [G, 3] m; covars [G, 3, 3] m^2; opacities [G]; sh [G, B, 3]; normals [G, 3]
    (unit, world); part [G] int32 (geom / object index, for masks).
    """

    means: jax.Array
    covars: jax.Array
    opacities: jax.Array
    sh: jax.Array
    normals: jax.Array
    part: jax.Array


def gaussians_in_world(model: SplatMeshModel, params: dict, body_poses,
                       clamp_opacity: bool = False) -> WorldGaussians:
    """Place every Gaussian in the world frame.

    Surfel constraint: the scale along the face normal is `SURFEL_SCALE`, unless `params`
    carries `log_scale_normal` [G] (log metres): then that learned scale is used (the
    paper's "without surfels" ablation).
    body_poses: [nbody, 4, 4] T_world_body (e.g. from MuJoCo/MJX kinematics; free objects
    are bodies too). clamp_opacity: use opacity 1 for every Gaussian (paper B.2.2).
    Differentiable w.r.t. params (vertices included) and body_poses.
    """
    part_world = body_poses[model.part_body] @ model.part_pose  # [P, 4, 4]
    tv = part_world[model.vert_part]  # [V, 4, 4]
    v = jnp.einsum("vij,vj->vi", tv[:, :3, :3], params["vertices"]) + tv[:, :3, 3]
    tri = v[model.faces[model.gauss_face]]  # [G, 3 vertices, 3]
    w = jax.nn.softmax(params["bary_logits"], axis=-1)
    means = jnp.einsum("gk,gki->gi", w, tri)
    e1 = tri[:, 1] - tri[:, 0]
    e2 = tri[:, 2] - tri[:, 0]
    n = jnp.cross(e1, e2)
    n = n / jnp.linalg.norm(n, axis=-1, keepdims=True)
    t = e1 / jnp.linalg.norm(e1, axis=-1, keepdims=True)
    b = jnp.cross(n, t)
    rot = jnp.stack([t, b, n], -1)  # columns: tangent, bitangent, normal
    if "log_scale_normal" in params:
        s_n = jnp.exp(params["log_scale_normal"])[:, None]
    else:
        s_n = jnp.full(means.shape[:1] + (1,), SURFEL_SCALE, means.dtype)
    s = jnp.concatenate([jnp.exp(params["log_scales"]), s_n], -1)
    m = rot * s[:, None, :]
    covars = m @ jnp.swapaxes(m, -1, -2)
    if clamp_opacity:
        opac = jnp.ones(means.shape[:1], means.dtype)
    else:
        opac = jax.nn.sigmoid(params["opacity_logits"])
    return WorldGaussians(means, covars, opac, params["sh"], n, jnp.asarray(model.gauss_part))


# --------------------------------------------------------------------------- MuJoCo

def _pose(pos, quat_wxyz) -> np.ndarray:
    q = np.asarray(quat_wxyz, np.float64)
    t = np.eye(4)
    t[:3, :3] = np.asarray(quat_xyzw_to_matrix(jnp.asarray([q[1], q[2], q[3], q[0]])))
    t[:3, 3] = pos
    return t


def primitive_mesh(geom_type: int, size, plane_extent: float = 1.0, plane_cells: int = 8):
    """Tessellate a MuJoCo primitive (its own frame). Returns (vertices [V,3], faces [F,3])."""
    import mujoco
    import trimesh

    gt = mujoco.mjtGeom
    size = np.asarray(size, np.float64)
    if geom_type == gt.mjGEOM_BOX:
        m = trimesh.creation.box(extents=2 * size[:3])
        m = m.subdivide()  # 48 faces: keeps per-face Gaussians smaller on big boxes
    elif geom_type == gt.mjGEOM_SPHERE:
        m = trimesh.creation.icosphere(subdivisions=2, radius=size[0])
    elif geom_type == gt.mjGEOM_ELLIPSOID:
        m = trimesh.creation.icosphere(subdivisions=2, radius=1.0)
        m.apply_scale(size[:3])
    elif geom_type == gt.mjGEOM_CAPSULE:
        m = trimesh.creation.capsule(height=2 * size[1], radius=size[0], count=[12, 12])
    elif geom_type == gt.mjGEOM_CYLINDER:
        m = trimesh.creation.cylinder(radius=size[0], height=2 * size[1], sections=16)
    elif geom_type == gt.mjGEOM_PLANE:
        hx = size[0] if size[0] > 0 else plane_extent
        hy = size[1] if size[1] > 0 else plane_extent
        xs = np.linspace(-hx, hx, plane_cells + 1)
        ys = np.linspace(-hy, hy, plane_cells + 1)
        gx, gy = np.meshgrid(xs, ys, indexing="ij")
        v = np.stack([gx.ravel(), gy.ravel(), np.zeros(gx.size)], -1)
        idx = np.arange(v.shape[0]).reshape(plane_cells + 1, plane_cells + 1)
        a, b_, c, d = idx[:-1, :-1], idx[1:, :-1], idx[1:, 1:], idx[:-1, 1:]
        f = np.concatenate([np.stack([a, b_, c], -1).reshape(-1, 3),
                            np.stack([a, c, d], -1).reshape(-1, 3)])  # normals +z
        return v, f
    else:
        raise ValueError(f"unsupported geom type {geom_type}")
    return np.asarray(m.vertices), np.asarray(m.faces)


def parts_from_mujoco(mj_model, groups=(0, 1, 2), plane_extent: float = 1.0,
                      max_plane_extent: float | None = None) -> list[MeshPart]:
    """One MeshPart per visual geom of a compiled `mujoco.MjModel`.

    Visual = rgba alpha > 0 and geom group in `groups` (MuJoCo's default visible groups).
    Mesh geoms use model.mesh_vert / mesh_face (already in the geom frame); primitives are
    tessellated with trimesh. Each part records its body id and T_body_geom. Infinite
    planes get half-size `plane_extent`; `max_plane_extent` also clips finite ones.
    """
    import mujoco

    parts = []
    for gid in range(mj_model.ngeom):
        if mj_model.geom_rgba[gid, 3] <= 0 or int(mj_model.geom_group[gid]) not in groups:
            continue
        gtype = int(mj_model.geom_type[gid])
        if gtype == mujoco.mjtGeom.mjGEOM_MESH:
            mid = int(mj_model.geom_dataid[gid])
            va, vn = mj_model.mesh_vertadr[mid], mj_model.mesh_vertnum[mid]
            fa, fn = mj_model.mesh_faceadr[mid], mj_model.mesh_facenum[mid]
            v = np.asarray(mj_model.mesh_vert[va: va + vn], np.float64)
            f = np.asarray(mj_model.mesh_face[fa: fa + fn], np.int64)
        elif gtype in (mujoco.mjtGeom.mjGEOM_HFIELD, mujoco.mjtGeom.mjGEOM_SDF):
            continue
        else:
            size = np.array(mj_model.geom_size[gid], np.float64)
            if gtype == mujoco.mjtGeom.mjGEOM_PLANE and max_plane_extent is not None:
                size[:2] = np.where(size[:2] > 0, np.minimum(size[:2], max_plane_extent),
                                    min(plane_extent, max_plane_extent))
            v, f = primitive_mesh(gtype, size, plane_extent)
        name = mujoco.mj_id2name(mj_model, mujoco.mjtObj.mjOBJ_GEOM, gid) or f"geom{gid}"
        rgb = np.asarray(mj_model.geom_rgba[gid, :3], np.float64)
        matid = int(mj_model.geom_matid[gid])
        if matid >= 0:
            rgb = np.asarray(mj_model.mat_rgba[matid, :3], np.float64)
        parts.append(MeshPart(name, v, f, int(mj_model.geom_bodyid[gid]),
                              _pose(mj_model.geom_pos[gid], mj_model.geom_quat[gid]), rgb))
    return parts


def body_poses_from_mjdata(mj_data) -> np.ndarray:
    """[nbody, 4, 4] T_world_body from a `mujoco.MjData` after mj_kinematics/mj_forward."""
    nb = mj_data.xpos.shape[0]
    t = np.tile(np.eye(4), (nb, 1, 1))
    t[:, :3, :3] = np.asarray(mj_data.xmat).reshape(nb, 3, 3)
    t[:, :3, 3] = mj_data.xpos
    return t


def build_from_mujoco(mj_model, *, mean_per_face: float = 12.0, sh_degree: int = 0,
                      groups=(0, 1, 2), seed: int = 0):
    """SplatMeshModel + params for every visual geom of `mj_model` (see `parts_from_mujoco`)."""
    parts = parts_from_mujoco(mj_model, groups)
    if not parts:
        raise ValueError("the model has no visual geoms")
    return build_model(parts, mean_per_face=mean_per_face, sh_degree=sh_degree, seed=seed)
