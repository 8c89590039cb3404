"""The realsim calibration node (thin: parameters, subscriptions, diagnostics).

It subscribes to the four ALOHA 2 camera streams, their camera_info and both follower
joint_states topics, counts what it receives and publishes `/diagnostics` at
`diagnostics_rate_hz`. The calibration engine (realsim_core) plugs in behind it.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import (
    FloatingPointRange,
    ParameterDescriptor,
    ParameterType,
    SetParametersResult,
)
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, CompressedImage, Image, JointState

from realsim_ros import defaults

NODE_NAME = "realsim"


@dataclass
class _TopicCounter:
    """Messages received on one input topic, with the last receive time (monotonic s)."""

    topic: str
    count: int = 0
    last_rx: float = field(default=-math.inf)

    def tick(self) -> None:
        self.count += 1
        self.last_rx = time.monotonic()


class CalibrationNode(Node):
    """Declares parameters, wires the inputs and reports what it receives."""

    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self._lock = threading.Lock()
        self._declare_parameters()
        self.add_on_set_parameters_callback(self._on_set_parameters)

        self._counters: dict[str, _TopicCounter] = {}
        self._subs = []
        transport = self.get_parameter("image_transport").value
        for cam in self.get_parameter("cameras").value:
            image_topic = self.get_parameter(f"{cam}.image_topic").value
            info_topic = self.get_parameter(f"{cam}.info_topic").value
            if transport == "compressed":
                image_topic = image_topic.rstrip("/") + "/compressed"
                self._subscribe(f"{cam}/image", CompressedImage, image_topic)
            else:
                self._subscribe(f"{cam}/image", Image, image_topic)
            self._subscribe(f"{cam}/camera_info", CameraInfo, info_topic)
        for arm in self.get_parameter("arms").value:
            topic = self.get_parameter(f"{arm}.joint_states_topic").value
            self._subscribe(f"{arm}/joint_states", JointState, topic)

        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        rate = self.get_parameter("diagnostics_rate_hz").value
        self._diag_timer = self.create_timer(1.0 / rate, self._publish_diagnostics)
        self._started = time.monotonic()
        self.get_logger().info(
            f"listening to {len(self._counters)} topics; diagnostics at {rate:g} Hz "
            f"(rig: {self.get_parameter('rig_file').value})"
        )

    # ------------------------------------------------------------------ parameters
    def _declare_parameters(self) -> None:
        def desc(text: str, read_only: bool = False, **kw) -> ParameterDescriptor:
            return ParameterDescriptor(description=text, read_only=read_only, **kw)

        self.declare_parameter(
            "rig_file", defaults.RIG_FILE,
            desc("Rig file (YAML, contracts.md) or 'builtin:aloha2'.", read_only=True),
        )
        self.declare_parameter(
            "output_dir", defaults.OUTPUT_DIR,
            desc("Where calibration.yaml and meshes are written (~ expanded).", read_only=True),
        )
        self.declare_parameter(
            "cameras", list(defaults.CAMERAS),
            desc("Camera names; each has <name>.image_topic and <name>.info_topic.",
                 read_only=True),
        )
        self.declare_parameter(
            "arms", list(defaults.ARMS),
            desc("Arm names; each has <name>.joint_states_topic.", read_only=True),
        )
        self.declare_parameter(
            "image_transport", "raw",
            desc("'raw' (sensor_msgs/Image) or 'compressed' (<image_topic>/compressed).",
                 read_only=True),
        )
        for cam in self.get_parameter("cameras").value:
            self.declare_parameter(
                f"{cam}.image_topic", defaults.image_topic(cam),
                desc(f"Image topic of {cam}.", read_only=True),
            )
            self.declare_parameter(
                f"{cam}.info_topic", defaults.info_topic(cam),
                desc(f"camera_info topic of {cam}.", read_only=True),
            )
        for arm in self.get_parameter("arms").value:
            self.declare_parameter(
                f"{arm}.joint_states_topic", f"/{arm}/joint_states",
                desc(f"sensor_msgs/JointState topic of {arm}.", read_only=True),
            )
        rate_range = FloatingPointRange(from_value=0.1, to_value=50.0, step=0.0)
        self.declare_parameter(
            "diagnostics_rate_hz", 1.0,
            desc("Rate of /diagnostics (Hz).", read_only=True,
                 floating_point_range=[rate_range], type=ParameterType.PARAMETER_DOUBLE),
        )
        self.declare_parameter(
            "publish_rate_hz", 5.0,
            desc("Rate at which calibration outputs are republished (Hz).",
                 floating_point_range=[rate_range], type=ParameterType.PARAMETER_DOUBLE),
        )
        self.declare_parameter(
            "silent_after_s", 3.0,
            desc("An input with no message for this long is reported as silent (s).",
                 type=ParameterType.PARAMETER_DOUBLE),
        )
        transport = self.get_parameter("image_transport").value
        if transport not in ("raw", "compressed"):
            raise ValueError(f"image_transport must be 'raw' or 'compressed', got {transport!r}")

    def _on_set_parameters(self, params) -> SetParametersResult:
        for p in params:
            if p.name == "publish_rate_hz":
                if not isinstance(p.value, float) or not (0.1 <= p.value <= 50.0):
                    return SetParametersResult(
                        successful=False, reason=f"{p.name} must be a float in [0.1, 50] Hz"
                    )
            if p.name == "silent_after_s" and (not isinstance(p.value, float) or p.value <= 0):
                return SetParametersResult(successful=False, reason="silent_after_s must be > 0")
        return SetParametersResult(successful=True)

    # ------------------------------------------------------------------ inputs
    def _subscribe(self, key: str, msg_type, topic: str) -> None:
        counter = _TopicCounter(topic)
        self._counters[key] = counter

        def callback(_msg, counter=counter) -> None:
            with self._lock:
                counter.tick()

        self._subs.append(
            self.create_subscription(msg_type, topic, callback, qos_profile_sensor_data)
        )

    def counts(self) -> dict[str, int]:
        """Messages received so far, by input key (e.g. `cam_high/image`)."""
        with self._lock:
            return {k: c.count for k, c in self._counters.items()}

    # ------------------------------------------------------------------ outputs
    def _publish_diagnostics(self) -> None:
        now = time.monotonic()
        silent_after = self.get_parameter("silent_after_s").value
        with self._lock:
            items = [(k, c.topic, c.count, now - c.last_rx) for k, c in self._counters.items()]
        silent = [k for k, _, n, age in items if n == 0 or age > silent_after]
        status = DiagnosticStatus()
        status.name = f"{self.get_name()}: inputs"
        status.hardware_id = "aloha2"
        if not silent:
            status.level, status.message = DiagnosticStatus.OK, "receiving all inputs"
        elif len(silent) == len(items):
            status.level, status.message = DiagnosticStatus.WARN, "waiting for data"
        else:
            status.level = DiagnosticStatus.WARN
            status.message = f"silent: {', '.join(sorted(silent))}"
        status.values = [KeyValue(key="state", value="collecting")]
        status.values += [KeyValue(key=f"received/{k}", value=str(n)) for k, _, n, _ in items]
        status.values.append(KeyValue(key="uptime_s", value=f"{now - self._started:.1f}"))
        msg = DiagnosticArray()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.status = [status]
        self._diag_pub.publish(msg)


def main(args=None) -> None:
    """Entry point of `calibration_node` / `ros2 run realsim_ros calibration_node`."""
    rclpy.init(args=args)
    node = None
    try:
        node = CalibrationNode()
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.destroy_node()
        if rclpy.ok():
            rclpy.shutdown()


if __name__ == "__main__":
    main()
