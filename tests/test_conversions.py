"""Message conversions (realsim_ros) and the ROS-free online loop (realsim_core.online)."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
from ros_util import needs_ros

from realsim_core.calibration_io import read_calibration
from realsim_core.online import (
    CalibrationStore,
    NominalEstimator,
    OnlineCalibrator,
    SyncOptions,
    check_calibration,
    nominal_calibration,
)
from realsim_core.rig import load_rig
from realsim_core.types import ImageSample, JointStateSample

ARM_JOINTS = ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate",
              "gripper")
MS = 1_000_000


@pytest.fixture(scope="module")
def nominal():
    return nominal_calibration(load_rig("builtin:aloha2", check_model=False))


# ------------------------------------------------------------------------ conversions


@needs_ros
def test_image_and_info_conversions():
    from node_probe import image_msg, info_msg
    from realsim_ros import conversions as conv

    msg = image_msg(1_500_000_000_123, value=7, w=5, h=3, encoding="bgr8")
    s = conv.image_to_sample(msg)
    assert s.stamp_ns == 1_500_000_000_123
    assert s.rgb.shape == (3, 5, 3) and s.rgb.dtype == np.uint8 and (s.rgb == 7).all()
    intr = conv.camera_info_to_intrinsics(info_msg(0, 64, 48))
    assert (intr.width, intr.height, intr.fx, intr.cx, intr.cy) == (64, 48, 64.0, 31.5, 23.5)
    bad = info_msg(0, 64, 48)
    bad.p = [0.0] * 12
    bad.k = [float("nan")] * 9
    with pytest.raises(Exception, match="not usable"):
        conv.camera_info_to_intrinsics(bad)
    assert conv.stamp_to_ns(conv.ns_to_stamp(12_345_678_901)) == 12_345_678_901


@needs_ros
def test_corrected_joint_state_adds_offsets_and_refuses_garbage():
    from node_probe import joint_msg
    from realsim_ros import conversions as conv

    msg = joint_msg(42, [0.1, 0.2], names=("waist", "gripper"))
    msg.velocity = [1.0, 2.0]
    out = conv.corrected_joint_state(
        msg, "follower_left", {"follower_left/waist": 0.01, "follower_right/waist": 5.0})
    assert out.header.stamp == msg.header.stamp
    assert list(out.name) == ["waist", "gripper"]
    np.testing.assert_allclose(out.position, [0.11, 0.2])
    assert list(out.velocity) == [1.0, 2.0]
    assert conv.corrected_joint_state(joint_msg(1, [math.nan, 0.0], ("waist", "gripper")),
                                      "follower_left", {}) is None
    short = joint_msg(1, [0.0], ("waist",))
    short.name = ["waist", "gripper"]
    assert conv.corrected_joint_state(short, "follower_left", {}) is None


@needs_ros
def test_transforms_round_trip(nominal):
    from realsim_ros import conversions as conv

    tfs = conv.calibration_to_transforms(nominal, conv.ns_to_stamp(0))
    assert [t.child_frame_id for t in tfs] == [c.child_frame for c in nominal.cameras.values()]
    for t, cam in zip(tfs, nominal.cameras.values()):
        assert t.header.frame_id == cam.parent_frame
        np.testing.assert_allclose(conv.transform_to_pose(t), cam.pose, atol=1e-12)


# OBJ files store 8 decimals (trimesh's export default): 1e-7 m covers the rounding of
# the box's vertices; everything after reading is float64 arithmetic on those values.
OBJ_ROUNDING_M = 1e-7
POSE_ATOL_M = 1e-12  # float64 transform vs float64 reference: rounding only


def _test_pose(angle: float, axis, t) -> np.ndarray:
    """[4, 4] T_world_object: rotation by `angle` (rad) about `axis`, then translation t (m)."""
    import trimesh

    pose = trimesh.transformations.rotation_matrix(angle, axis)
    pose[:3, 3] = t
    return pose


def _reference_triangles(vertices, faces, pose) -> np.ndarray:
    """Slow readable float64 reference: each face's corners moved by pose, [F * 3, 3] m."""
    out = []
    for face in faces:
        for i in face:
            p = np.array([*vertices[i], 1.0], dtype=np.float64)
            out.append((np.asarray(pose, np.float64) @ p)[:3])
    return np.array(out)


def _box_obj(tmp_path, name="box.obj", extents=(0.04, 0.06, 0.1)):
    import trimesh

    box = trimesh.creation.box(extents=extents)
    path = tmp_path / name
    box.export(path)
    return box, path


@needs_ros
def test_mesh_msg_matches_arrays_and_refuses_bad_meshes(tmp_path):
    from realsim_ros import conversions as conv
    from shape_msgs.msg import Mesh

    from realsim_core.errors import RealsimError

    box, path = _box_obj(tmp_path)
    v, f = conv.load_mesh(path)  # as stored: no merging or reordering
    assert v.dtype == np.float64 and f.dtype == np.int64
    np.testing.assert_allclose(v, box.vertices, atol=OBJ_ROUNDING_M)
    np.testing.assert_array_equal(f, box.faces)

    msg = conv.mesh_msg(v, f)
    assert isinstance(msg, Mesh)
    assert len(msg.triangles) == 12 and len(msg.vertices) == 8
    np.testing.assert_array_equal([list(t.vertex_indices) for t in msg.triangles], f)
    np.testing.assert_array_equal([[p.x, p.y, p.z] for p in msg.vertices], v)

    with pytest.raises(RealsimError, match="outside"):
        conv.mesh_msg(v, np.array([[0, 1, 8]]))
    with pytest.raises(RealsimError, match="not finite"):
        conv.mesh_msg(np.full((3, 3), np.nan), np.array([[0, 1, 2]]))
    with pytest.raises(RealsimError, match="not found"):
        conv.load_mesh(tmp_path / "missing.obj")
    bad = tmp_path / "bad.stl"
    bad.write_bytes(b"\x00garbage")
    with pytest.raises(RealsimError, match="bad.stl"):
        conv.load_mesh(bad)


@needs_ros
def test_object_markers_match_float64_reference(tmp_path):
    from realsim_ros import conversions as conv
    from visualization_msgs.msg import Marker

    from realsim_core.calibration_io import ObjectCalibration

    box, box_path = _box_obj(tmp_path)
    tall, tall_path = _box_obj(tmp_path, "tall.obj", extents=(0.02, 0.02, 0.3))
    objects = [
        ObjectCalibration("mug", box_path, _test_pose(0.7, [0.3, -0.2, 0.9], [0.1, -0.2, 0.05])),
        ObjectCalibration("bottle", tall_path, _test_pose(-2.1, [1, 0, 0], [0.4, 0.3, 0.15])),
    ]
    stamp = conv.ns_to_stamp(42_000_000_123)
    arr = conv.object_markers(objects, "world", stamp)
    clear, *markers = arr.markers
    assert clear.action == Marker.DELETEALL  # the array is the whole set
    assert len(markers) == 2
    for m, obj, mesh in zip(markers, objects, (box, tall)):
        assert (m.type, m.action) == (Marker.TRIANGLE_LIST, Marker.ADD)
        assert m.header.frame_id == "world" and conv.stamp_to_ns(m.header.stamp) == 42_000_000_123
        assert (m.pose.orientation.w, m.scale.x, m.scale.y, m.scale.z) == (1.0, 1.0, 1.0, 1.0)
        assert m.color.a == 1.0
        assert len(m.points) == 3 * len(mesh.faces) == 36
        got = np.array([[p.x, p.y, p.z] for p in m.points])
        v, f = conv.load_mesh(obj.mesh)
        np.testing.assert_allclose(got, _reference_triangles(v, f, obj.pose), atol=POSE_ATOL_M)
        # and the stored box itself, moved by the pose, up to the OBJ file's rounding
        np.testing.assert_allclose(got, _reference_triangles(mesh.vertices, mesh.faces,
                                                             obj.pose), atol=OBJ_ROUNDING_M)

    # namespace, id and colour follow the name: stable across calls and object order
    again = conv.object_markers(objects[::-1], "world", stamp).markers[1:]
    ids = {(m.ns, m.id) for m in markers}
    assert ids == {(m.ns, m.id) for m in again} and len(ids) == 2
    assert (markers[0].ns, markers[0].id) == conv.object_marker_id("mug")
    assert markers[0].color == again[1].color
    assert all(0 <= m.id < 2**31 for m in markers)

    # preloaded meshes (the node's cache) give the same markers; an empty set only clears
    meshes = {o.name: conv.load_mesh(o.mesh) for o in objects}
    pre = conv.object_markers(objects, "world", stamp, meshes).markers[1:]
    assert [m.points for m in pre] == [m.points for m in markers]
    (only,) = conv.object_markers([], "world", stamp).markers
    assert only.action == Marker.DELETEALL


@needs_ros
def test_mesh_topic_names_are_valid():
    from rclpy.validate_full_topic_name import validate_full_topic_name
    from realsim_ros.calibration_node import CalibrationNode

    assert CalibrationNode.mesh_topic("object_0") == "~/objects/object_0/mesh"
    for name in ("object_0", "red mug", "0", "a-b/c", "__x__", ""):
        topic = CalibrationNode.mesh_topic(name)
        validate_full_topic_name(topic.replace("~", "/realsim", 1))  # raises if invalid


@needs_ros
@pytest.mark.parametrize("keep", [0.9, 0.3, 0.1])
def test_stamp_gaps_count_the_missing_messages(keep):
    """The stamp-gap estimate counts every message lost in a 30 Hz stream.

    A share `keep` of the stream arrives; every missing message between the first and the
    last received one is counted, also at 90 % loss (a median interval is a gap there)
    and in the first intervals, before the period is known.
    """
    from realsim_ros.calibration_node import _TopicCounter

    rng = np.random.default_rng(3)
    period = 1_000_000_000 // 30
    got = np.flatnonzero(rng.random(600) < keep)
    c = _TopicCounter("x")
    for i in got:
        # a little stamp jitter (+-1.5 ms) on every message
        c.stamp(int(1.7e18 + i * period + rng.uniform(-1.5e6, 1.5e6)))
    n = got[-1] - got[0] + 1 - len(got)
    assert c.gaps == n
    # a 5 s blackout (overload) is counted whole (+-1: the period is an estimate)
    c.stamp(int(1.7e18 + (got[-1] + 151) * period))
    blackout = c.gaps - n
    assert abs(blackout - 150) <= 1, blackout
    # a pause is not counted as a million drops: at most 10 s of messages (300)
    c.stamp(int(1.7e18 + (got[-1] + 151 + 10**7) * period))
    assert abs(c.gaps - n - blackout - 300) <= 2, c.gaps


# ------------------------------------------------------------------------ online loop


def _calibrator(nominal, factory=None, **opts):
    return OnlineCalibrator(
        ["cam_a", "cam_b"], {"follower_left": ARM_JOINTS}, nominal, None, factory,
        SyncOptions(**opts),
    )


def _feed(cal, i, cams=("cam_a", "cam_b")):
    t = 1_000 * MS + i * 100 * MS
    q = np.full(len(ARM_JOINTS), 0.1 * i)
    cal.add_joint_state("follower_left", JointStateSample(t, ARM_JOINTS, q))
    return [cal.add_image(c, ImageSample(t, np.zeros((4, 6, 3), np.uint8))) for c in cams]


def test_online_loop_assembles_keyframes_and_stays_nominal(nominal):
    cal = _calibrator(nominal, keyframe_capacity=3)
    assert isinstance(cal.estimator, NominalEstimator)
    for i in range(5):
        assert _feed(cal, i) == ["accepted", "accepted"]
        cal.run_once()
    snap = cal.snapshot()
    assert snap["sync/assembled"] == 5
    assert snap["keyframes/kept"] == 3  # capacity bound
    assert cal.estimator.frames_offered == 5
    assert cal.current is nominal and cal.version == 0
    assert _feed(cal, 4) == ["rejected_duplicate_image"] * 2


def test_online_loop_drops_oldest_when_worker_is_behind(nominal):
    cal = _calibrator(nominal, queue_capacity=2)
    for i in range(6):
        _feed(cal, i)
    cal.run_once()
    snap = cal.snapshot()
    assert snap["sync/assembled"] == 6
    assert snap["loop/dropped_worker_busy"] == 4
    assert snap["loop/frames_offered"] == 2


class _ScriptedEstimator:
    """Improves once with a shifted camera, then once with a NaN offset."""

    state = "optimising"
    is_calibration = True

    def __init__(self, start):
        self.start, self.calls, self.resets = start, 0, []

    def reset(self, start):
        self.resets.append(start)

    def add_frame(self, frame, intrinsics, keyframe):
        pass

    def step(self):
        self.calls += 1
        return self.calls <= 2

    def estimate(self):
        offs = dict(self.start.joint_offsets)
        offs["follower_left/waist"] = 0.01 if self.calls == 1 else math.nan
        return replace(self.start, joint_offsets=offs)

    def metrics(self):
        return {"loss": 1.0}


def test_online_loop_accepts_improvements_and_rolls_back_nan(nominal):
    cal = _calibrator(nominal, factory=_ScriptedEstimator)
    cal.run_once()
    assert cal.version == 1 and cal.current.joint_offsets["follower_left/waist"] == 0.01
    good = cal.current
    cal.run_once()  # NaN estimate: rejected, estimator rolled back to the last good one
    assert cal.version == 1 and cal.current is good
    assert cal.estimator.resets == [good]
    assert cal.snapshot()["loop/estimates_rejected"] == 1
    assert "rolled back" in cal.worker_error
    cal.set_frozen(True)
    calls = cal.estimator.calls
    cal.run_once()
    assert cal.estimator.calls == calls  # frozen: no steps
    cal.reset()
    assert cal.current is nominal and cal.version == 2


class _SlowEstimator(NominalEstimator):
    """A step that runs until told to stop (like an XLA step under load)."""

    def __init__(self, start):
        super().__init__(start)
        self.stop_event = threading.Event()
        self.in_step = threading.Event()

    def request_stop(self):
        self.stop_event.set()

    def step(self):
        self.in_step.set()
        self.stop_event.wait(30.0)
        return False


def test_stop_cuts_a_long_step_short_and_waits_for_the_worker(nominal):
    cal = _calibrator(nominal, factory=_SlowEstimator)
    cal.start()
    try:
        assert cal.estimator.in_step.wait(10.0)     # the worker is inside step()
    finally:
        t0 = time.monotonic()
        cal.stop()
    assert cal.estimator.stop_event.is_set()          # told to stop ...
    assert not cal._thread.is_alive()                 # ... and joined, not abandoned
    assert time.monotonic() - t0 < 20.0               # not the step's own 30 s


def test_check_calibration(nominal):
    assert check_calibration(nominal, nominal) is None
    cams = dict(nominal.cameras)
    cams["cam_high"] = replace(cams["cam_high"], pose=np.diag([2.0, 1.0, 1.0, 1.0]))
    assert "orthonormal" in check_calibration(replace(nominal, cameras=cams), nominal)
    fewer = replace(nominal, joint_offsets={"follower_left/waist": 0.0})
    assert "missing" in check_calibration(fewer, nominal)


def test_store_resumes_refuses_corrupt_and_moves_it_aside(tmp_path, nominal):
    store = CalibrationStore(tmp_path)
    assert store.load(nominal) == (None, "")
    offs = {**nominal.joint_offsets, "follower_left/waist": 0.003}
    store.save(replace(nominal, joint_offsets=offs))
    cal, line = store.load(nominal)
    assert cal.joint_offsets["follower_left/waist"] == 0.003 and "resumed" in line

    store.path.write_text("cameras: [this is not, a mapping\n")
    (tmp_path / ".calibration.yaml.abc.tmp").write_text("half a fi")  # killed mid-save
    store = CalibrationStore(tmp_path)
    cal, line = store.load(nominal)
    assert cal is None and store.corrupt
    assert line.startswith(f"refusing saved calibration {store.path}: ")
    assert "\n" not in line
    assert not (tmp_path / ".calibration.yaml.abc.tmp").exists()
    store.save(nominal)
    aside = list(tmp_path.glob("calibration.yaml.corrupt-*"))
    assert len(aside) == 1 and "not, a mapping" in aside[0].read_text()
    assert read_calibration(store.path).joint_offsets == nominal.joint_offsets


@needs_ros
def test_compressed_image_conversion():
    import cv2
    from realsim_ros import conversions as conv
    from sensor_msgs.msg import CompressedImage

    rgb = np.zeros((6, 8, 3), np.uint8)
    rgb[..., 0] = 200  # red
    ok, png = cv2.imencode(".png", rgb[..., ::-1])
    assert ok
    msg = CompressedImage(format="rgb8; png compressed bgr8", data=png.tobytes())
    msg.header.stamp.sec, msg.header.stamp.nanosec = 3, 5
    s = conv.compressed_to_sample(msg)
    assert s.stamp_ns == 3_000_000_005
    np.testing.assert_array_equal(s.rgb, rgb)
