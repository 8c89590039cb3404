"""ROS messages <-> realsim_core types, converted once at the node's boundary.

Only message fields are read here; decoding pixel payloads is realsim_core.images' job.
Stamps are integer nanoseconds; poses are [4, 4] float64 (metres); joint positions rad
(m for the gripper slide); mesh vertices [V, 3] float64 (metres, object frame) and faces
[F, 3] int64 (vertex indices, counter-clockwise seen from outside).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping, Sequence

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import Point, TransformStamped
from sensor_msgs.msg import JointState
from shape_msgs.msg import Mesh, MeshTriangle
from std_msgs.msg import ColorRGBA
from visualization_msgs.msg import Marker, MarkerArray

from realsim_core.calibration_io import Calibration, ObjectCalibration
from realsim_core.errors import RealsimError
from realsim_core.images import decode_compressed, decode_image, decode_mask_u8
from realsim_core.se3 import matrix_to_quat_xyzw
from realsim_core.types import CameraIntrinsics, ImageSample, JointStateSample

NS = 1_000_000_000


def stamp_to_ns(stamp) -> int:
    """builtin_interfaces/Time -> integer nanoseconds."""
    return int(stamp.sec) * NS + int(stamp.nanosec)


def ns_to_stamp(ns: int) -> Time:
    """Integer nanoseconds (>= 0) -> builtin_interfaces/Time."""
    ns = int(ns)
    return Time(sec=ns // NS, nanosec=ns % NS)


def image_to_sample(msg) -> ImageSample:
    """sensor_msgs/Image -> ImageSample (uint8 [H, W, 3] RGB). RealsimError if undecodable."""
    rgb = decode_image(msg.encoding, msg.height, msg.width, msg.step, msg.data,
                       msg.is_bigendian)
    return ImageSample(stamp_to_ns(msg.header.stamp), rgb, msg.header.frame_id)


def compressed_to_sample(msg) -> ImageSample:
    """sensor_msgs/CompressedImage (jpeg/png) -> ImageSample (uint8 [H, W, 3] RGB)."""
    rgb = decode_compressed(msg.format, msg.data)
    return ImageSample(stamp_to_ns(msg.header.stamp), rgb, msg.header.frame_id)


def mask_to_array(msg) -> np.ndarray:
    """sensor_msgs/Image mask (mono8 labels or any encoding) -> uint8 [H, W]."""
    return decode_mask_u8(msg.encoding, msg.height, msg.width, msg.step, msg.data,
                          msg.is_bigendian)


def camera_info_to_intrinsics(msg) -> CameraIntrinsics:
    """sensor_msgs/CameraInfo -> pinhole intrinsics (pixels).

    Uses the projection matrix P (rectified image) when it is set, else K.
    RealsimError when the size or focal lengths are not positive / finite.
    """
    p = np.asarray(msg.p, dtype=np.float64).reshape(-1)
    k = np.asarray(msg.k, dtype=np.float64).reshape(-1)
    if p.size == 12 and p[0] > 0 and p[5] > 0:
        fx, fy, cx, cy = p[0], p[5], p[2], p[6]
    elif k.size == 9:
        fx, fy, cx, cy = k[0], k[4], k[2], k[5]
    else:
        raise RealsimError("camera_info has neither P nor K")
    w, h = int(msg.width), int(msg.height)
    vals = np.array([fx, fy, cx, cy])
    if w <= 0 or h <= 0 or not np.all(np.isfinite(vals)) or fx <= 0 or fy <= 0:
        raise RealsimError(
            f"camera_info is not usable: {w}x{h}, fx={fx:g}, fy={fy:g}, cx={cx:g}, cy={cy:g}"
        )
    return CameraIntrinsics(w, h, float(fx), float(fy), float(cx), float(cy))


def joint_state_to_sample(msg) -> JointStateSample:
    """sensor_msgs/JointState -> JointStateSample (positions float64 [J], names as sent)."""
    return JointStateSample(
        stamp_to_ns(msg.header.stamp), tuple(msg.name),
        np.asarray(msg.position, dtype=np.float64).reshape(-1),
        np.asarray(msg.velocity, dtype=np.float64).reshape(-1),
        np.asarray(msg.effort, dtype=np.float64).reshape(-1),
    )


def corrected_joint_state(msg, arm: str, offsets: Mapping[str, float]) -> JointState | None:
    """`msg` with `offsets[f"{arm}/{name}"]` added to each named position; same stamp.

    Joints without an offset pass unchanged; velocity and effort are copied. Returns None
    (nothing to republish) when names and positions differ in length or a position is
    not finite: the node never republishes something worse than its input.
    """
    pos = np.asarray(msg.position, dtype=np.float64).reshape(-1)
    if pos.size != len(msg.name) or not np.all(np.isfinite(pos)):
        return None
    add = np.array([offsets.get(f"{arm}/{n}", 0.0) for n in msg.name], dtype=np.float64)
    out = JointState()
    out.header = msg.header
    out.name = list(msg.name)
    out.position = (pos + add).tolist()
    out.velocity = list(msg.velocity)
    out.effort = list(msg.effort)
    return out


def offsets_to_joint_state(offsets: Mapping[str, float], stamp: Time) -> JointState:
    """Joint offsets ({'follower_left/waist': rad}) -> JointState, position = offset."""
    msg = JointState()
    msg.header.stamp = stamp
    msg.name = list(offsets)
    msg.position = [float(v) for v in offsets.values()]
    return msg


def pose_to_transform(pose: np.ndarray, parent: str, child: str, stamp: Time) -> TransformStamped:
    """[4, 4] T_parent_child (m) -> geometry_msgs/TransformStamped."""
    pose = np.asarray(pose, dtype=np.float64)
    q = matrix_to_quat_xyzw(pose[:3, :3])
    t = TransformStamped()
    t.header.stamp = stamp
    t.header.frame_id = parent
    t.child_frame_id = child
    tr = t.transform.translation
    tr.x, tr.y, tr.z = (float(v) for v in pose[:3, 3])
    r = t.transform.rotation
    r.x, r.y, r.z, r.w = (float(v) for v in q)
    return t


def transform_to_pose(t: TransformStamped) -> np.ndarray:
    """geometry_msgs/TransformStamped -> [4, 4] T_parent_child (m)."""
    from realsim_core.rig import quat_xyzw_to_matrix_np

    r = t.transform.rotation
    tr = t.transform.translation
    pose = np.eye(4)
    pose[:3, :3] = quat_xyzw_to_matrix_np([r.x, r.y, r.z, r.w])
    pose[:3, 3] = [tr.x, tr.y, tr.z]
    return pose


def calibration_to_transforms(cal: Calibration, stamp: Time) -> list[TransformStamped]:
    """Every camera of `cal` as mount frame -> optical frame transforms."""
    return [pose_to_transform(c.pose, c.parent_frame, c.child_frame, stamp)
            for c in cal.cameras.values()]


# ------------------------------------------------------------------------------ objects

# Distinguishable opaque colours (RGB in [0, 1]); an object's colour follows its name.
OBJECT_COLOURS = (
    (0.90, 0.60, 0.00), (0.35, 0.70, 0.90), (0.00, 0.60, 0.50), (0.95, 0.90, 0.25),
    (0.00, 0.45, 0.70), (0.80, 0.40, 0.00), (0.80, 0.60, 0.70), (0.60, 0.60, 0.60),
)


def _name_hash(name: str) -> int:
    """Stable non-negative int32 for `name` (not Python's salted hash())."""
    return zlib.crc32(name.encode("utf-8")) & 0x7FFFFFFF


def object_marker_id(name: str) -> tuple[str, int]:
    """(namespace, id) of the marker of object `name`: the same for a name in every run."""
    return name, _name_hash(name)


def object_colour(name: str) -> ColorRGBA:
    r, g, b = OBJECT_COLOURS[_name_hash(name) % len(OBJECT_COLOURS)]
    return ColorRGBA(r=r, g=g, b=b, a=1.0)


def _check_mesh(vertices, faces, what: str) -> tuple[np.ndarray, np.ndarray]:
    """-> (vertices [V, 3] float64, faces [F, 3] int64); RealsimError if not a valid mesh."""
    v = np.asarray(vertices, dtype=np.float64)
    f = np.asarray(faces)
    if v.ndim != 2 or v.shape[1] != 3 or f.ndim != 2 or f.shape[1] != 3:
        raise RealsimError(f"{what}: expected vertices [V, 3] and faces [F, 3], got "
                           f"{list(v.shape)} and {list(f.shape)}")
    if not len(f):
        raise RealsimError(f"{what}: no triangles")
    if not np.issubdtype(f.dtype, np.integer):
        raise RealsimError(f"{what}: face indices are not integers ({f.dtype})")
    if not np.all(np.isfinite(v)):
        raise RealsimError(f"{what}: vertices are not finite")
    if f.min() < 0 or f.max() >= len(v):
        raise RealsimError(f"{what}: face indices outside [0, {len(v)})")
    return v, f.astype(np.int64)


def load_mesh(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read an OBJ/STL/PLY mesh as stored (trimesh, `process=False`: no merging/reordering).

    Returns vertices [V, 3] float64 (file units, metres by convention) and faces [F, 3]
    int64. RealsimError with one line naming the file when it is missing, unreadable or
    not a triangle mesh.
    """
    import trimesh

    p = os.fspath(path)
    if not os.path.isfile(p):
        raise RealsimError(f"mesh file not found: {p}")
    try:
        mesh = trimesh.load(p, process=False, force="mesh")
    except Exception as exc:  # trimesh raises many kinds for bad files
        raise RealsimError(f"cannot read mesh {p}: {type(exc).__name__}: "
                           f"{' '.join(str(exc).split())}") from None
    faces = getattr(mesh, "faces", None)
    if faces is None:
        raise RealsimError(f"cannot read mesh {p}: not a triangle mesh")
    return _check_mesh(mesh.vertices, faces, p)


def _points(xyz: np.ndarray) -> list[Point]:
    """[N, 3] float64 -> geometry_msgs/Point list."""
    return [Point(x=x, y=y, z=z) for x, y, z in np.asarray(xyz, np.float64).tolist()]


def mesh_msg(vertices, faces) -> Mesh:
    """Mesh arrays -> shape_msgs/Mesh: vertices [V, 3] (m), faces [F, 3] vertex indices."""
    v, f = _check_mesh(vertices, faces, "mesh")
    msg = Mesh()
    msg.vertices = _points(v)
    msg.triangles = [MeshTriangle(vertex_indices=tri) for tri in f.astype(np.uint32)]
    return msg


def object_markers(
    objects: Sequence[ObjectCalibration],
    frame_id: str,
    stamp: Time,
    meshes: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> MarkerArray:
    """The objects as RViz markers in `frame_id` (the world frame of their poses).

    The array is the whole set: a DELETEALL marker first (objects no longer there vanish),
    then one TRIANGLE_LIST marker per object, its mesh moved by the pose T_world_object and
    expanded to 3 points per face; namespace = object name, id = a hash of the name, a
    colour per name. `meshes` maps names to preloaded (vertices [V, 3], faces [F, 3]) in
    the object frame; without it each object's mesh file is read (RealsimError if one
    cannot be).
    """
    out = MarkerArray()
    clear = Marker(action=Marker.DELETEALL)
    clear.header.frame_id = frame_id
    clear.header.stamp = stamp
    out.markers.append(clear)
    for obj in objects:
        if meshes is None:
            v, f = load_mesh(obj.mesh)
        else:
            v, f = _check_mesh(*meshes[obj.name], f"object {obj.name}")
        pose = np.asarray(obj.pose, dtype=np.float64)
        world = v @ pose[:3, :3].T + pose[:3, 3]  # [V, 3] m
        m = Marker(type=Marker.TRIANGLE_LIST, action=Marker.ADD)
        m.header.frame_id = frame_id
        m.header.stamp = stamp
        m.ns, m.id = object_marker_id(obj.name)
        m.pose.orientation.w = 1.0  # points are already in frame_id
        m.scale.x = m.scale.y = m.scale.z = 1.0
        m.color = object_colour(obj.name)
        m.frame_locked = False
        m.points = _points(world[f.reshape(-1)])
        out.markers.append(m)
    return out
