"""Synthetic ALOHA 2 recordings with exact ground truth, rendered by MuJoCo's own renderer.

`synthesize(out_dir, cfg)` writes:

    OUT/bag/                 rosbag2 (MCAP): images rgb8 + camera_info (all cameras, same
                             stamps, `image_rate_hz`), JointState per arm (`joint_rate_hz`)
    OUT/rig.yaml             rig to calibrate with; camera nominals = miscalibrated start
    OUT/ground_truth.yaml    truth in the calibration.yaml schema + nominal, object_meshes,
                             noise, rig, trajectory (see calibration_io)
    OUT/trajectory.npz       stamp_ns [F], q_true [F, J], q_measured [F, J], joint_names [J]
                             at the image stamps (what `evaluate` needs for the TCP error)
    OUT/objects/<name>.obj   true object meshes in the object frame; `<name>_world.obj` in
                             the world frame

Truth model (decisions):
- true camera pose = rig nominal @ D, with D a rigid offset whose translation has length
  exactly `camera_offset_mm` and whose rotation angle is exactly `camera_offset_deg`
  (random directions), so `evaluate(nominal, truth)` reports exactly those numbers;
- true joint offsets ~ N(0, joint_offset_std) rad for hinges; for slide-driven joints
  (the gripper, metres) the std is `joint_offset_std * SLIDE_STD_M_PER_RAD`;
- JointState in the bag: measured = true - offset + N(0, joint_noise_std) per sample
  (slides scaled the same way); the ROS `gripper` value is the opening of one finger (m)
  and, when the rig maps `gripper` but not `left_finger`/`right_finger`, those are
  published too (= gripper, -gripper) like the Interbotix driver;
- trajectories: per joint a centre plus three sinusoids (random frequency 0.05-0.35 Hz,
  random phase), clipped to the joint range: smooth, covering the workspace, wrist cameras
  sweep the table, grippers open and close;
- objects: box, cylinder, sphere, torus (non-convex), cycled, random yaw and table
  position, resting on the table top (z = 0); rendered as the same triangle meshes;
- bumps (`--bump CAMERA:T_FRAC:MM:DEG`, repeatable): from image frame
  round(T_FRAC * frames) on, CAMERA's true pose is its pose before @ B, with B a rigid
  offset of exactly MM / DEG (random directions, drawn from a generator seeded with
  [seed, 1] so the rest of the recording is the same as without the bump). The
  ground truth (`cameras:`) describes the FINAL pose, what a calibration that follows
  the bump should end at; `noise: bump_events` lists each bump with its first frame,
  stamp and the pose before it.

Deterministic for a given config (numpy Generator seeded with `seed`).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from realsim_core.errors import RealsimError
from realsim_core.rig import MJCF_TO_OPTICAL, Rig, intrinsics_from_fovy, load_mjmodel, load_rig
from realsim_core.types import CameraIntrinsics

SLIDE_STD_M_PER_RAD = 0.1  # gripper offset std (m) per rad of --joint-offset-std
DEFAULT_FOVY_DEG = 58.0
START_NS = 1_700_000_000_000_000_000
OBJECT_KINDS = ("box", "cylinder", "sphere", "torus")
_OBJECT_COLOURS = ((0.85, 0.15, 0.1), (0.1, 0.55, 0.9), (0.95, 0.8, 0.1), (0.2, 0.8, 0.3),
                   (0.8, 0.3, 0.8), (1.0, 0.5, 0.1))

# centre, amplitude (rad) per ROS joint name for the random trajectories (ALOHA-like poses)
_MOTION = {
    "waist": (0.0, 0.55),
    "shoulder": (-0.05, 0.4),
    "elbow": (0.1, 0.35),
    "forearm_roll": (0.0, 0.5),
    "wrist_angle": (0.75, 0.45),
    "wrist_rotate": (0.0, 0.8),
}


@dataclass(frozen=True)
class SynthConfig:
    """Options of `realsim synth` (units in the names)."""

    seed: int = 0
    frames: int = 40  # image frames
    joint_offset_std: float = 0.02  # rad
    joint_noise_std: float = 0.0  # rad, per JointState sample
    camera_offset_mm: float = 10.0
    camera_offset_deg: float = 1.0
    objects: int = 4
    resolution: tuple[int, int] = (424, 240)  # width, height
    rig: str | None = None  # rig file; None = builtin:aloha2
    image_rate_hz: float = 5.0
    joint_rate_hz: float = 50.0
    bumps: tuple = ()  # ((camera, t_frac, mm, deg), ...): camera moved mid-recording
    object_masks: bool = False  # also write /<cam>/object_mask (mono8, object i -> i + 1)


@dataclass(frozen=True)
class Bump:
    """A camera moved mid-recording: from image frame `frame` on, pose = before @ offset."""

    camera: str
    frame: int
    offset: np.ndarray  # [4, 4] rigid, applied on the right of T_mount_optical
    mm: float
    deg: float


@dataclass(frozen=True)
class SceneObject:
    """An object on the table: mesh (object frame, metres), pose and colour."""

    name: str
    kind: str
    vertices: np.ndarray  # [V, 3]
    faces: np.ndarray  # [T, 3] int
    pose: np.ndarray  # [4, 4] T_world_object
    rgba: tuple[float, float, float, float]


@dataclass(frozen=True)
class Simulation:
    """Everything about a recording except pixels (cheap; used by `synthesize` and studies)."""

    joint_names: tuple[str, ...]
    joint_stamps_ns: np.ndarray  # [N] int64
    q_true: np.ndarray  # [N, J] true joint values (rad; m for slides)
    q_measured: np.ndarray  # [N, J] what the bag carries
    image_index: np.ndarray  # [F] indices into the joint grid of the image stamps
    joint_offsets: np.ndarray  # [J] true offsets: true = measured + offset (+ noise)
    camera_truth: dict  # name -> [4, 4] true T_mount_optical (final, after any bump)
    objects: tuple[SceneObject, ...]
    bumps: tuple[Bump, ...] = ()
    camera_truth_start: dict | None = None  # name -> [4, 4] before any bump

    def camera_truth_at(self, frame: int) -> dict:
        """{camera: [4, 4] T_mount_optical} true at image frame `frame`."""
        if not self.bumps:
            return self.camera_truth
        out = dict(self.camera_truth_start)
        for b in self.bumps:
            if frame >= b.frame:
                out[b.camera] = out[b.camera] @ b.offset
        return out


# ------------------------------------------------------------------------------ sampling


def _is_slide(rig: Rig, model) -> np.ndarray:
    import mujoco

    out = []
    for a in rig.arms:
        for jm in a.joints:
            jid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, jm.mjcf[0])
            out.append(int(model.jnt_type[jid]) == int(mujoco.mjtJoint.mjJNT_SLIDE))
    return np.array(out, bool)


def _joint_ranges(rig: Rig, model) -> np.ndarray:
    """[J, 2] range of the ROS joint value implied by its first MJCF joint (or +-pi)."""
    import mujoco

    out = []
    for a in rig.arms:
        for jm in a.joints:
            jid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, jm.mjcf[0])
            lo, hi = model.jnt_range[jid] / jm.scale[0]
            lo, hi = min(lo, hi), max(lo, hi)
            if not model.jnt_limited[jid] or hi <= lo:
                lo, hi = -math.pi, math.pi
            out.append((lo, hi))
    return np.array(out, np.float64)


def random_camera_offset(rng: np.random.Generator, mm: float, deg: float) -> np.ndarray:
    """Rigid offset [4, 4]: translation of length `mm`, rotation by `deg`, random directions."""
    from scipy.spatial.transform import Rotation

    def unit():
        v = rng.normal(size=3)
        return v / np.linalg.norm(v)

    D = np.eye(4)
    D[:3, :3] = Rotation.from_rotvec(unit() * math.radians(deg)).as_matrix()
    D[:3, 3] = unit() * mm / 1000.0
    return D


def random_trajectory(rig: Rig, model, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Smooth joint trajectories at times t [N] (s) -> [N, J] (rad; m for slides)."""
    ranges = _joint_ranges(rig, model)
    slide = _is_slide(rig, model)
    names = [j.ros_name for a in rig.arms for j in a.joints]
    q = np.zeros((len(t), len(names)))
    for j, name in enumerate(names):
        lo, hi = ranges[j]
        if slide[j]:
            centre, amp = (lo + hi) / 2, (hi - lo) / 2
        else:
            centre, amp = _MOTION.get(name, ((lo + hi) / 2, 0.3))
        freqs = rng.uniform(0.05, 0.35, 3)
        phases = rng.uniform(0, 2 * np.pi, 3)
        weights = rng.dirichlet(np.ones(3))
        wave = sum(w * np.sin(2 * np.pi * f * t + p) for w, f, p in zip(weights, freqs, phases))
        wave = wave / max(np.abs(wave).max(), 1e-9) if slide[j] else wave
        q[:, j] = np.clip(centre + amp * wave, lo, hi)
    return q


def make_objects(n: int, rng: np.random.Generator) -> tuple[SceneObject, ...]:
    """Make n objects (box, cylinder, sphere, torus, ...) resting on the table top (z = 0)."""
    import trimesh
    from scipy.spatial.transform import Rotation

    objs: list[SceneObject] = []
    placed: list[np.ndarray] = []
    for i in range(n):
        kind = OBJECT_KINDS[i % len(OBJECT_KINDS)]
        s = rng.uniform(0.8, 1.2)
        if kind == "box":
            mesh = trimesh.creation.box(extents=np.array([0.05, 0.035, 0.04]) * s)
        elif kind == "cylinder":
            mesh = trimesh.creation.cylinder(radius=0.022 * s, height=0.06 * s, sections=32)
        elif kind == "sphere":
            mesh = trimesh.creation.icosphere(subdivisions=3, radius=0.025 * s)
        else:
            mesh = trimesh.creation.torus(0.03 * s, 0.011 * s, major_sections=32,
                                          minor_sections=16)
        for _ in range(200):
            xy = rng.uniform([-0.22, -0.18], [0.22, 0.18])
            if all(np.linalg.norm(xy - p) > 0.1 for p in placed):
                break
        placed.append(xy)
        T = np.eye(4)
        T[:3, :3] = Rotation.from_euler("z", rng.uniform(0, 2 * np.pi)).as_matrix()
        T[:3, 3] = [xy[0], xy[1], -mesh.vertices[:, 2].min()]
        rgb = _OBJECT_COLOURS[i % len(_OBJECT_COLOURS)]
        objs.append(SceneObject(f"object_{i}", kind, np.asarray(mesh.vertices, np.float64),
                                np.asarray(mesh.faces, np.int64), T, (*rgb, 1.0)))
    return tuple(objs)


def simulate(rig: Rig, model, cfg: SynthConfig) -> Simulation:
    """Sample truth, trajectories and measurements for `cfg` (no rendering)."""
    if cfg.frames < 1:
        raise RealsimError(f"--frames must be >= 1, got {cfg.frames}")
    ratio = cfg.joint_rate_hz / cfg.image_rate_hz
    if ratio < 1 or abs(ratio - round(ratio)) > 1e-9:
        raise RealsimError("joint rate must be an integer multiple of the image rate")
    ratio = int(round(ratio))
    rng = np.random.default_rng(cfg.seed)
    names = rig.joint_names
    slide = _is_slide(rig, model)
    scale = np.where(slide, SLIDE_STD_M_PER_RAD, 1.0)
    offsets = rng.normal(0.0, cfg.joint_offset_std, len(names)) * scale
    camera_truth = {
        c.name: c.nominal @ random_camera_offset(rng, cfg.camera_offset_mm, cfg.camera_offset_deg)
        for c in rig.cameras
    }
    n = (cfg.frames - 1) * ratio + 1
    step_ns = int(round(1e9 / cfg.joint_rate_hz))
    stamps = START_NS + np.arange(n, dtype=np.int64) * step_ns
    q_true = random_trajectory(rig, model, np.arange(n) * step_ns * 1e-9, rng)
    noise = rng.normal(0.0, 1.0, q_true.shape) * cfg.joint_noise_std * scale
    q_meas = q_true - offsets + noise
    objects = make_objects(cfg.objects, rng)
    bumps = make_bumps(rig, cfg)
    start = dict(camera_truth)
    for b in bumps:
        camera_truth[b.camera] = camera_truth[b.camera] @ b.offset
    return Simulation(names, stamps, q_true, q_meas, np.arange(cfg.frames) * ratio, offsets,
                      camera_truth, objects, bumps, start)


def make_bumps(rig: Rig, cfg: SynthConfig) -> tuple[Bump, ...]:
    """Check `cfg.bumps` and draw their offsets (own generator: the rest is unchanged)."""
    rng = np.random.default_rng([cfg.seed, 1])
    out = []
    names = rig.camera_names
    for cam, frac, mm, deg in cfg.bumps:
        if cam not in names:
            raise RealsimError(f"--bump: unknown camera {cam!r} (rig has {', '.join(names)})")
        if not 0.0 < frac < 1.0:
            raise RealsimError(f"--bump {cam}: T_FRAC must be in (0, 1), got {frac:g}")
        if mm < 0 or deg < 0 or not (math.isfinite(mm) and math.isfinite(deg)):
            raise RealsimError(f"--bump {cam}: MM and DEG must be finite and >= 0")
        frame = int(round(frac * cfg.frames))
        if not 0 < frame < cfg.frames:
            raise RealsimError(f"--bump {cam}: T_FRAC {frac:g} of {cfg.frames} frames leaves "
                               "no frame before or after the bump")
        out.append(Bump(cam, frame, random_camera_offset(rng, mm, deg), float(mm), float(deg)))
    return tuple(sorted(out, key=lambda b: b.frame))


# ----------------------------------------------------------------------------- rendering


def camera_fovy_deg(intrinsics: CameraIntrinsics | None) -> float:
    """Vertical field of view (deg) from intrinsics (MuJoCo renders square pixels)."""
    if intrinsics is None:
        return DEFAULT_FOVY_DEG
    return math.degrees(2.0 * math.atan(0.5 * intrinsics.height / intrinsics.fy))


def build_render_model(rig: Rig, objects, width: int, height: int):
    """The rig's MJCF plus object meshes and one camera `realsim/<cam>` per rig camera."""
    import mujoco

    try:
        spec = mujoco.MjSpec.from_file(str(rig.mjcf_path))
    except ValueError as exc:
        msg = " ".join(str(exc).split())
        raise RealsimError(f"cannot load MJCF {rig.mjcf_path}: {msg}") from None
    from realsim_core.se3 import matrix_to_quat_xyzw

    for o in objects:
        spec.add_mesh(name=f"realsim/{o.name}", uservert=o.vertices.astype(np.float32).ravel(),
                      userface=o.faces.astype(np.int32).ravel())
        x, y, z, w = matrix_to_quat_xyzw(o.pose[:3, :3])
        body = spec.worldbody.add_body(name=f"realsim/{o.name}", pos=o.pose[:3, 3],
                                       quat=[w, x, y, z])
        body.add_geom(type=mujoco.mjtGeom.mjGEOM_MESH, meshname=f"realsim/{o.name}",
                      rgba=o.rgba, contype=0, conaffinity=0)
    for c in rig.cameras:
        spec.worldbody.add_camera(name=f"realsim/{c.name}", fovy=camera_fovy_deg(c.intrinsics))
    spec.visual.global_.offwidth = max(int(spec.visual.global_.offwidth), width)
    spec.visual.global_.offheight = max(int(spec.visual.global_.offheight), height)
    try:
        return spec.compile()
    except ValueError as exc:
        raise RealsimError(f"cannot compile render model: {' '.join(str(exc).split())}") from None


def _ensure_gl() -> None:
    os.environ.setdefault("MUJOCO_GL", "egl")


def make_renderer(model, width: int, height: int):
    """mujoco.Renderer, EGL first, OSMesa as fallback (MUJOCO_GL is read at import time)."""
    import mujoco

    try:
        return mujoco.Renderer(model, height, width)
    except Exception as exc:  # no EGL device etc.
        raise RealsimError(
            f"cannot create a MuJoCo renderer ({' '.join(str(exc).split())}); "
            "set MUJOCO_GL=egl or MUJOCO_GL=osmesa (needs libegl1 / libosmesa6)"
        ) from None


def render_frames(rig: Rig, render_model, q: np.ndarray, camera_truth: dict, width: int,
                  height: int, callback=None, segmentation: bool = False):
    """Render every camera for joint frames q [F, J] -> {cam: uint8 [F, H, W, 3]}.

    `camera_truth` maps camera name -> [4, 4] T_mount_optical used for rendering. With
    `segmentation=True` the images are int32 [F, H, W] MuJoCo geom ids (-1 = background).
    """
    import mujoco

    from realsim_core.kinematics import joint_layout

    lay = joint_layout(rig, render_model)
    d = mujoco.MjData(render_model)
    cam_ids = {c.name: mujoco.mj_name2id(render_model, mujoco.mjtObj.mjOBJ_CAMERA,
                                         f"realsim/{c.name}") for c in rig.cameras}
    mounts = {c.name: (None if c.mount == rig.world_frame else
                       mujoco.mj_name2id(render_model, mujoco.mjtObj.mjOBJ_BODY, c.mount))
              for c in rig.cameras}
    shape = (len(q), height, width) if segmentation else (len(q), height, width, 3)
    out = {c.name: np.zeros(shape, np.int32 if segmentation else np.uint8) for c in rig.cameras}
    renderer = make_renderer(render_model, width, height)
    if segmentation:
        renderer.enable_segmentation_rendering()
    try:
        for f, qf in enumerate(q):
            d.qpos[:] = lay.qpos(qf)
            mujoco.mj_kinematics(render_model, d)
            mujoco.mj_camlight(render_model, d)
            for c in rig.cameras:
                mount = np.eye(4)
                b = mounts[c.name]
                if b is not None:
                    mount[:3, :3], mount[:3, 3] = d.xmat[b].reshape(3, 3), d.xpos[b]
                T = mount @ camera_truth[c.name] @ MJCF_TO_OPTICAL  # optical -> MJCF camera
                cid = cam_ids[c.name]
                d.cam_xpos[cid] = T[:3, 3]
                d.cam_xmat[cid] = T[:3, :3].ravel()
                renderer.update_scene(d, camera=cid)
                img = renderer.render()
                if segmentation:  # [H, W, 2] = (object id, object type)
                    geom = img[..., 1] == int(mujoco.mjtObj.mjOBJ_GEOM)
                    img = np.where(geom, img[..., 0], -1)
                out[c.name][f] = img
            if callback is not None:
                callback(f)
    finally:
        renderer.close()
    return out


# -------------------------------------------------------------------------------- writing


def _object_labels(rig: Rig, render_model, sim, q_img, cuts, w: int, h: int) -> dict:
    """{camera: uint8 [F, H, W]}: 0 background, i + 1 where object i is visible."""
    import mujoco

    lut = np.zeros(render_model.ngeom + 1, np.uint8)  # index geom id + 1 (-1 -> 0)
    for i, o in enumerate(sim.objects):
        bid = mujoco.mj_name2id(render_model, mujoco.mjtObj.mjOBJ_BODY, f"realsim/{o.name}")
        lut[1 + np.flatnonzero(render_model.geom_bodyid == bid)] = i + 1
    parts = [render_frames(rig, render_model, q_img[lo:hi], sim.camera_truth_at(lo), w, h,
                           segmentation=True) for lo, hi in zip(cuts[:-1], cuts[1:])]
    return {c: lut[np.concatenate([p[c] for p in parts]) + 1] for c in parts[0]}


def _write_obj(path: Path, vertices: np.ndarray, faces: np.ndarray) -> None:
    import trimesh

    path.parent.mkdir(parents=True, exist_ok=True)
    trimesh.Trimesh(vertices, faces, process=False).export(str(path))


@dataclass(frozen=True)
class SynthResult:
    """Paths written and timings (s)."""

    out_dir: Path
    bag: Path
    rig: Path
    ground_truth: Path
    trajectory: Path
    seconds_render: float
    seconds_total: float


def synthesize(out_dir: str | os.PathLike, cfg: SynthConfig, progress=None) -> SynthResult:
    """Render and write a ground-truth recording (layout in the module docstring)."""
    from realsim_core.bag import BagWriter
    from realsim_core.calibration_io import (
        Calibration,
        CameraCalibration,
        GroundTruth,
        ObjectCalibration,
        write_ground_truth,
    )
    from realsim_core.rig import write_rig

    t0 = time.perf_counter()
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise RealsimError(f"output folder {out} exists and is not empty")
    w, h = cfg.resolution
    if w < 8 or h < 8:
        raise RealsimError(f"resolution too small: {w}x{h}")
    for name in ("joint_offset_std", "joint_noise_std", "camera_offset_mm", "camera_offset_deg"):
        if getattr(cfg, name) < 0:
            raise RealsimError(f"--{name.replace('_', '-')} must be >= 0")
    if cfg.objects < 0:
        raise RealsimError("--objects must be >= 0")
    _ensure_gl()
    rig = load_rig(cfg.rig)
    model = load_mjmodel(rig)
    sim = simulate(rig, model, cfg)

    render_model = build_render_model(rig, sim.objects, w, h)
    t1 = time.perf_counter()
    q_img = sim.q_true[sim.image_index]
    cuts = sorted({0, cfg.frames, *(b.frame for b in sim.bumps)})
    parts = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):  # frames between bumps share camera poses
        parts.append(render_frames(
            rig, render_model, q_img[lo:hi], sim.camera_truth_at(lo), w, h,
            callback=None if progress is None else (lambda f, lo=lo: progress(lo + f))))
    images = {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
    labels = (_object_labels(rig, render_model, sim, q_img, cuts, w, h)
              if cfg.object_masks else None)
    t_render = time.perf_counter() - t1

    out.mkdir(parents=True, exist_ok=True)
    intr = {c.name: intrinsics_from_fovy(w, h, camera_fovy_deg(c.intrinsics)) for c in rig.cameras}
    img_set = {int(i): k for k, i in enumerate(sim.image_index)}
    with BagWriter(out / "bag") as bw:
        for n, stamp in enumerate(sim.joint_stamps_ns):
            stamp = int(stamp)
            if n in img_set:
                k = img_set[n]
                for c in rig.cameras:
                    bw.write_image(c.image_topic, stamp, images[c.name][k], c.optical_frame)
                    if labels is not None:
                        bw.write_mask(f"/{c.name}/object_mask", stamp, labels[c.name][k],
                                      c.optical_frame)
                    bw.write_camera_info(c.info_topic, stamp, intr[c.name], c.optical_frame)
            j = 0
            for a in rig.arms:
                names = list(a.ros_joint_names)
                vals = list(sim.q_measured[n, j:j + len(names)])
                if "gripper" in names and not {"left_finger", "right_finger"} & set(names):
                    g = vals[names.index("gripper")]
                    names += ["left_finger", "right_finger"]
                    vals += [g, -g]
                bw.write_joint_state(a.joint_states_topic, stamp, names, vals)
                j += len(a.ros_joint_names)

    traj = out / "trajectory.npz"
    np.savez(traj, stamp_ns=sim.joint_stamps_ns[sim.image_index],
             q_true=sim.q_true[sim.image_index], q_measured=sim.q_measured[sim.image_index],
             joint_names=np.array(sim.joint_names))
    rig_path = out / "rig.yaml"
    write_rig(rig, rig_path)

    objs = []
    world_meshes = {}
    for o in sim.objects:
        p = out / "objects" / f"{o.name}.obj"
        _write_obj(p, o.vertices, o.faces)
        pw = out / "objects" / f"{o.name}_world.obj"
        _write_obj(pw, o.vertices @ o.pose[:3, :3].T + o.pose[:3, 3], o.faces)
        objs.append(ObjectCalibration(o.name, p, o.pose))
        world_meshes[o.name] = pw

    def cams(poses):
        return {c.name: CameraCalibration(c.mount, c.optical_frame, poses[c.name])
                for c in rig.cameras}

    truth = Calibration(
        cameras=cams(sim.camera_truth),
        joint_offsets=dict(zip(sim.joint_names, map(float, sim.joint_offsets))),
        objects=tuple(objs),
        metrics={"frames": cfg.frames, "kinds": {o.name: o.kind for o in sim.objects}},
    )
    nominal = Calibration(
        cameras=cams({c.name: c.nominal for c in rig.cameras}),
        joint_offsets={n: 0.0 for n in sim.joint_names},
    )
    noise = asdict(cfg)
    noise["resolution"] = f"{w}x{h}"
    noise["bumps"] = [f"{c}:{f:g}:{mm:g}:{deg:g}" for c, f, mm, deg in cfg.bumps]
    noise["bump_events"] = [
        {"camera": b.camera, "frame": b.frame,
         "stamp_ns": int(sim.joint_stamps_ns[sim.image_index[b.frame]]),
         "translation_mm": b.mm, "rotation_deg": b.deg,
         "pose_before": sim.camera_truth_at(b.frame - 1)[b.camera].tolist()}
        for b in sim.bumps]
    noise["rig"] = cfg.rig or "builtin:aloha2"
    noise["slide_std_m_per_rad"] = SLIDE_STD_M_PER_RAD
    gt_path = out / "ground_truth.yaml"
    write_ground_truth(gt_path, GroundTruth(truth, nominal, world_meshes, noise, rig_path, traj))
    return SynthResult(out, out / "bag", rig_path, gt_path, traj, t_render,
                       time.perf_counter() - t0)
