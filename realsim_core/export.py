"""Simulation-ready export of reconstructed objects (paper 5.3).

Per object `<name>` in a folder (normally `DIR/meshes/`):

- `<name>.obj`, `<name>.stl`: the mesh in metres, object frame (origin at the centre of
  mass of the closed mesh, or the vertex mean when it is not watertight; axes = world);
- `<name>_textured.obj` + `.mtl` + `.png`: the same mesh with a UV atlas and a texture
  baked from the Gaussians: every face gets a square cell of the atlas filled with the
  opacity-weighted mean colour of the Gaussians bound to it;
- `<name>.xml`: an MJCF snippet (`<mujoco>` root, for `<include>`): a mesh asset (the
  STL, relative path) and a body at the world pose with a free joint, a mesh geom and an
  explicit `<inertial>`: mass = density x volume, inertia tensor of the mesh (trimesh);
- the pose in the world (T_world_object) goes into `calibration.yaml` (`objects:`).

`write_scene_mjcf` writes a wrapper MJCF that includes a rig model (e.g. builtin:aloha2)
and every object snippet, so `mujoco.MjModel.from_xml_path(scene)` loads them together.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

import numpy as np

from realsim_core.errors import RealsimError

DEFAULT_DENSITY = 500.0  # kg/m^3 (wood / plastic foam-ish; the rig model's default too)
TEXTURE_CELL_PX = 4      # atlas cell edge per face


@dataclass(frozen=True)
class ExportedObject:
    """Paths written for one object and its pose (T_world_object [4, 4])."""

    name: str
    obj: Path
    stl: Path
    textured_obj: Path
    mjcf: Path
    pose: np.ndarray
    mass_kg: float
    volume_m3: float


def _fmt(v) -> str:
    return " ".join(f"{float(x):.9g}" for x in np.ravel(v))


def object_frame(vertices_world: np.ndarray, faces: np.ndarray):
    """(vertices in the object frame [V, 3], T_world_object [4, 4]): origin at the COM."""
    import trimesh

    m = trimesh.Trimesh(vertices_world, faces, process=False)
    origin = (np.asarray(m.center_mass) if m.is_watertight and m.volume > 0
              else np.asarray(vertices_world).mean(0))
    T = np.eye(4)
    T[:3, 3] = origin
    return np.asarray(vertices_world) - origin, T


def texture_atlas(faces: np.ndarray, face_colors: np.ndarray, cell: int = TEXTURE_CELL_PX):
    """Per-face colour atlas: (uv [3F, 2] for unshared corners, image uint8 [H, W, 3]).

    Face k owns cell (k % n, k // n) of an n x n grid; its corners map inside the cell
    with a one-pixel margin, so bilinear filtering never mixes neighbouring faces.
    """
    F = len(faces)
    n = max(1, math.ceil(math.sqrt(F)))
    size = n * cell
    img = np.zeros((size, size, 3), np.uint8)
    col = np.clip(np.round(np.asarray(face_colors) * 255), 0, 255).astype(np.uint8)
    k = np.arange(F)
    cx, cy = k % n, k // n
    for i in range(F):  # fill cells (F ~ 1e3: fine)
        img[cy[i] * cell:(cy[i] + 1) * cell, cx[i] * cell:(cx[i] + 1) * cell] = col[i]
    lo, hi = 1.0, cell - 1.0
    corners = np.array([[lo, lo], [hi, lo], [lo, hi]])  # pixel offsets in the cell
    px = np.stack([cx, cy], -1)[:, None, :] * cell + corners[None]  # [F, 3, 2]
    u = px[..., 0] / size
    v = 1.0 - px[..., 1] / size  # OBJ: v up, image rows down
    return np.stack([u, v], -1).reshape(-1, 2), img


def convex_hull_mesh(vertices: np.ndarray):
    """Closed trimesh of the convex hull of `vertices`, faces wound outwards.

    scipy's Qhull directly, with each facet oriented by its outward plane normal: trimesh's
    own `convex_hull` repairs an inconsistent winding through networkx, which realsim does
    not install (a degenerate object once ended a `realsim calibrate --objects` run
    there). A flat or degenerate point set raises RealsimError.
    """
    import trimesh
    from scipy.spatial import ConvexHull, QhullError

    v = np.asarray(vertices, np.float64)
    try:
        hull = ConvexHull(v)
    except (QhullError, ValueError) as exc:
        raise RealsimError(f"mesh has no volume (convex hull: {str(exc).splitlines()[0]})") \
            from None
    f = hull.simplices.copy()
    n = np.cross(v[f[:, 1]] - v[f[:, 0]], v[f[:, 2]] - v[f[:, 0]])
    inward = np.einsum("ij,ij->i", n, hull.equations[:, :3]) < 0
    f[inward] = f[inward][:, ::-1]
    return trimesh.Trimesh(v, f, process=False)


def mass_properties(vertices: np.ndarray, faces: np.ndarray, density: float):
    """(mass kg, volume m^3, com [3], inertia [3, 3] about the COM) of a closed mesh."""
    import trimesh

    m = trimesh.Trimesh(vertices, faces, process=False)
    if not m.is_watertight or m.volume <= 0:
        # not closed: fall back to the convex hull (always closed) for mass properties
        m = convex_hull_mesh(vertices)
    m.density = density
    return float(m.mass), float(m.volume), np.asarray(m.center_mass), np.asarray(
        m.moment_inertia)


def mjcf_snippet(name: str, mesh_file: str, pose: np.ndarray, mass: float, com: np.ndarray,
                 inertia: np.ndarray, rgba=(0.7, 0.7, 0.7, 1.0)) -> str:
    """MJCF text (`<mujoco>` root): mesh asset, body at `pose` with freejoint + inertial."""
    from realsim_core.se3 import matrix_to_quat_xyzw

    x, y, z, w = matrix_to_quat_xyzw(np.asarray(pose, np.float64)[:3, :3])
    J = np.asarray(inertia)
    full = [J[0, 0], J[1, 1], J[2, 2], J[0, 1], J[0, 2], J[1, 2]]
    q = quoteattr
    return (
        f'<mujoco model={q("realsim_" + name)}>\n'
        f'  <asset>\n'
        f'    <mesh name={q("realsim/" + name)} file={q(mesh_file)}/>\n'
        f'  </asset>\n'
        f'  <worldbody>\n'
        f'    <body name={q("realsim/" + name)} pos="{_fmt(pose[:3, 3])}" '
        f'quat="{_fmt([w, x, y, z])}">\n'
        f'      <freejoint name={q("realsim/" + name + "/free")}/>\n'
        f'      <inertial pos="{_fmt(com)}" mass="{mass:.9g}" fullinertia="{_fmt(full)}"/>\n'
        f'      <geom type="mesh" mesh={q("realsim/" + name)} rgba="{_fmt(rgba)}"/>\n'
        f'    </body>\n'
        f'  </worldbody>\n'
        f'</mujoco>\n')


def export_object(out_dir: str | os.PathLike, name: str, vertices_world: np.ndarray,
                  faces: np.ndarray, face_colors: np.ndarray | None = None,
                  density: float = DEFAULT_DENSITY) -> ExportedObject:
    """Write OBJ, STL, textured OBJ and the MJCF snippet of one object (module docstring)."""
    import trimesh
    from PIL import Image

    if density <= 0:
        raise RealsimError(f"density must be > 0, got {density}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    faces = np.asarray(faces, np.int64)
    if not np.all(np.isfinite(vertices_world)):
        raise RealsimError(f"{name}: mesh has non-finite vertices")
    v_obj, pose = object_frame(np.asarray(vertices_world, np.float64), faces)
    try:                                            # fails before anything is written
        mass, vol, com, inertia = mass_properties(v_obj, faces, density)
    except RealsimError as exc:
        raise RealsimError(f"{name}: {exc}") from None
    mesh = trimesh.Trimesh(v_obj, faces, process=False)
    obj, stl = out / f"{name}.obj", out / f"{name}.stl"
    mesh.export(str(obj))
    mesh.export(str(stl))
    if face_colors is None:
        face_colors = np.full((len(faces), 3), 0.7)
    uv, img = texture_atlas(faces, face_colors)
    tex_mesh = trimesh.Trimesh(v_obj[faces].reshape(-1, 3), np.arange(3 * len(faces)).reshape(
        -1, 3), process=False)
    material = trimesh.visual.material.SimpleMaterial(image=Image.fromarray(img))
    material.name = f"{name}_texture"  # names the .png: unique per object in one folder
    tex_mesh.visual = trimesh.visual.TextureVisuals(uv=uv, material=material)
    textured = out / f"{name}_textured.obj"
    trimesh.exchange.export.export_mesh(tex_mesh, str(textured), file_type="obj",
                                        mtl_name=f"{name}_textured.mtl")
    rgba = (*np.clip(np.mean(face_colors, 0), 0, 1), 1.0)
    mjcf = out / f"{name}.xml"
    mjcf.write_text(mjcf_snippet(name, stl.name, pose, mass, com, inertia, rgba))
    return ExportedObject(name, obj, stl, textured, mjcf, pose, mass, vol)


def write_scene_mjcf(path: str | os.PathLike, model: str | os.PathLike,
                     snippets: list[str | os.PathLike]) -> Path:
    """Wrapper MJCF including `model` (an MJCF path or "builtin:aloha2") and object snippets.

    Snippet mesh files are relative to their snippet; MuJoCo resolves them relative to the
    wrapper, so the wrapper must sit in the snippets' folder (checked).
    """
    p = Path(path)
    if str(model).startswith("builtin:"):
        from realsim_core.rig import load_rig

        model = load_rig(None).mjcf_path
    model = Path(model).resolve()
    lines = ["<mujoco model=\"realsim_scene\">", f"  <include file={quoteattr(str(model))}/>"]
    for s in snippets:
        s = Path(s)
        if s.resolve().parent != p.resolve().parent:
            raise RealsimError(f"object snippet {s} must be in the scene's folder {p.parent}")
        lines.append(f"  <include file={quoteattr(s.name)}/>")
    lines.append("</mujoco>")
    p.write_text("\n".join(lines) + "\n")
    return p
