"""Fault suite: the node stays up, loses nothing, publishes nothing worse, logs one line.

Each kind of fault is logged in ONE clear line (repeats are counted in /diagnostics).

Cases sharing one node process (test_input_faults): corrupt saved calibration on start,
NaN/inf joint positions, unknown joint names, joint_states with fewer names, wrong image
encoding, image size != camera_info (same aspect: rescaled; other aspect: dropped),
camera_info missing, one camera silent, duplicate stamps. Separate processes: clock
jumping backwards (`realsim replay --loop`, use_sim_time), `kill -9` during saves, and
overload (four 848x480 streams at 30 Hz).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from node_probe import ARMS, CAMERAS, JOINTS, T0, Probe, count_lines, image_msg, joint_msg
from ros_util import needs_ros, start_node, stop_process

pytestmark = [needs_ros, pytest.mark.ros]


@pytest.fixture()
def ros_context():
    import rclpy

    rclpy.init()
    yield
    rclpy.shutdown()


def _finish(proc):
    rc, out, err = stop_process(proc)
    assert rc == 0, err
    assert "Traceback" not in out + err, err
    return out + err


def test_input_faults(ros_context, tmp_path):
    from realsim_ros.conversions import transform_to_pose
    from std_srvs.srv import Trigger

    from realsim_core.calibration_io import read_calibration
    from realsim_core.online import nominal_calibration
    from realsim_core.rig import load_rig

    out = tmp_path / "out"
    out.mkdir()
    (out / "calibration.yaml").write_text("cameras:\n  cam_high: {translation: [0, 0]}\n")
    nominal = nominal_calibration(load_rig("builtin:aloha2", check_model=False))
    proc = start_node("-p", f"output_dir:={out}")
    probe = Probe("faults_probe")
    live = ("cam_high", "cam_low", "cam_right_wrist")  # cam_left_wrist stays silent
    # cam_right_wrist gets no camera_info: the rig's 848x480 intrinsics, rescaled
    sizes = {"cam_right_wrist": (106, 60)}
    i = 0

    def good_frames(n: int) -> None:
        nonlocal i
        for _ in range(n):
            probe.send_frame(i, cameras=live, sizes=sizes)
            i += 1

    try:
        probe.wait_ready(proc)
        # corrupt saved calibration: refused, nominal kept and published
        d = probe.diag()
        assert d["start"] == "nominal" and d["state"] == "nominal (engine not available)"
        assert probe.spin_until(lambda: bool(probe.tf))
        for t in probe.tf[-1].transforms:
            cam = t.child_frame_id.replace("_color_optical_frame", "")
            np.testing.assert_allclose(transform_to_pose(t), nominal.cameras[cam].pose,
                                       atol=1e-9)
        # camera_info for all but cam_right_wrist (missing: rig intrinsics, warned once)
        probe.send_infos(cameras=("cam_high", "cam_low", "cam_left_wrist"))
        good_frames(4)
        assert probe.wait_diag("frames_assembled", lambda n: n >= 2), probe.diag()

        n_corr = {a: len(probe.corrected[a]) for a in ARMS}
        ns = T0 + (i - 1) * 100_000_000 - 50_000_000  # between the last two good frames
        left = probe.joints["follower_left"]
        for k in range(3):
            # NaN / inf positions: not used, not republished
            bad = [0.0] * 9
            bad[k] = (np.nan, np.inf, -np.inf)[k]
            left.publish(joint_msg(ns + k, bad))
            # fewer names than expected: not used for sync (republished: nothing worse)
            left.publish(joint_msg(ns + 10 + k, [0.1, 0.2], names=("waist", "shoulder")))
            # unknown extra joint: warned, the known joints are used
            names = (*JOINTS, "bogus_joint")
            left.publish(joint_msg(ns + 20 + k, [0.0] * len(names), names=names))
            # wrong encoding
            probe.images["cam_high"].publish(image_msg(ns + k, encoding="32FC1"))
            # image size != camera_info, same aspect (rescaled) and other aspect (dropped)
            probe.images["cam_low"].publish(image_msg(ns + 30 + k, w=32, h=24))
            probe.images["cam_low"].publish(image_msg(ns + 40 + k, w=48, h=48))
            probe.pause(0.05)

        def rejected(key):
            return probe.diag_int(f"rejected/{key}")

        assert probe.spin_until(lambda: rejected("follower_left/rejected_nonfinite") == 3
                                and rejected("follower_left/rejected_names") == 3
                                and rejected("cam_high/image/undecodable") == 3
                                and rejected("cam_low/image/size_mismatch") == 3), probe.diag()
        assert rejected("follower_left/not_republished") == 3
        # everything but the 3 NaN/inf messages was republished
        assert probe.spin_until(
            lambda: len(probe.corrected["follower_left"]) == n_corr["follower_left"] + 6)
        assert all(np.all(np.isfinite(m.position)) for m in probe.corrected["follower_left"])

        # duplicate stamps: the same frame again is ignored, not assembled twice
        before = probe.diag_int("frames_assembled")
        probe.send_frame(i - 1, cameras=live, sizes=sizes)
        assert probe.wait_diag("sync/rejected_duplicate_image", lambda n: n == len(live)), (
            probe.diag())

        # good data afterwards still flows: nothing lost
        good_frames(6)
        assert probe.wait_diag("frames_assembled", lambda n: n >= before + 5), probe.diag()
        d = probe.diag()
        assert int(d["sync/partial_sets"]) >= 5  # cam_left_wrist silent: partial sets used
        assert "cam_left_wrist/image" in probe.messages()
        assert proc.poll() is None

        # save after a refused file: the corrupt one is moved aside, not overwritten
        res = probe.call(Trigger, "/realsim/save", Trigger.Request())
        assert res.success, res.message
        aside = list(out.glob("calibration.yaml.corrupt-*"))
        assert len(aside) == 1 and "translation: [0, 0]" in aside[0].read_text()
        assert read_calibration(out / "calibration.yaml").joint_offsets == nominal.joint_offsets
    finally:
        probe.destroy()
        log = _finish(proc)
    one_line_each = {
        "corrupt saved calibration": "refusing saved calibration",
        "NaN/inf": "non-finite",
        "fewer names": "lacks joints",
        "unknown joints": "unknown joints ['bogus_joint']",
        "wrong encoding": "unsupported image encoding '32FC1'",
        "size, same aspect": "cam_low: image 32x24 != camera_info 64x48",
        "size, other aspect": "aspect differs",
        "camera_info missing": "cam_right_wrist: no camera_info",
        "duplicate joint stamps": "duplicate joint_states stamp",
        "duplicate image stamps": "rejected duplicate image",
    }
    for case, needle in one_line_each.items():
        assert count_lines(log, needle) == 1, f"{case}: {needle!r} in\n{log}"


# ------------------------------------------------------------------ clock jumps (bag loop)


def _write_loop_bag(path, n_frames: int = 8, period_ns: int = 200_000_000) -> None:
    """1.4 s of frames: a loop jumps back by more than the 1 s clock-jump threshold."""
    from node_probe import arm_positions

    from realsim_core.bag import BagWriter
    from realsim_core.types import CameraIntrinsics

    intr = CameraIntrinsics(32, 24, 30.0, 30.0, 15.5, 11.5)
    with BagWriter(path) as w:
        for i in range(n_frames):
            ns = T0 + i * period_ns
            for arm in ARMS:  # joints just before and after each image
                for off in (-20_000_000, 20_000_000):
                    w.write_joint_state(f"/{arm}/joint_states", ns + off, list(JOINTS),
                                        arm_positions(i, arm))
            for k, cam in enumerate(CAMERAS):
                w.write_image(f"/{cam}/camera/color/image_rect_raw", ns,
                              np.full((24, 32, 3), 30 * k + i, np.uint8))
                w.write_camera_info(f"/{cam}/camera/color/camera_info", ns, intr)


def test_clock_jumping_backwards_on_bag_loop(ros_context, tmp_path):
    bag = tmp_path / "bag"
    _write_loop_bag(bag)
    proc = start_node("-p", f"output_dir:={tmp_path / 'out'}", "-p", "use_sim_time:=true")
    probe = Probe("loop_probe")
    replay = None
    try:
        probe.wait_ready(proc)
        replay = subprocess.Popen(
            [sys.executable, "-m", "realsim_ros.replay", str(bag), "--loop",
             "--wait-for-subscribers", "20"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        # the bag (1.4 s) loops: clock jumps back; sync resets and keeps assembling after it
        assert probe.wait_diag("sync/clock_resets", lambda n: n >= 2), probe.diag()
        after = probe.diag_int("frames_assembled")
        assert probe.wait_diag("frames_assembled", lambda n: n >= after + 4), probe.diag()
        assert proc.poll() is None
    finally:
        if replay is not None:
            replay.send_signal(signal.SIGINT)
            try:
                replay.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(replay.pid, signal.SIGKILL)
                replay.communicate()
        probe.destroy()
        log = _finish(proc)
    # one line for the jump (repeats within a minute are counted, not logged)
    assert count_lines(log, "clock jumped back") == 1, log


# ------------------------------------------------------------------ kill -9 during saves


SAVER = textwrap.dedent("""
    import sys
    from dataclasses import replace
    from realsim_core.online import CalibrationStore, nominal_calibration
    from realsim_core.rig import load_rig

    nominal = nominal_calibration(load_rig("builtin:aloha2", check_model=False))
    store = CalibrationStore(sys.argv[1])
    i = 0
    print("saving", flush=True)
    while True:
        offs = {k: 1e-4 * i for k in nominal.joint_offsets}
        store.save(replace(nominal, joint_offsets=offs, metrics={"i": i}))
        i += 1
""")


def test_kill_9_during_saves_leaves_a_valid_file(tmp_path):
    from realsim_core.calibration_io import read_calibration
    from realsim_core.online import CalibrationStore, nominal_calibration
    from realsim_core.rig import load_rig

    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    out = tmp_path / "out"
    nominal = nominal_calibration(load_rig("builtin:aloha2", check_model=False))
    rng = np.random.default_rng(0)
    last_seen = -1
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, str(script), str(out)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "saving"
        time.sleep(rng.uniform(0.05, 0.4))  # when to kill, not a pass criterion
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        cal = read_calibration(out / "calibration.yaml")  # never half a file
        i = cal.metrics["i"]
        assert set(cal.joint_offsets.values()) == {1e-4 * i}
        last_seen = max(last_seen, i)
    assert last_seen > 0
    # a fresh store resumes it and removes temp files a killed save left behind
    cal, line = CalibrationStore(out).load(nominal)
    assert cal is not None, line
    assert not list(out.glob(".calibration.yaml.*.tmp"))


# ------------------------------------------------------------------ overload

OVERLOAD_S = float(os.environ.get("REALSIM_OVERLOAD_S", "10"))
RSS_GROWTH_LIMIT_MB = 400.0  # keyframes (8 x 4 x 1.2 MB) + queues + allocator slack

PUBLISHER = textwrap.dedent("""
    import pathlib, sys, time
    import numpy as np
    import rclpy
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image, JointState

    seconds, w, h, rate = float(sys.argv[1]), 848, 480, 30.0
    cams = ["cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist"]
    arms = ["follower_left", "follower_right"]
    names = ["waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate",
             "gripper", "left_finger", "right_finger"]
    rclpy.init()
    node = rclpy.create_node("overload_pub")
    pubs = {c: node.create_publisher(Image, f"/{c}/camera/color/image_rect_raw",
                                     qos_profile_sensor_data) for c in cams}
    jpubs = {a: node.create_publisher(JointState, f"/{a}/joint_states", 10) for a in arms}
    msgs = {}
    for k, c in enumerate(cams):
        m = Image(height=h, width=w, encoding="rgb8", step=3 * w)
        m.data = np.random.default_rng(k).integers(0, 255, h * w * 3, np.uint8).tobytes()
        msgs[c] = m
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
            p.get_subscription_count() for p in [*pubs.values(), *jpubs.values()]):
        time.sleep(0.05)
    time.sleep(0.3)
    sent, i = 0, 0
    stamp0 = time.time_ns()

    def publish(i):
        ns = stamp0 + int(i * 1e9 / rate)
        st = (ns // 10**9, ns % 10**9)
        for a in arms:
            j = JointState(name=names, position=[0.02 * i] * 6 + [0.02, 0.02, -0.02])
            j.header.stamp.sec, j.header.stamp.nanosec = st
            jpubs[a].publish(j)
        for c in cams:
            msgs[c].header.stamp.sec, msgs[c].header.stamp.nanosec = st
            pubs[c].publish(msgs[c])
        return len(cams)

    # A slow head until the test says (a file) that the node has received an image of
    # every camera: every image lost after that falls in a stamp gap the node can count.
    # Large best-effort samples are lost even at this rate on a starved machine.
    flags = pathlib.Path(sys.argv[2])
    deadline = time.monotonic() + 60
    while not (flags / "go").exists() and time.monotonic() < deadline:
        sent += publish(i)
        i += 1
        time.sleep(0.3)
    i_go, t0 = i, time.monotonic()
    while time.monotonic() - t0 < seconds:
        sent += publish(i)
        i += 1
        delay = t0 + (i - i_go) / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    time.sleep(0.5)  # the last samples leave before the writers are destroyed
    print(sent, i_go, i, stamp0, flush=True)
    node.destroy_node()
    rclpy.shutdown()
""")


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_overload_four_848x480_streams_at_30hz(ros_context, tmp_path):
    script = tmp_path / "pub.py"
    script.write_text(PUBLISHER)
    proc = start_node("-p", f"output_dir:={tmp_path / 'out'}", "-p", "keyframes.capacity:=8",
                      "-p", "keyframes.min_joint_distance:=0.2")
    probe = Probe("overload_probe")
    pub = None
    try:
        probe.wait_ready(proc)
        rss0, cpu0 = _rss_mb(proc.pid), _cpu_s(proc.pid)
        flags = tmp_path / "flags"
        flags.mkdir()
        pub = subprocess.Popen([sys.executable, str(script), str(OVERLOAD_S), str(flags)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        rss_peak, t_start = rss0, time.monotonic()

        def watch(until) -> None:  # spin, track the RSS peak, until `until()` or pub exits
            nonlocal rss_peak
            while pub.poll() is None and not until():
                probe.pause(0.5)
                rss_peak = max(rss_peak, _rss_mb(proc.pid))

        watch(lambda: all(probe.diag_int(f"received/{c}/image") > 0 for c in CAMERAS))
        (flags / "go").touch()
        watch(lambda: False)
        wall = time.monotonic() - t_start
        cpu = _cpu_s(proc.pid) - cpu0
        pub_out, pub_err = pub.communicate(timeout=30)
        assert pub.returncode == 0, pub_err
        sent, i_go, n_stamps, stamp0 = map(int, pub_out.split())
        probe.pause(2.5)  # let the last diagnostics come in
        d = probe.diag()
        received = {c: int(d[f"received/{c}/image"]) for c in CAMERAS}
        lost = {c: int(d.get(f"lost/{c}/image", 0)) for c in CAMERAS}
        # index of each camera's last received image (stamps: stamp0 + i / 30 Hz)
        last = {c: round((int(d[f"last_stamp_ns/{c}/image"]) - stamp0) * 30 / 1e9)
                for c in CAMERAS}
        drops = {k: v for k, v in d.items()
                 if k.startswith(("sync/dropped", "loop/dropped", "lost/")) and v != "0"}
        report = (f"overload {OVERLOAD_S:g} s: sent {sent} images, node received "
                  f"{sum(received.values())}, counted lost {sum(lost.values())}; RSS {rss0:.0f} "
                  f"-> peak {rss_peak:.0f} MB; node CPU {cpu:.1f} s in {wall:.1f} s "
                  f"({100 * cpu / wall:.0f}%); frames {d.get('frames_assembled')}, keyframes "
                  f"{d.get('keyframes')}; per camera (received, lost, first overload index, "
                  f"last received index): "
                  f"{ {c: (received[c], lost[c], i_go, last[c]) for c in CAMERAS} }; "
                  f"drops {drops}")
        print(report)
        assert proc.poll() is None, "node died under overload"
        assert rss_peak - rss0 < RSS_GROWTH_LIMIT_MB, report
        assert int(d["keyframes"]) <= 8
        assert int(d["frames_assembled"]) > 0, report
        for c in CAMERAS:
            assert 0 <= last[c] < n_stamps, report
            # Every image not received is accounted for in diagnostics (stamp gaps or the
            # transport's sample-lost events): the node received one before the overload,
            # so everything from the overload's start to its last received image is counted
            # (the transport may count later ones too), and nothing is counted twice.
            assert last[c] - i_go + 1 <= received[c] + lost[c] <= n_stamps, report
    finally:
        if pub is not None and pub.poll() is None:
            pub.kill()
            pub.communicate()
        probe.destroy()
        _finish(proc)
