"""Message conversions (realsim_ros) and the ROS-free online loop (realsim_core.online)."""

from __future__ import annotations

import math
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
