"""Read and write `calibration.yaml` and `ground_truth.yaml` (schemas in contracts.md).

Files are written atomically (temp file in the same folder + `os.replace`), so a reader
never sees half a file. Relative mesh paths are relative to the YAML file.

`ground_truth.yaml` (written by `realsim synth`) is a calibration file (the truth) plus:
- `nominal:` the miscalibrated starting point, itself in the calibration schema;
- `object_meshes:` [{name, mesh}] true meshes already in the world frame;
- `noise:` the settings used (seed, joint_offset_std, joint_noise_std, camera_offset_mm,
  camera_offset_deg, ...);
- `rig:` the rig file of the recording (relative path, normally `rig.yaml`);
- `trajectory:` an `.npz` (relative path) with the per-frame joint values of the recording
  at the image stamps: `stamp_ns` [F] int64, `q_true` [F, J] and `q_measured` [F, J]
  (rad; m for slides) in rig joint order, `joint_names` [J]. `evaluate` uses it for the
  TCP error.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from realsim_core.errors import RealsimError
from realsim_core.rig import _Ctx, pose_from_dict, pose_to_dict


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically (temp file beside it, then os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual file mode
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class CameraCalibration:
    """Estimated optical-frame pose of one camera in its parent (mount) frame."""

    parent_frame: str
    child_frame: str
    pose: np.ndarray  # [4, 4] T_parent_optical (m)
    std: dict | None = None  # {translation_mm, rotation_deg}


@dataclass(frozen=True)
class ObjectCalibration:
    """One object: mesh file (object frame) and its pose in the world."""

    name: str
    mesh: Path  # absolute (resolved against the YAML file's folder)
    pose: np.ndarray  # [4, 4] T_world_object (m)


@dataclass(frozen=True)
class Calibration:
    """Contents of a `calibration.yaml`."""

    cameras: dict[str, CameraCalibration] = field(default_factory=dict)
    joint_offsets: dict[str, float] = field(default_factory=dict)  # rad; m for slides
    objects: tuple[ObjectCalibration, ...] = ()
    metrics: dict = field(default_factory=dict)
    # estimated 1-sigma uncertainty of each joint offset (rad; m for slides); written as
    # `joint_offsets_std:` beside `joint_offsets:` when known
    joint_offsets_std: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class GroundTruth:
    """Contents of a `ground_truth.yaml` written by `realsim synth`."""

    truth: Calibration
    nominal: Calibration
    object_meshes: dict[str, Path]  # name -> mesh file in world frame (absolute path)
    noise: dict
    rig: Path | None  # rig file of the recording (absolute path)
    trajectory: Path | None  # .npz with stamp_ns, q_true, q_measured, joint_names


# ------------------------------------------------------------------------------- parsing


def _load_yaml(path: Path) -> Any:
    if not path.is_file():
        raise RealsimError(f"file not found: {path}")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RealsimError(f"{path.name}: malformed YAML: {' '.join(str(exc).split())}") from None


def calibration_from_dict(d: Any, base_dir: Path, ctx: _Ctx, path: str = "") -> Calibration:
    """Parse the calibration schema (mapping) with errors naming the key."""
    pre = f"{path}." if path else ""
    if not isinstance(d, dict):
        raise ctx.fail(path or "top level", "expected a mapping")
    cams = {}
    cd = ctx.get(d, "cameras", path, dict, required=False) or {}
    for name, c in cd.items():
        p = f"{pre}cameras.{name}"
        if not isinstance(c, dict):
            raise ctx.fail(p, f"expected a mapping, got {c!r}")
        std = c.get("std")
        if std is not None and not isinstance(std, dict):
            raise ctx.fail(f"{p}.std", f"expected a mapping, got {std!r}")
        cams[str(name)] = CameraCalibration(
            parent_frame=ctx.get(c, "parent_frame", p, str, required=False) or "world",
            child_frame=ctx.get(c, "child_frame", p, str, required=False)
            or f"{name}_color_optical_frame",
            pose=pose_from_dict(c, ctx, p),
            std=std,
        )
    offs = {}
    od = ctx.get(d, "joint_offsets", path, dict, required=False) or {}
    for k, v in od.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ctx.fail(f"{pre}joint_offsets.{k}", f"expected a number, got {v!r}")
        offs[str(k)] = float(v)
    offs_std = {}
    sd = ctx.get(d, "joint_offsets_std", path, dict, required=False) or {}
    for k, v in sd.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise ctx.fail(f"{pre}joint_offsets_std.{k}",
                           f"expected a non-negative number, got {v!r}")
        offs_std[str(k)] = float(v)
    objs = []
    ol = ctx.get(d, "objects", path, list, required=False) or []
    for i, o in enumerate(ol):
        p = f"{pre}objects[{i}]"
        if not isinstance(o, dict):
            raise ctx.fail(p, f"expected a mapping, got {o!r}")
        mesh = Path(ctx.get(o, "mesh", p, str))
        objs.append(ObjectCalibration(
            name=ctx.get(o, "name", p, str, required=False) or f"object_{i}",
            mesh=mesh if mesh.is_absolute() else (base_dir / mesh),
            pose=pose_from_dict(o, ctx, p),
        ))
    metrics = ctx.get(d, "metrics", path, dict, required=False) or {}
    return Calibration(cams, offs, tuple(objs), metrics, offs_std)


def read_calibration(path: str | os.PathLike) -> Calibration:
    """Read a `calibration.yaml` (RealsimError naming the key on bad content)."""
    p = Path(path)
    return calibration_from_dict(_load_yaml(p), p.resolve().parent, _Ctx(p.name))


def read_ground_truth(path: str | os.PathLike) -> GroundTruth:
    """Read a `ground_truth.yaml` written by `realsim synth`."""
    p = Path(path)
    base = p.resolve().parent
    d = _load_yaml(p)
    ctx = _Ctx(p.name)
    truth = calibration_from_dict(d, base, ctx)
    if not isinstance(d.get("nominal"), dict):
        raise ctx.fail("nominal", "missing required key (is this a ground_truth.yaml?)")
    nominal = calibration_from_dict(d["nominal"], base, ctx, "nominal")
    meshes = {}
    for i, o in enumerate(ctx.get(d, "object_meshes", "", list, required=False) or []):
        if not isinstance(o, dict) or "mesh" not in o:
            raise ctx.fail(f"object_meshes[{i}]", "expected {name, mesh}")
        meshes[str(o.get("name", f"object_{i}"))] = base / str(o["mesh"])
    rig = ctx.get(d, "rig", "", str, required=False)
    traj = ctx.get(d, "trajectory", "", str, required=False)
    return GroundTruth(
        truth=truth,
        nominal=nominal,
        object_meshes=meshes,
        noise=ctx.get(d, "noise", "", dict, required=False) or {},
        rig=(base / rig) if rig else None,
        trajectory=(base / traj) if traj else None,
    )


# ------------------------------------------------------------------------------- writing


def _rel(p: Path, base: Path) -> str:
    try:
        return os.path.relpath(Path(p).resolve(), base.resolve())
    except ValueError:  # different drives
        return str(p)


def calibration_to_dict(c: Calibration, base_dir: Path) -> dict:
    """Calibration -> plain mapping in the contracts.md schema (paths relative to base_dir)."""
    cams = {}
    for name, cam in c.cameras.items():
        e = {"parent_frame": cam.parent_frame, "child_frame": cam.child_frame}
        e.update(pose_to_dict(cam.pose))
        if cam.std is not None:
            e["std"] = dict(cam.std)
        cams[name] = e
    objs = []
    for o in c.objects:
        e = {"name": o.name, "mesh": _rel(o.mesh, base_dir)}
        e.update(pose_to_dict(o.pose))
        objs.append(e)
    out = {
        "cameras": cams,
        "joint_offsets": {k: float(v) for k, v in c.joint_offsets.items()},
    }
    if c.joint_offsets_std:
        out["joint_offsets_std"] = {k: float(v) for k, v in c.joint_offsets_std.items()}
    out.update({"objects": objs, "metrics": _plain(c.metrics)})
    return out


def _plain(x: Any) -> Any:
    """Numpy scalars/arrays -> Python types, recursively (for yaml.safe_dump)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    return x


def write_calibration(path: str | os.PathLike, c: Calibration) -> None:
    """Write `c` as `calibration.yaml` (atomically)."""
    p = Path(path)
    text = yaml.safe_dump(calibration_to_dict(c, p.parent), sort_keys=False)
    atomic_write_text(p, text)


def write_ground_truth(path: str | os.PathLike, gt: GroundTruth) -> None:
    """Write `gt` as `ground_truth.yaml` (atomically)."""
    p = Path(path)
    base = p.parent
    d = calibration_to_dict(gt.truth, base)
    d["nominal"] = calibration_to_dict(gt.nominal, base)
    d["object_meshes"] = [{"name": k, "mesh": _rel(v, base), "frame": "world"}
                          for k, v in gt.object_meshes.items()]
    d["noise"] = _plain(gt.noise)
    if gt.rig is not None:
        d["rig"] = _rel(gt.rig, base)
    if gt.trajectory is not None:
        d["trajectory"] = _rel(gt.trajectory, base)
    atomic_write_text(p, yaml.safe_dump(d, sort_keys=False))
