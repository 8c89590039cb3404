"""Score a calibration against ground truth (definitions in contracts.md).

- camera: translation error |t_est - t_true| (mm) and rotation error angle(R_est^-1 R_true)
  (deg) of the optical frame in its parent frame, per camera;
- joint offsets: |offset_est - offset_true| per joint (rad; m for slides). A joint the
  calibration does not list counts as offset 0 (uncorrected);
- TCP: for every image frame of the recording and every arm, the distance between the rig
  file's TCP placed with the true joint values and with (measured + estimated offsets);
  mean over frames and arms (mm). Uses the trajectory `.npz` named in ground_truth.yaml
  and C MuJoCo kinematics (float64, no JIT);
- Chamfer per object: 10,000 points sampled uniformly on each surface (world frame),
  mean nearest squared distance both ways, summed (mm^2, PyTorch3D convention). Objects
  are matched by nearest bounding-box centre (reconstructions have no semantic names); a
  truth object without an estimate within 5 cm is reported as missing (None). Two beside
  it: the *floor* (the same number between two independent samplings of the truth: what a
  perfect reconstruction scores, 0.3-0.7 mm^2 for 5 cm objects) and the *surface* Chamfer
  (each sample scored by its exact distance to the other surface: no floor).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from realsim_core.calibration_io import (
    Calibration,
    GroundTruth,
    read_calibration,
    read_ground_truth,
)
from realsim_core.errors import RealsimError
from realsim_core.se3 import rotation_error_deg

CHAMFER_SAMPLES = 10_000
MATCH_RADIUS_M = 0.05  # an estimate farther than this from every truth object matches none


@dataclass(frozen=True)
class CameraError:
    """Pose error of one camera's optical frame (None values: camera missing)."""

    translation_mm: float | None
    rotation_deg: float | None


@dataclass(frozen=True)
class EvaluationReport:
    """All metrics; `to_dict()` gives the `--json` form."""

    cameras: dict[str, CameraError] = field(default_factory=dict)
    joint_offsets: dict[str, float] = field(default_factory=dict)  # abs error, rad (m slides)
    tcp_mm: float | None = None  # mean over frames and arms
    tcp_max_mm: float | None = None
    tcp_frames: int = 0
    chamfer_mm2: dict[str, float | None] = field(default_factory=dict)
    # exact point-to-surface Chamfer (no sampling floor) and the truth's sampling floor
    chamfer_surface_mm2: dict[str, float | None] = field(default_factory=dict)
    chamfer_floor_mm2: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """Plain JSON-able mapping."""
        d = asdict(self)
        d["joint_offsets_max"] = max(self.joint_offsets.values(), default=None)
        return d


def camera_errors(calib: Calibration, truth: Calibration) -> dict[str, CameraError]:
    """Per truth camera: translation (mm) and rotation (deg) error of the estimate."""
    out = {}
    for name, t in truth.cameras.items():
        e = calib.cameras.get(name)
        if e is None:
            out[name] = CameraError(None, None)
            continue
        if e.parent_frame != t.parent_frame:
            raise RealsimError(f"camera '{name}': parent frame '{e.parent_frame}' differs from "
                               f"the truth's '{t.parent_frame}'")
        out[name] = CameraError(
            float(np.linalg.norm(e.pose[:3, 3] - t.pose[:3, 3]) * 1000.0),
            rotation_error_deg(e.pose[:3, :3], t.pose[:3, :3]),
        )
    return out


def joint_offset_errors(calib: Calibration, truth: Calibration) -> dict[str, float]:
    """Per truth joint: |estimated - true offset| (missing estimate = 0)."""
    return {k: abs(calib.joint_offsets.get(k, 0.0) - v) for k, v in truth.joint_offsets.items()}


def tcp_error_mm(rig, model, q_true: np.ndarray, q_est: np.ndarray) -> np.ndarray:
    """TCP distance per frame and arm (mm): q_true, q_est [F, J] -> [F, A]."""
    from realsim_core.kinematics import tcp_positions

    a = tcp_positions(rig, model, q_true)
    b = tcp_positions(rig, model, q_est)
    return np.linalg.norm(a - b, axis=-1) * 1000.0


def _load_mesh(path: Path, pose: np.ndarray | None = None):
    import trimesh

    if not Path(path).is_file():
        raise RealsimError(f"mesh file not found: {path}")
    try:
        mesh = trimesh.load(str(path), force="mesh", process=False)
    except Exception as exc:  # trimesh raises many types for bad files
        raise RealsimError(f"cannot read mesh {path}: {' '.join(str(exc).split())}") from None
    if len(mesh.faces) == 0:
        raise RealsimError(f"mesh {path} has no faces")
    if pose is not None:
        mesh = mesh.copy()
        mesh.apply_transform(pose)
    return mesh


def sample_surface(mesh, n: int, seed: int) -> np.ndarray:
    """Sample n points uniformly (by area) on a trimesh surface -> [n, 3] (seeded)."""
    rng = np.random.default_rng(seed)
    tri = np.asarray(mesh.triangles, np.float64)  # [T, 3, 3]
    area = np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=-1)
    idx = rng.choice(len(tri), size=n, p=area / area.sum())
    u, v = rng.random(n), rng.random(n)
    flip = u + v > 1.0
    u[flip], v[flip] = 1.0 - u[flip], 1.0 - v[flip]
    t = tri[idx]
    return t[:, 0] + u[:, None] * (t[:, 1] - t[:, 0]) + v[:, None] * (t[:, 2] - t[:, 0])


def chamfer_mm2(points_a: np.ndarray, points_b: np.ndarray) -> float:
    """Chamfer distance of point sets [N, 3], [M, 3] in metres -> mm^2 (squared, both ways)."""
    from scipy.spatial import cKDTree

    a, b = np.asarray(points_a) * 1000.0, np.asarray(points_b) * 1000.0
    da, _ = cKDTree(b).query(a)
    db, _ = cKDTree(a).query(b)
    return float(np.mean(da ** 2) + np.mean(db ** 2))


def surface_chamfer_mm2(mesh_a, mesh_b, n: int = CHAMFER_SAMPLES, seed: int = 0) -> float:
    """Chamfer (mm^2) with exact point-to-surface distances: no sampling floor.

    The `chamfer_mm2` sum of two mean squared distances, but each of the n samples on one
    surface is scored by its distance to the closest point of the other *surface*
    (trimesh, point-triangle), not to the other sample set. Identical surfaces score 0
    whatever their triangulation; `chamfer_mm2` of two independent samplings of one
    surface does not (`chamfer_floor_mm2`).
    """
    import trimesh.proximity

    total = 0.0
    for k, (src, dst) in enumerate(((mesh_a, mesh_b), (mesh_b, mesh_a))):
        _, d, _ = trimesh.proximity.closest_point(dst, sample_surface(src, n, seed + k))
        total += float(np.mean((np.asarray(d) * 1000.0) ** 2))
    return total


def chamfer_floor_mm2(mesh, n: int = CHAMFER_SAMPLES, seed: int = 0) -> float:
    """`chamfer_mm2` between two independent n-samplings of one surface (mm^2).

    What a perfect reconstruction scores on average: with 10,000 samples the nearest other
    sample lies ~1/sqrt(density) away, so the floor grows with the surface area (0.30 mm^2
    for the bent capsule, 0.73 for the cylinder; docs/objects.md).
    """
    return chamfer_mm2(sample_surface(mesh, n, seed), sample_surface(mesh, n, seed + 1_000_003))


def _matched_objects(calib: Calibration, gt: GroundTruth) -> list[tuple[str, object, object]]:
    """(truth name, truth mesh, matched estimate mesh or None) per truth object (world).

    Reconstructed objects carry no semantic names, so estimates are matched to truth
    objects by the distance of their bounding-box centres (greedy, closest pairs first,
    one estimate per truth object, within `MATCH_RADIUS_M`).
    """
    truth = []
    for o in gt.truth.objects:
        if o.name in gt.object_meshes:
            truth.append((o.name, _load_mesh(gt.object_meshes[o.name])))
        else:
            truth.append((o.name, _load_mesh(o.mesh, o.pose)))
    est = [_load_mesh(e.mesh, e.pose) for e in calib.objects]

    def centre(m):
        b = np.asarray(m.bounds)
        return 0.5 * (b[0] + b[1])

    pairs = sorted((float(np.linalg.norm(centre(tm) - centre(em))), i, j)
                   for i, (_, tm) in enumerate(truth) for j, em in enumerate(est))
    match: dict[int, int] = {}
    used: set[int] = set()
    for d, i, j in pairs:
        if d <= MATCH_RADIUS_M and i not in match and j not in used:
            match[i] = j
            used.add(j)
    return [(name, tm, est[match[i]] if i in match else None)
            for i, (name, tm) in enumerate(truth)]


def object_chamfers(calib: Calibration, gt: GroundTruth, n: int = CHAMFER_SAMPLES,
                    seed: int = 0) -> dict[str, float | None]:
    """Chamfer (mm^2, contracts.md) per truth object, estimate vs truth, world frame.

    Estimates are matched by bounding-box centre (`_matched_objects`); a truth object
    without an estimate is reported as missing (None).
    """
    # the same seed on both sides: identical meshes give identical samples (CD = 0)
    return {name: None if em is None else chamfer_mm2(sample_surface(em, n, seed + i),
                                                      sample_surface(tm, n, seed + i))
            for i, (name, tm, em) in enumerate(_matched_objects(calib, gt))}


def object_chamfer_details(calib: Calibration, gt: GroundTruth, n: int = CHAMFER_SAMPLES,
                           seed: int = 0) -> dict[str, dict[str, float | None]]:
    """Per truth object: `chamfer_mm2`, `surface_mm2` (no floor), `floor_mm2` (truth)."""
    out = {}
    for i, (name, tm, em) in enumerate(_matched_objects(calib, gt)):
        d = {"chamfer_mm2": None, "surface_mm2": None,
             "floor_mm2": chamfer_floor_mm2(tm, n, seed + i)}
        if em is not None:
            d["chamfer_mm2"] = chamfer_mm2(sample_surface(em, n, seed + i),
                                           sample_surface(tm, n, seed + i))
            d["surface_mm2"] = surface_chamfer_mm2(em, tm, n, seed + i)
        out[name] = d
    return out


def evaluate(calib: Calibration, gt: GroundTruth) -> EvaluationReport:
    """All metrics of `calib` against the ground truth `gt`."""
    tcp = tcp_max = None
    frames = 0
    if gt.trajectory is not None and gt.rig is not None:
        from realsim_core.rig import load_mjmodel, load_rig

        rig = load_rig(gt.rig)
        model = load_mjmodel(rig)
        if not Path(gt.trajectory).is_file():
            raise RealsimError(f"trajectory file not found: {gt.trajectory}")
        with np.load(gt.trajectory) as z:
            q_true, q_meas = z["q_true"], z["q_measured"]
            names = [str(n) for n in z["joint_names"]]
        if tuple(names) != rig.joint_names:
            raise RealsimError(f"{gt.trajectory}: joint names differ from the rig's")
        off = np.array([calib.joint_offsets.get(n, 0.0) for n in names])
        err = tcp_error_mm(rig, model, q_true, q_meas + off[None])
        tcp, tcp_max, frames = float(err.mean()), float(err.max()), int(len(q_true))
    cd = object_chamfer_details(calib, gt)
    return EvaluationReport(
        cameras=camera_errors(calib, gt.truth),
        joint_offsets=joint_offset_errors(calib, gt.truth),
        tcp_mm=tcp,
        tcp_max_mm=tcp_max,
        tcp_frames=frames,
        chamfer_mm2={k: d["chamfer_mm2"] for k, d in cd.items()},
        chamfer_surface_mm2={k: d["surface_mm2"] for k, d in cd.items()},
        chamfer_floor_mm2={k: d["floor_mm2"] for k, d in cd.items()},
    )


def evaluate_files(calibration: str | os.PathLike, truth: str | os.PathLike) -> EvaluationReport:
    """`evaluate` on a calibration.yaml and a ground_truth.yaml."""
    return evaluate(read_calibration(calibration), read_ground_truth(truth))


def _fmt(x: float | None, spec: str) -> str:
    return "missing" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def format_report(r: EvaluationReport) -> str:
    """Human-readable table."""
    lines = ["camera            trans [mm]   rot [deg]"]
    for name, e in r.cameras.items():
        t, r_ = _fmt(e.translation_mm, "11.3f"), _fmt(e.rotation_deg, "11.4f")
        lines.append(f"{name:<16} {t} {r_}")
    lines.append("")
    lines.append("joint offset                     error [rad | m]")
    for name, v in r.joint_offsets.items():
        lines.append(f"{name:<32} {v:.5f}")
    lines.append("")
    if r.tcp_mm is None:
        lines.append("TCP error: n/a (no trajectory in the ground truth)")
    else:
        lines.append(f"TCP error: mean {r.tcp_mm:.3f} mm, max {r.tcp_max_mm:.3f} mm "
                     f"over {r.tcp_frames} frames x both arms")
    if r.chamfer_mm2:
        lines.append("")
        lines.append("object            Chamfer [mm^2]  surface [mm^2]  floor [mm^2]")
        for name, v in r.chamfer_mm2.items():
            lines.append(f"{name:<16} {_fmt(v, '14.4f')}  "
                         f"{_fmt(r.chamfer_surface_mm2.get(name), '14.4f')}  "
                         f"{_fmt(r.chamfer_floor_mm2.get(name), '12.4f')}")
        lines.append("(floor: the Chamfer of two samplings of the truth, what a perfect "
                     "mesh scores; surface: exact distances, no floor)")
    return "\n".join(lines)
