"""Node process + `realsim replay` process + this rclpy checker: a bag crosses DDS intact."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from ros_util import needs_ros, spin_until, start_node, stop_process

from realsim_core.bag import BagWriter
from realsim_core.types import CameraIntrinsics

pytestmark = [needs_ros, pytest.mark.ros]

CAMERAS = ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist")
N_FRAMES = 6          # 5 Hz images -> 1.2 s of recording
N_JOINT_STATES = 60   # 50 Hz per arm
TIMEOUT_S = 60.0


def _write_bag(path) -> None:
    intr = CameraIntrinsics(32, 24, 30.0, 30.0, 15.5, 11.5)
    t0 = 1_700_000_000_000_000_000
    with BagWriter(path) as w:
        for i in range(N_FRAMES):
            stamp = t0 + i * 200_000_000
            for k, cam in enumerate(CAMERAS):
                rgb = np.full((24, 32, 3), 40 * k + i, np.uint8)
                w.write_image(f"/{cam}/camera/color/image_rect_raw", stamp, rgb,
                              f"{cam}_color_optical_frame")
                w.write_camera_info(f"/{cam}/camera/color/camera_info", stamp, intr,
                                    f"{cam}_color_optical_frame")
        for j in range(N_JOINT_STATES):
            stamp = t0 + j * 20_000_000
            for arm in ("follower_left", "follower_right"):
                w.write_joint_state(f"/{arm}/joint_states", stamp, ["waist", "shoulder"],
                                    [0.01 * j, -0.5])


def test_replayed_bag_reaches_the_node(tmp_path):
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from rosgraph_msgs.msg import Clock

    bag = tmp_path / "bag"
    _write_bag(bag)
    node = start_node()
    rclpy.init()
    probe = rclpy.create_node("replay_probe")
    diags, clocks = [], []
    probe.create_subscription(DiagnosticArray, "/diagnostics", diags.append, 10)
    probe.create_subscription(Clock, "/clock", clocks.append, 100)
    try:
        assert spin_until(probe, lambda: bool(diags), TIMEOUT_S), "node never reported"
        replay = subprocess.Popen(
            [sys.executable, "-m", "realsim_core", "replay", str(bag),
             "--wait-for-subscribers", "20"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        spin_until(probe, lambda: replay.poll() is not None, TIMEOUT_S)
        out, err = replay.communicate(timeout=5)
        assert replay.returncode == 0, err

        def values():
            return {kv.key: kv.value for kv in diags[-1].status[0].values}

        expected = {**{f"received/{c}/{k}": N_FRAMES for c in CAMERAS
                       for k in ("image", "camera_info")},
                    **{f"received/{a}/joint_states": N_JOINT_STATES
                       for a in ("follower_left", "follower_right")}}

        def all_counted():
            # the node may still be working through its queue when the replay exits:
            # wait for a /diagnostics message that counts every stream
            v = values()
            return all(v.get(k) == str(n) for k, n in expected.items())

        spin_until(probe, all_counted, 15.0)
        v = values()
        # replay waited until every topic was matched, so nothing may be missing
        for cam in CAMERAS:
            assert int(v[f"received/{cam}/image"]) == N_FRAMES, v
            assert int(v[f"received/{cam}/camera_info"]) == N_FRAMES, v
        for arm in ("follower_left", "follower_right"):
            assert int(v[f"received/{arm}/joint_states"]) == N_JOINT_STATES, v
        # /clock follows bag time, monotonically, within the recording
        stamps = [c.clock.sec * 1_000_000_000 + c.clock.nanosec for c in clocks]
        assert len(stamps) > 10
        assert stamps == sorted(stamps)
        assert 1_700_000_000_000_000_000 <= stamps[0] and stamps[-1] <= 1_700_000_001_200_000_000
    finally:
        probe.destroy_node()
        rclpy.shutdown()
        rc, _, err = stop_process(node)
    assert rc == 0, err


def test_replay_of_missing_bag_is_one_line_error(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "realsim_core", "replay", str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=60,
    )
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"realsim replay: error: bag folder not found: {tmp_path / 'nope'}"
    ]
