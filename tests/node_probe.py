"""A test-side rclpy node that feeds the calibration node process and records its outputs.

Used by test_ros_node.py and test_node_faults.py. Images are small (64x48) so a test
runs in seconds on 2 shared cores; every wait is `spin_until` with a generous timeout,
never a sleep as a pass criterion.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
from ros_util import spin_until

CAMERAS = ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist")
ARMS = ("follower_left", "follower_right")
JOINTS = ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate",
          "gripper", "left_finger", "right_finger")
W, H = 64, 48
T0 = 1_700_000_000_000_000_000  # ns
TIMEOUT_S = 40.0  # discovery + processing on a loaded 2-core machine; never a pass criterion


def stamp(ns: int):
    from builtin_interfaces.msg import Time

    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def image_msg(ns: int, value: int = 0, w: int = W, h: int = H, encoding: str = "rgb8"):
    """A uniform rgb8 (or other 1-byte-per-channel) image, [h, w] pixels."""
    from sensor_msgs.msg import Image

    ch = {"rgb8": 3, "bgr8": 3, "mono8": 1, "32FC1": 4}[encoding]
    msg = Image(height=h, width=w, encoding=encoding, step=w * ch)
    msg.data = np.full(h * w * ch, value % 256, np.uint8).tobytes()
    msg.header.stamp = stamp(ns)
    return msg


def info_msg(ns: int, w: int = W, h: int = H):
    """A pinhole camera_info, fx = fy = w, centred principal point."""
    from sensor_msgs.msg import CameraInfo

    f, cx, cy = float(w), (w - 1) / 2, (h - 1) / 2
    msg = CameraInfo(width=w, height=h)
    msg.k = [f, 0.0, cx, 0.0, f, cy, 0.0, 0.0, 1.0]
    msg.p = [f, 0.0, cx, 0.0, 0.0, f, cy, 0.0, 0.0, 0.0, 1.0, 0.0]
    msg.header.stamp = stamp(ns)
    return msg


def joint_msg(ns: int, positions, names=JOINTS):
    from sensor_msgs.msg import JointState

    msg = JointState(name=list(names), position=[float(p) for p in positions])
    msg.header.stamp = stamp(ns)
    return msg


def arm_positions(i: int, arm: str) -> list[float]:
    """Distinct joint positions per frame index (rad; m for the fingers)."""
    base = 0.1 * i + (0.0 if arm == ARMS[0] else 0.05)
    return [base, -0.5 + base, 0.3, 0.0, 0.1, 0.0, 0.02, 0.02, -0.02]


class Probe:
    """Publishers for every node input, subscriptions to every node output."""

    def __init__(self, name: str = "realsim_probe") -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import CameraInfo, Image, JointState
        from tf2_msgs.msg import TFMessage

        self.node = rclpy.create_node(name)
        n = self.node
        self.diags: list = []
        self.tf: list = []
        self.offsets: list = []
        self.corrected: dict[str, list] = defaultdict(list)
        n.create_subscription(DiagnosticArray, "/diagnostics", self.diags.append, 50)
        latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                             reliability=ReliabilityPolicy.RELIABLE)
        n.create_subscription(TFMessage, "/tf_static", self.tf.append, latched)
        n.create_subscription(JointState, "/realsim/joint_offsets", self.offsets.append, 50)
        for arm in ARMS:
            n.create_subscription(JointState, f"/realsim/{arm}/joint_states",
                                  self.corrected[arm].append, 500)
        self.images = {c: n.create_publisher(Image, f"/{c}/camera/color/image_rect_raw", 50)
                       for c in CAMERAS}
        self.infos = {c: n.create_publisher(CameraInfo, f"/{c}/camera/color/camera_info", 10)
                      for c in CAMERAS}
        self.joints = {a: n.create_publisher(JointState, f"/{a}/joint_states", 100)
                       for a in ARMS}

    # ------------------------------------------------------------------ waiting
    def spin_until(self, predicate, timeout: float = TIMEOUT_S) -> bool:
        return spin_until(self.node, predicate, timeout)

    def pause(self, seconds: float) -> None:
        """Spin for `seconds` (pacing only; never a pass criterion)."""
        spin_until(self.node, lambda: False, seconds)

    def wait_ready(self, proc=None) -> None:
        """Until the node reports diagnostics and every input publisher is matched."""
        pubs = [*self.images.values(), *self.infos.values(), *self.joints.values()]

        def ready():
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"node exited early: {proc.stderr.read()}")
            return bool(self.diags) and all(p.get_subscription_count() > 0 for p in pubs)

        assert self.spin_until(ready), "node not matched / no diagnostics"
        self.pause(0.3)  # the node's reader may match a moment after our writer sees it

    def diag(self) -> dict[str, str]:
        """Merged key/values of the newest /diagnostics message ({} before the first)."""
        if not self.diags:
            return {}
        return {kv.key: kv.value for st in self.diags[-1].status for kv in st.values}

    def diag_int(self, key: str) -> int:
        return int(self.diag().get(key, "0"))

    def wait_diag(self, key: str, predicate, timeout: float = TIMEOUT_S) -> bool:
        """Until diagnostics value `key` (int) satisfies `predicate`."""
        return self.spin_until(lambda: predicate(self.diag_int(key)), timeout)

    def messages(self) -> str:
        return " | ".join(st.message for st in self.diags[-1].status) if self.diags else ""

    # ------------------------------------------------------------------ feeding
    def send_frame(self, i: int, cameras=CAMERAS, joint_ns_offsets=(0,), t0: int = T0,
                   period_ns: int = 100_000_000, sizes=None) -> int:
        """Joint states of both arms then one image per camera at stamp t0 + i * period.

        sizes: camera -> (w, h) for cameras whose images are not W x H.
        """
        ns = t0 + i * period_ns
        sizes = sizes or {}
        for off in joint_ns_offsets:
            for arm in ARMS:
                self.joints[arm].publish(joint_msg(ns + off, arm_positions(i, arm)))
        for k, cam in enumerate(cameras):
            w, h = sizes.get(cam, (W, H))
            self.images[cam].publish(image_msg(ns, 20 * k + i, w, h))
        self.pause(0.03)
        return ns

    def send_infos(self, ns: int = T0, w: int = W, h: int = H, cameras=CAMERAS) -> None:
        for cam in cameras:
            self.infos[cam].publish(info_msg(ns, w, h))
        self.pause(0.05)

    def call(self, srv_type, name: str, request, timeout: float = TIMEOUT_S):
        client = self.node.create_client(srv_type, name)
        try:
            assert self.spin_until(client.service_is_ready, timeout), f"{name} not ready"
            fut = client.call_async(request)
            assert self.spin_until(fut.done, timeout), f"{name} did not answer"
            return fut.result()
        finally:
            self.node.destroy_client(client)

    def destroy(self) -> None:
        self.node.destroy_node()


def count_lines(text: str, needle: str) -> int:
    """Lines of `text` containing `needle`."""
    return sum(needle in line for line in text.splitlines())


def now_ns() -> int:
    return time.time_ns()
