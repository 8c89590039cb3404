"""launch_testing: replay.launch.py brings up the node + replay; TF and joint offsets appear.

Runs where launch_testing is installed (the rig, the docker image):
    launch_test ros2_ws/src/realsim_ros/test/test_replay_launch.py   (or pytest)
CI has no launch_testing; it covers the same behaviour with process tests
(tests/test_replay.py, tests/test_ros_node.py, tests/test_node_faults.py).
"""

import os
import tempfile
import time
import unittest

import pytest

pytest.importorskip(
    "launch_testing",
    reason="launch_testing is not installed (CI); the same behaviour is covered by the "
    "process tests in tests/test_replay.py, tests/test_ros_node.py and tests/test_node_faults.py",
)
pytest.importorskip("launch_ros", reason="launch_ros is not installed")

import launch_testing  # noqa: E402
import launch_testing.actions  # noqa: E402
import launch_testing.asserts  # noqa: E402
import numpy as np  # noqa: E402
from ament_index_python.packages import get_package_share_directory  # noqa: E402
from launch.actions import IncludeLaunchDescription  # noqa: E402
from launch.launch_description_sources import PythonLaunchDescriptionSource  # noqa: E402

from launch import LaunchDescription  # noqa: E402

CAMERAS = ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist")
ARMS = ("follower_left", "follower_right")
JOINTS = ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate",
          "gripper", "left_finger", "right_finger")
TIMEOUT_S = 60.0


def _write_bag(path: str) -> None:
    """1.6 s of 106x60 frames (rig aspect) at 5 Hz with joint states around each frame."""
    from realsim_core.bag import BagWriter
    from realsim_core.types import CameraIntrinsics

    intr = CameraIntrinsics(106, 60, 54.0, 54.0, 52.5, 29.5)
    t0 = 1_700_000_000_000_000_000
    with BagWriter(path) as w:
        for i in range(8):
            ns = t0 + i * 200_000_000
            for arm in ARMS:
                for off in (-20_000_000, 20_000_000):
                    w.write_joint_state(f"/{arm}/joint_states", ns + off, list(JOINTS),
                                        [0.1 * i] * 6 + [0.02, 0.02, -0.02])
            for k, cam in enumerate(CAMERAS):
                w.write_camera_info(f"/{cam}/camera/color/camera_info", ns, intr)
                w.write_image(f"/{cam}/camera/color/image_rect_raw", ns,
                              np.full((60, 106, 3), 40 * k + i, np.uint8))


@pytest.mark.launch_test
def generate_test_description():
    work = tempfile.mkdtemp(prefix="realsim_launch_")
    bag = os.path.join(work, "bag")
    _write_bag(bag)
    launch_file = os.path.join(get_package_share_directory("realsim_ros"), "launch",
                               "replay.launch.py")
    include = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(launch_file),
        launch_arguments={"bag": bag, "output_dir": os.path.join(work, "out")}.items(),
    )
    return LaunchDescription([include, launch_testing.actions.ReadyToTest()]), {"work": work}


class TestOutputs(unittest.TestCase):
    """Active tests: the node publishes its outputs while the bag plays."""

    @classmethod
    def setUpClass(cls):
        import rclpy

        rclpy.init()
        cls.node = rclpy.create_node("realsim_launch_probe")

    @classmethod
    def tearDownClass(cls):
        import rclpy

        cls.node.destroy_node()
        rclpy.shutdown()

    def _wait(self, predicate) -> bool:
        import rclpy

        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            rclpy.spin_once(self.node, timeout_sec=0.1)
            if predicate():
                return True
        return False

    def test_tf_offsets_and_frames(self):
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import JointState
        from tf2_msgs.msg import TFMessage

        tf, offsets, diags = [], [], []
        latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                             reliability=ReliabilityPolicy.RELIABLE)
        self.node.create_subscription(TFMessage, "/tf_static", tf.append, latched)
        self.node.create_subscription(JointState, "/realsim/joint_offsets", offsets.append, 10)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", diags.append, 10)
        self.assertTrue(self._wait(lambda: bool(tf) and bool(offsets)), "no TF / offsets")
        frames = {t.child_frame_id for t in tf[-1].transforms}
        self.assertEqual(frames, {f"{c}_color_optical_frame" for c in CAMERAS})
        self.assertEqual(len(offsets[-1].name), 14)

        def assembled() -> bool:
            for st in (diags[-1].status if diags else []):
                for kv in st.values:
                    if kv.key == "frames_assembled" and int(kv.value) > 0:
                        return True
            return False

        self.assertTrue(self._wait(assembled), "the node assembled no frame set")


@launch_testing.post_shutdown_test()
class TestShutdown(unittest.TestCase):
    """After shutdown: the replay finished cleanly and the node exited without error."""

    def test_exit_codes(self, proc_info):
        # SIGINT at shutdown: 0 from our handlers; -2 / -15 when launch had to signal
        launch_testing.asserts.assertExitCodes(proc_info, allowable_exit_codes=[0, -2, -15])
