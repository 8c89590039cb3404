"""ROS messages <-> realsim_core types, converted once at the node's boundary.

Only message fields are read here; decoding pixel payloads is realsim_core.images' job.
Stamps are integer nanoseconds; poses are [4, 4] float64 (metres); joint positions rad
(m for the gripper slide).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import TransformStamped
from sensor_msgs.msg import JointState

from realsim_core.calibration_io import Calibration
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
