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


def _write_saved_calibration(out_dir, offsets: dict[str, float], shift_m: float):
    """A valid calibration.yaml: the rig's nominal with cam_high shifted in x and offsets."""
    from dataclasses import replace

    from realsim_core.calibration_io import write_calibration
    from realsim_core.online import nominal_calibration
    from realsim_core.rig import load_rig

    nominal = nominal_calibration(load_rig("builtin:aloha2", check_model=False))
    cams = dict(nominal.cameras)
    pose = cams["cam_high"].pose.copy()
    pose[0, 3] += shift_m
    cams["cam_high"] = replace(cams["cam_high"], pose=pose)
    cal = replace(nominal, cameras=cams,
                  joint_offsets={**nominal.joint_offsets, **offsets}, metrics={})
    write_calibration(out_dir / "calibration.yaml", cal)
    return nominal, cal


def test_data_path_outputs_and_services(rcl_node, tmp_path):
    """Resume -> frames assembled -> TF, offsets, corrected joints -> freeze/reset/save."""
    import numpy as np
    from node_probe import ARMS, CAMERAS, Probe, arm_positions
    from realsim_ros.conversions import stamp_to_ns, transform_to_pose
    from std_srvs.srv import SetBool, Trigger

    from realsim_core.calibration_io import read_calibration

    out = tmp_path / "out"
    offsets = {"follower_left/waist": 0.01, "follower_right/gripper": -0.002}
    nominal, saved = _write_saved_calibration(out, offsets, shift_m=0.02)
    proc = start_node("-p", f"output_dir:={out}")
    probe = Probe("data_path_probe")
    n_frames = 8
    try:
        probe.wait_ready(proc)
        assert probe.diag()["start"] == "resumed"
        # /tf_static (transient local): every camera, from the resumed file
        assert probe.spin_until(lambda: bool(probe.tf))
        tfs = {t.child_frame_id: t for t in probe.tf[-1].transforms}
        assert set(tfs) == {f"{c}_color_optical_frame" for c in CAMERAS}
        for cam in CAMERAS:
            t = tfs[f"{cam}_color_optical_frame"]
            assert t.header.frame_id == saved.cameras[cam].parent_frame
            np.testing.assert_allclose(transform_to_pose(t), saved.cameras[cam].pose, atol=1e-9)

        probe.send_infos()
        stamps = [probe.send_frame(i) for i in range(n_frames)]
        assert probe.wait_diag("frames_assembled", lambda n: n == n_frames), probe.diag()
        assert probe.wait_diag("keyframes", lambda n: n == n_frames), probe.diag()
        for arm in ARMS:  # every input republished, same stamp, offsets added
            assert probe.spin_until(lambda a=arm: len(probe.corrected[a]) == n_frames)
            got = probe.corrected[arm]
            assert [stamp_to_ns(m.header.stamp) for m in got] == stamps
            for i, m in enumerate(got):
                want = np.array(arm_positions(i, arm))
                for j, name in enumerate(m.name):
                    want[j] += offsets.get(f"{arm}/{name}", 0.0)
                np.testing.assert_allclose(m.position, want, atol=1e-12)
        assert probe.spin_until(lambda: bool(probe.offsets))
        off = dict(zip(probe.offsets[-1].name, probe.offsets[-1].position))
        assert off == saved.joint_offsets
        d = probe.diag()
        assert d["received/cam_low/image"] == str(n_frames)
        assert int(d["last_stamp_ns/cam_high/image"]) == stamps[-1]

        # freeze: reported, publishing continues
        assert probe.call(SetBool, "/realsim/freeze", SetBool.Request(data=True)).success
        assert probe.spin_until(lambda: probe.diag().get("frozen") == "true")
        n_off = len(probe.offsets)
        assert probe.spin_until(lambda: len(probe.offsets) > n_off + 2)
        assert probe.call(SetBool, "/realsim/freeze", SetBool.Request(data=False)).success

        # reset: back to nominal outputs
        assert probe.call(Trigger, "/realsim/reset", Trigger.Request()).success
        assert probe.spin_until(lambda: all(v == 0.0 for v in probe.offsets[-1].position))
        assert probe.spin_until(lambda: np.allclose(transform_to_pose(
            {t.child_frame_id: t for t in probe.tf[-1].transforms}[
                "cam_high_color_optical_frame"]), nominal.cameras["cam_high"].pose))

        # save: atomically written, nominal now, and said so
        res = probe.call(Trigger, "/realsim/save", Trigger.Request())
        assert res.success and "nominal" in res.message, res.message
        back = read_calibration(out / "calibration.yaml")
        assert all(v == 0.0 for v in back.joint_offsets.values())
        np.testing.assert_allclose(back.cameras["cam_high"].pose, nominal.cameras["cam_high"].pose)
        # a change after the last save is saved at shutdown
        assert probe.call(Trigger, "/realsim/reset", Trigger.Request()).success
        (out / "calibration.yaml").unlink()
        assert proc.poll() is None
    finally:
        probe.destroy()
        rc, _, err = stop_process(proc)
    assert rc == 0, err
    assert "Traceback" not in err
    assert "(shutdown)" in err, err
    assert read_calibration(out / "calibration.yaml").joint_offsets == nominal.joint_offsets


def test_launch_files_declare_described_arguments():
    """launch/ cannot run in CI (no launch package): check its shape statically."""
    import ast
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parents[1] / "launch").glob("*.launch.py"))
    assert {f.name for f in files} >= {"aloha2_calibration.launch.py", "replay.launch.py"}
    for f in files:
        tree = ast.parse(f.read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "generate_launch_description"
                   for n in tree.body), f.name
        declared = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                    and getattr(n.func, "id", "") == "DeclareLaunchArgument"]
        assert declared, f.name
        for call in declared:
            name = call.args[0].value
            desc = {k.arg: k.value for k in call.keywords}.get("description")
            assert isinstance(desc, ast.Constant) and desc.value.strip(), (f.name, name)
    replay = (Path(__file__).resolve().parents[1] / "launch" / "replay.launch.py").read_text()
    assert '"use_sim_time": True' in replay and "realsim_ros.replay" in replay
