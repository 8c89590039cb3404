"""The calibration node as a real process, talking Fast DDS to this test process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from ros_util import needs_ros, spin_until, start_node, stop_process

pytestmark = [needs_ros, pytest.mark.ros]

# Discovery + first diagnostics on a loaded 2-core machine: generous, never a pass criterion.
DISCOVERY_TIMEOUT_S = 40.0


@pytest.fixture(scope="module")
def rcl_node():
    import rclpy

    rclpy.init()
    node = rclpy.create_node("realsim_test_probe")
    yield node
    node.destroy_node()
    rclpy.shutdown()


def _diag_values(msg) -> dict[str, str]:
    """Key/values of every status of one DiagnosticArray, merged."""
    return {kv.key: kv.value for status in msg.status for kv in status.values}


def test_node_counts_inputs_and_reports_diagnostics_over_dds(rcl_node):
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image, JointState

    proc = start_node()
    try:
        diags: list = []
        sub = rcl_node.create_subscription(DiagnosticArray, "/diagnostics", diags.append, 10)
        assert spin_until(rcl_node, lambda: bool(diags), DISCOVERY_TIMEOUT_S), (
            "no /diagnostics from the node; stderr:\n" + (proc.poll() is not None and
                                                            proc.stderr.read() or "")
        )
        first = _diag_values(diags[-1])
        assert first["received/cam_high/image"] == "0"
        assert first["state"] == "nominal (engine not available)"

        img_pub = rcl_node.create_publisher(
            Image, "/cam_high/camera/color/image_rect_raw", qos_profile_sensor_data
        )
        js_pub = rcl_node.create_publisher(JointState, "/follower_left/joint_states", 10)
        # wait until the node's subscriptions are matched, then send exactly N messages
        assert spin_until(
            rcl_node,
            lambda: img_pub.get_subscription_count() > 0 and js_pub.get_subscription_count() > 0,
            DISCOVERY_TIMEOUT_S,
        )
        n_images, n_joints = 7, 11
        img = Image(height=2, width=2, encoding="rgb8", step=6, data=bytes(12))
        for _ in range(n_images):
            img_pub.publish(img)
            spin_until(rcl_node, lambda: False, 0.02)
        js = JointState(name=["waist"], position=[0.1])
        for _ in range(n_joints):
            js_pub.publish(js)
            spin_until(rcl_node, lambda: False, 0.02)

        def counted() -> bool:
            v = _diag_values(diags[-1])
            return (v.get("received/cam_high/image") == str(n_images)
                    and v.get("received/follower_left/joint_states") == str(n_joints))

        assert spin_until(rcl_node, counted, DISCOVERY_TIMEOUT_S), _diag_values(diags[-1])
        values = _diag_values(diags[-1])
        assert values["received/cam_low/image"] == "0"
        assert "cam_low/image" in diags[-1].status[0].message  # named as silent
        rcl_node.destroy_subscription(sub)
    finally:
        rc, out, err = stop_process(proc)
    # Ctrl-C: clean exit, no traceback
    assert rc == 0, err
    assert "Traceback" not in err + out


def test_node_rejects_bad_parameter_and_keeps_running(rcl_node):
    from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
    from rcl_interfaces.srv import SetParameters

    proc = start_node()
    try:
        client = rcl_node.create_client(SetParameters, "/realsim/set_parameters")
        assert spin_until(rcl_node, client.service_is_ready, DISCOVERY_TIMEOUT_S)

        def set_param(value: float):
            req = SetParameters.Request(parameters=[Parameter(
                name="publish_rate_hz",
                value=ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=value),
            )])
            fut = client.call_async(req)
            assert spin_until(rcl_node, fut.done, DISCOVERY_TIMEOUT_S)
            return fut.result().results[0]

        bad = set_param(-3.0)
        assert not bad.successful
        assert "publish_rate_hz" in bad.reason
        good = set_param(2.0)
        assert good.successful, good.reason
        assert proc.poll() is None
        rcl_node.destroy_client(client)
    finally:
        rc, _, err = stop_process(proc)
    assert rc == 0, err


def test_tf_message_round_trips_between_processes(tmp_path):
    """tf2_msgs/TFMessage (the real one or our shim) crosses DDS intact."""
    script = tmp_path / "tf_pub.py"
    script.write_text(textwrap.dedent("""
        import rclpy
        from geometry_msgs.msg import TransformStamped
        from rclpy.qos import DurabilityPolicy, QoSProfile
        from tf2_msgs.msg import TFMessage

        rclpy.init()
        node = rclpy.create_node("tf_pub")
        qos = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        pub = node.create_publisher(TFMessage, "/tf_static", qos)
        t = TransformStamped()
        t.header.frame_id = "left/gripper_base"
        t.child_frame_id = "cam_left_wrist_color_optical_frame"
        t.transform.translation.x, t.transform.translation.y = 0.125, -0.5
        t.transform.rotation.z, t.transform.rotation.w = 0.6, 0.8
        pub.publish(TFMessage(transforms=[t]))
        # latched: stay up until the subscriber has had time to join
        for _ in range(400):
            rclpy.spin_once(node, timeout_sec=0.05)
        rclpy.shutdown()
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.PIPE, text=True)
    try:
        import rclpy
        from rclpy.qos import DurabilityPolicy, QoSProfile
        from tf2_msgs.msg import TFMessage

        ctx = rclpy.Context()
        rclpy.init(context=ctx)
        node = rclpy.create_node("tf_sub", context=ctx)
        got: list = []
        qos = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        node.create_subscription(TFMessage, "/tf_static", got.append, qos)
        import time

        deadline = time.monotonic() + DISCOVERY_TIMEOUT_S
        from rclpy.executors import SingleThreadedExecutor

        ex = SingleThreadedExecutor(context=ctx)
        ex.add_node(node)
        while not got and time.monotonic() < deadline:
            ex.spin_once(timeout_sec=0.05)
        node.destroy_node()
        rclpy.shutdown(context=ctx)
    finally:
        proc.kill()
        proc.wait()
    assert got, "no TFMessage received over DDS"
    (t,) = got[0].transforms
    assert t.child_frame_id == "cam_left_wrist_color_optical_frame"
    assert t.header.frame_id == "left/gripper_base"
    assert (t.transform.translation.x, t.transform.translation.y) == (0.125, -0.5)
    assert (t.transform.rotation.z, t.transform.rotation.w) == (0.6, 0.8)
