"""Rig files: which MJCF, which joints and cameras are calibrated, and their nominal poses.

A rig file is YAML (schema in contracts.md). `load_rig` validates it and returns a frozen
`Rig`; every problem is a `RealsimError` that names the offending key, e.g.
`rig.yaml: arms.follower_left.joints.waist: unknown MJCF joint 'left/wiast'`.

Joint mapping. Each entry of `arms.<arm>.joints` maps a ROS joint name to either
- an MJCF joint name (`waist: left/waist`): qpos = value, or
- a linear coupling `{mjcf: [a, b], scale: [1.0, -1.0]}`: qpos_a = 1.0 * value,
  qpos_b = -1.0 * value. The builtin rig maps the ROS `gripper` joint this way to both
  finger slides (value = finger opening in metres, one finger), so each arm has 7 DoF.

Camera frames. `nominal` is the pose of the REP-103 optical frame (z forward, x right,
y down) in the mount body's frame. An MJCF camera looks along -z with +y up, so
`T_mount_optical = T_mount_mjcfcam @ diag(1, -1, -1, 1)` (`MJCF_TO_OPTICAL`).
A camera whose `mount` is the rig's `world_frame` is *fixed*; any other is *mounted*
(on a wrist, moving with the body).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from realsim_core.errors import RealsimError
from realsim_core.se3 import matrix_to_quat_xyzw
from realsim_core.types import CameraIntrinsics

BUILTIN_PREFIX = "builtin:"
ASSETS_DIR = Path(__file__).resolve().parent / "assets"
BUILTIN_MODELS = {"aloha2": ASSETS_DIR / "aloha2.xml"}
DEFAULT_RIG_PATH = ASSETS_DIR / "aloha2_rig.yaml"

#: MJCF camera frame (-z forward, +y up) -> REP-103 optical frame (z forward, y down).
MJCF_TO_OPTICAL = np.diag([1.0, -1.0, -1.0, 1.0])

_ROOT_KEYS = {"model", "world_frame", "arms", "cameras"}
_ARM_KEYS = {"joint_states_topic", "joints", "tcp"}
_CAM_KEYS = {"image_topic", "info_topic", "optical_frame", "mount", "nominal", "intrinsics"}


@dataclass(frozen=True)
class JointMap:
    """One ROS joint driving one or more MJCF joints: qpos[mjcf[i]] = scale[i] * value."""

    ros_name: str
    mjcf: tuple[str, ...]
    scale: tuple[float, ...]


@dataclass(frozen=True)
class ArmSpec:
    """One arm: its JointState topic, joint map (ROS order) and tool centre point."""

    name: str
    joint_states_topic: str
    joints: tuple[JointMap, ...]
    tcp_body: str
    tcp_offset: tuple[float, float, float]  # metres, in tcp_body's frame

    @property
    def ros_joint_names(self) -> tuple[str, ...]:
        """ROS joint names of this arm, in rig order (unprefixed)."""
        return tuple(j.ros_name for j in self.joints)


@dataclass(frozen=True)
class CameraSpec:
    """One camera: topics, optical frame name, mount body and nominal optical pose."""

    name: str
    image_topic: str
    info_topic: str
    optical_frame: str
    mount: str
    nominal: np.ndarray  # [4, 4] T_mount_optical (metres), REP-103 optical axes
    intrinsics: CameraIntrinsics | None


@dataclass(frozen=True)
class Rig:
    """A validated rig file. `model` is as written; `mjcf_path` is resolved."""

    model: str
    mjcf_path: Path
    world_frame: str
    arms: tuple[ArmSpec, ...]
    cameras: tuple[CameraSpec, ...]
    source: Path | None = None

    @property
    def joint_names(self) -> tuple[str, ...]:
        """Prefixed joint names in calibration order, e.g. `follower_left/waist` ([J])."""
        return tuple(f"{a.name}/{j.ros_name}" for a in self.arms for j in a.joints)

    @property
    def fixed_cameras(self) -> tuple[CameraSpec, ...]:
        """Cameras mounted on the world frame, in file order ([Cf])."""
        return tuple(c for c in self.cameras if c.mount == self.world_frame)

    @property
    def mounted_cameras(self) -> tuple[CameraSpec, ...]:
        """Cameras mounted on a moving body (wrist cameras), in file order ([Cw])."""
        return tuple(c for c in self.cameras if c.mount != self.world_frame)

    def camera(self, name: str) -> CameraSpec:
        """The camera called `name` (RealsimError if unknown)."""
        for c in self.cameras:
            if c.name == name:
                return c
        raise RealsimError(f"unknown camera '{name}' (rig has: {', '.join(self.camera_names)})")

    @property
    def camera_names(self) -> tuple[str, ...]:
        """All camera names in file order."""
        return tuple(c.name for c in self.cameras)


# ----------------------------------------------------------------------------- parsing


class _Ctx:
    """Carries the file name so every error names the file and the key."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, key: str, msg: str) -> RealsimError:
        return RealsimError(f"{self.where}: {key}: {msg}")

    def get(self, d: dict, key: str, path: str, typ: type | tuple, required: bool = True):
        full = f"{path}.{key}" if path else key
        if key not in d or d[key] is None:
            if required:
                raise self.fail(full, "missing required key")
            return None
        v = d[key]
        if typ is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, typ) or isinstance(v, bool) and typ is not bool:
            tname = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
            raise self.fail(full, f"expected {tname}, got {type(v).__name__} ({v!r})")
        return v

    def floats(self, v: Any, n: int, full: str) -> np.ndarray:
        ok = isinstance(v, (list, tuple)) and len(v) == n and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in v
        )
        if not ok:
            raise self.fail(full, f"expected a list of {n} numbers, got {v!r}")
        arr = np.asarray(v, dtype=np.float64)
        if not np.all(np.isfinite(arr)):
            raise self.fail(full, f"non-finite value in {v!r}")
        return arr

    def unknown(self, d: dict, allowed: set, path: str) -> None:
        extra = sorted(set(d) - allowed)
        if extra:
            raise self.fail(f"{path}.{extra[0]}" if path else extra[0],
                            f"unknown key (allowed: {', '.join(sorted(allowed))})")


def quat_xyzw_to_matrix_np(q) -> np.ndarray:
    """[4] xyzw (normalised here) -> [3, 3], numpy float64 (se3's version is JAX float32)."""
    x, y, z, w = np.asarray(q, np.float64) / np.linalg.norm(q)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ])


def pose_from_dict(d: Any, ctx: _Ctx, path: str) -> np.ndarray:
    """{translation: [3], rotation_xyzw: [4]} -> [4, 4] float64."""
    if not isinstance(d, dict):
        raise ctx.fail(path, f"expected a mapping with translation/rotation_xyzw, got {d!r}")
    t = ctx.floats(ctx.get(d, "translation", path, list), 3, f"{path}.translation")
    q = ctx.floats(ctx.get(d, "rotation_xyzw", path, list), 4, f"{path}.rotation_xyzw")
    if np.linalg.norm(q) < 1e-9:
        raise ctx.fail(f"{path}.rotation_xyzw", "zero quaternion")
    T = np.eye(4)
    T[:3, :3] = quat_xyzw_to_matrix_np(q)
    T[:3, 3] = t
    return T


def pose_to_dict(T: np.ndarray) -> dict:
    """[4, 4] -> {translation, rotation_xyzw} with plain floats (YAML-friendly)."""
    T = np.asarray(T, dtype=np.float64)
    return {
        "translation": [round(float(x), 9) for x in T[:3, 3]],
        "rotation_xyzw": [round(float(x), 9) for x in matrix_to_quat_xyzw(T[:3, :3])],
    }


def _resolve_model(model: str, base_dir: Path, ctx: _Ctx) -> Path:
    if model.startswith(BUILTIN_PREFIX):
        key = model[len(BUILTIN_PREFIX):]
        if key not in BUILTIN_MODELS:
            raise ctx.fail("model", f"unknown builtin model '{model}' "
                           f"(known: {', '.join(BUILTIN_PREFIX + k for k in BUILTIN_MODELS)})")
        return BUILTIN_MODELS[key]
    p = Path(os.path.expanduser(model))
    p = p if p.is_absolute() else base_dir / p
    if not p.is_file():
        raise ctx.fail("model", f"MJCF file not found: {p}")
    return p.resolve()


def _parse_joint(ros: str, v: Any, ctx: _Ctx, path: str) -> JointMap:
    if isinstance(v, str):
        return JointMap(ros, (v,), (1.0,))
    if isinstance(v, dict):
        ctx.unknown(v, {"mjcf", "scale"}, path)
        names = ctx.get(v, "mjcf", path, (list, str))
        names = [names] if isinstance(names, str) else names
        if not names or not all(isinstance(n, str) for n in names):
            raise ctx.fail(f"{path}.mjcf", f"expected MJCF joint name(s), got {names!r}")
        sc = v.get("scale", [1.0] * len(names))
        sc = [sc] if isinstance(sc, (int, float)) and not isinstance(sc, bool) else sc
        scale = ctx.floats(sc, len(names), f"{path}.scale")
        return JointMap(ros, tuple(names), tuple(float(s) for s in scale))
    raise ctx.fail(path, f"expected an MJCF joint name or {{mjcf: [...], scale: [...]}}, got {v!r}")


def _parse_intrinsics(v: Any, ctx: _Ctx, path: str) -> CameraIntrinsics:
    if not isinstance(v, dict):
        raise ctx.fail(path, f"expected a mapping, got {v!r}")
    ctx.unknown(v, {"width", "height", "fx", "fy", "cx", "cy"}, path)
    w = ctx.get(v, "width", path, int)
    h = ctx.get(v, "height", path, int)
    if w <= 0 or h <= 0:
        raise ctx.fail(path, f"width/height must be positive, got {w}x{h}")
    vals = {k: ctx.get(v, k, path, float) for k in ("fx", "fy", "cx", "cy")}
    if vals["fx"] <= 0 or vals["fy"] <= 0:
        raise ctx.fail(f"{path}.fx", "focal lengths must be positive")
    return CameraIntrinsics(w, h, **vals)


def rig_from_dict(data: Any, base_dir: Path, where: str = "rig") -> Rig:
    """Parse and validate a rig mapping (keys as in contracts.md); MJCF names are not checked."""
    ctx = _Ctx(where)
    if not isinstance(data, dict):
        raise RealsimError(f"{where}: expected a YAML mapping at the top level")
    ctx.unknown(data, _ROOT_KEYS, "")
    model = ctx.get(data, "model", "", str)
    world = ctx.get(data, "world_frame", "", str, required=False) or "world"
    mjcf = _resolve_model(model, Path(base_dir), ctx)

    arms_d = ctx.get(data, "arms", "", dict)
    arms = []
    for arm_name, a in arms_d.items():
        p = f"arms.{arm_name}"
        if not isinstance(a, dict):
            raise ctx.fail(p, f"expected a mapping, got {a!r}")
        ctx.unknown(a, _ARM_KEYS, p)
        topic = (ctx.get(a, "joint_states_topic", p, str, required=False)
                 or f"/{arm_name}/joint_states")
        jd = ctx.get(a, "joints", p, dict)
        if not jd:
            raise ctx.fail(f"{p}.joints", "no joints listed")
        joints = tuple(_parse_joint(str(k), v, ctx, f"{p}.joints.{k}") for k, v in jd.items())
        tcp = ctx.get(a, "tcp", p, dict)
        ctx.unknown(tcp, {"body", "offset"}, f"{p}.tcp")
        body = ctx.get(tcp, "body", f"{p}.tcp", str)
        off = tcp.get("offset", [0.0, 0.0, 0.0])
        off = ctx.floats(off, 3, f"{p}.tcp.offset")
        arms.append(ArmSpec(str(arm_name), topic, joints, body, tuple(float(x) for x in off)))

    cams_d = ctx.get(data, "cameras", "", dict)
    cams = []
    for cam_name, c in cams_d.items():
        p = f"cameras.{cam_name}"
        if not isinstance(c, dict):
            raise ctx.fail(p, f"expected a mapping, got {c!r}")
        ctx.unknown(c, _CAM_KEYS, p)
        base = f"/{cam_name}/camera/color"
        cams.append(CameraSpec(
            name=str(cam_name),
            image_topic=ctx.get(c, "image_topic", p, str, False) or f"{base}/image_rect_raw",
            info_topic=ctx.get(c, "info_topic", p, str, False) or f"{base}/camera_info",
            optical_frame=ctx.get(c, "optical_frame", p, str, False)
            or f"{cam_name}_color_optical_frame",
            mount=ctx.get(c, "mount", p, str),
            nominal=pose_from_dict(ctx.get(c, "nominal", p, dict), ctx, f"{p}.nominal"),
            intrinsics=(_parse_intrinsics(c["intrinsics"], ctx, f"{p}.intrinsics")
                        if c.get("intrinsics") is not None else None),
        ))
    if not cams:
        raise ctx.fail("cameras", "no cameras listed")
    return Rig(model, mjcf, world, tuple(arms), tuple(cams), None)


def validate_against_model(rig: Rig, model, where: str = "rig") -> None:
    """Check every MJCF joint / body named by the rig exists in `model` (mujoco.MjModel)."""
    import mujoco

    ctx = _Ctx(where)

    def has(obj, name):
        return mujoco.mj_name2id(model, obj, name) >= 0

    used: dict[str, str] = {}
    for a in rig.arms:
        for jm in a.joints:
            key = f"arms.{a.name}.joints.{jm.ros_name}"
            for n in jm.mjcf:
                if not has(mujoco.mjtObj.mjOBJ_JOINT, n):
                    raise ctx.fail(key, f"unknown MJCF joint '{n}'")
                jid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, n)
                if int(model.jnt_type[jid]) not in (int(mujoco.mjtJoint.mjJNT_HINGE),
                                                    int(mujoco.mjtJoint.mjJNT_SLIDE)):
                    raise ctx.fail(key, f"MJCF joint '{n}' is not a hinge or slide joint")
                if n in used:
                    raise ctx.fail(key, f"MJCF joint '{n}' is already driven by {used[n]}")
                used[n] = key
        if not has(mujoco.mjtObj.mjOBJ_BODY, a.tcp_body):
            raise ctx.fail(f"arms.{a.name}.tcp.body", f"unknown MJCF body '{a.tcp_body}'")
    for c in rig.cameras:
        if c.mount != rig.world_frame and not has(mujoco.mjtObj.mjOBJ_BODY, c.mount):
            raise ctx.fail(f"cameras.{c.name}.mount", f"unknown MJCF body '{c.mount}' "
                           f"(nor the world frame '{rig.world_frame}')")


def load_mjmodel(rig: Rig):
    """Compile the rig's MJCF (mujoco.MjModel); RealsimError if MuJoCo rejects it."""
    import mujoco

    try:
        return mujoco.MjModel.from_xml_path(str(rig.mjcf_path))
    except ValueError as exc:  # mujoco reports XML errors as ValueError
        msg = " ".join(str(exc).split())
        raise RealsimError(f"cannot load MJCF {rig.mjcf_path}: {msg}") from None


def load_rig(path: str | os.PathLike | None = None, check_model: bool = True) -> Rig:
    """Read, validate and (by default) check a rig file against its MJCF.

    `path=None` or `"builtin:aloha2"` loads the default ALOHA 2 rig shipped with realsim.
    """
    if path is None or str(path) == "builtin:aloha2":
        path = DEFAULT_RIG_PATH
    p = Path(path)
    if not p.is_file():
        raise RealsimError(f"rig file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        msg = " ".join(str(exc).split())
        raise RealsimError(f"{p.name}: malformed YAML: {msg}") from None
    rig = rig_from_dict(data, p.resolve().parent, where=p.name)
    rig = Rig(rig.model, rig.mjcf_path, rig.world_frame, rig.arms, rig.cameras, p.resolve())
    if check_model:
        validate_against_model(rig, load_mjmodel(rig), where=p.name)
    return rig


def rig_to_dict(rig: Rig, model: str | None = None) -> dict:
    """Rig -> plain mapping (the YAML schema). `model` overrides the model reference."""
    arms = {}
    for a in rig.arms:
        joints = {}
        for jm in a.joints:
            if len(jm.mjcf) == 1 and jm.scale == (1.0,):
                joints[jm.ros_name] = jm.mjcf[0]
            else:
                joints[jm.ros_name] = {"mjcf": list(jm.mjcf), "scale": list(jm.scale)}
        arms[a.name] = {
            "joint_states_topic": a.joint_states_topic,
            "joints": joints,
            "tcp": {"body": a.tcp_body, "offset": list(a.tcp_offset)},
        }
    cams = {}
    for c in rig.cameras:
        d = {
            "image_topic": c.image_topic,
            "info_topic": c.info_topic,
            "optical_frame": c.optical_frame,
            "mount": c.mount,
            "nominal": pose_to_dict(c.nominal),
        }
        if c.intrinsics is not None:
            k = c.intrinsics
            d["intrinsics"] = {"width": k.width, "height": k.height, "fx": float(k.fx),
                               "fy": float(k.fy), "cx": float(k.cx), "cy": float(k.cy)}
        cams[c.name] = d
    return {"model": model or rig.model, "world_frame": rig.world_frame, "arms": arms,
            "cameras": cams}


def write_rig(rig: Rig, path: str | os.PathLike, model: str | None = None) -> None:
    """Write `rig` as YAML (atomically). A relative MJCF path is made absolute unless given."""
    from realsim_core.calibration_io import atomic_write_text

    if model is None:
        model = rig.model if rig.model.startswith(BUILTIN_PREFIX) else str(rig.mjcf_path)
    atomic_write_text(path, yaml.safe_dump(rig_to_dict(rig, model), sort_keys=False))


def with_nominals(rig: Rig, nominals: dict[str, np.ndarray]) -> Rig:
    """A copy of `rig` with some cameras' nominal poses replaced ({name: [4, 4]})."""
    cams = tuple(
        CameraSpec(c.name, c.image_topic, c.info_topic, c.optical_frame, c.mount,
                   np.asarray(nominals.get(c.name, c.nominal), dtype=np.float64), c.intrinsics)
        for c in rig.cameras
    )
    return Rig(rig.model, rig.mjcf_path, rig.world_frame, rig.arms, cams, rig.source)


def intrinsics_from_fovy(width: int, height: int, fovy_deg: float) -> CameraIntrinsics:
    """Square-pixel pinhole with a centred principal point (what MuJoCo renders)."""
    fy = 0.5 * height / math.tan(math.radians(fovy_deg) / 2.0)
    return CameraIntrinsics(width, height, fy, fy, width / 2.0 - 0.5, height / 2.0 - 0.5)
