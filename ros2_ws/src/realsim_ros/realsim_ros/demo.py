"""The quick-start job: a synthetic ALOHA 2 recording replayed into the node over ROS 2.

    python -m realsim_ros.demo [--out out/demo] [--frames 20] [--resolution 212x120]

1. `realsim synth` renders a recording with ground truth (MuJoCo's renderer),
2. the calibration node starts as its own process (same params file as the launch file),
3. `realsim replay` publishes the recording over Fast DDS (localhost only),
4. this process listens to /diagnostics and prints what the node received.

The calibration engine is not wired into the node yet; when it is, this job also saves the
calibration and prints the `realsim evaluate` table.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import rclpy
from diagnostic_msgs.msg import DiagnosticArray

from realsim_ros import defaults

REPO_CONFIG = Path(__file__).resolve().parents[4] / "config" / "realsim.yaml"


def _params_file() -> str:
    try:
        from ament_index_python.packages import get_package_share_directory

        share = Path(get_package_share_directory("realsim_ros")) / "config" / "realsim.yaml"
        if share.exists():
            return str(share)
    except Exception:  # noqa: BLE001 - not installed through colcon: use the source tree
        pass
    return str(REPO_CONFIG)


def _run(cmd: list[str], what: str) -> None:
    print(f"[demo] {what}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    rc = subprocess.call(cmd)
    if rc != 0:
        raise SystemExit(f"[demo] {what} failed (exit {rc})")
    print(f"[demo] {what} took {time.monotonic() - t0:.1f} s", flush=True)


def main(argv=None) -> int:
    """Run the demo; returns a process exit code."""
    ap = argparse.ArgumentParser(prog="realsim_ros.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/demo", help="working folder (default out/demo)")
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--resolution", default="212x120")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=1.0, help="replay speed factor")
    args = ap.parse_args(argv)

    t_start = time.monotonic()
    out = Path(args.out)
    rec = out / "recording"
    if not (rec / "rig.yaml").exists():
        if rec.exists():
            import shutil

            shutil.rmtree(rec)
        out.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "realsim_core", "synth", str(rec), "--seed", str(args.seed),
              "--frames", str(args.frames), "--resolution", args.resolution], "synth")
    else:
        print(f"[demo] reusing recording {rec}", flush=True)
    bag = next((p.parent for p in rec.rglob("metadata.yaml")), None)
    if bag is None:
        raise SystemExit(f"[demo] no rosbag2 folder under {rec}")

    node_cmd = [sys.executable, "-m", "realsim_ros.calibration_node", "--ros-args",
                "--params-file", _params_file(), "-p", f"rig_file:={rec / 'rig.yaml'}",
                "-p", f"output_dir:={out / 'calibration'}"]
    print(f"[demo] node: {' '.join(node_cmd)}", flush=True)
    node_proc = subprocess.Popen(node_cmd, start_new_session=True)

    rclpy.init()
    listener = rclpy.create_node("realsim_demo")
    last: dict[str, str] = {}

    def on_diag(msg: DiagnosticArray) -> None:
        for st in msg.status:
            if st.name.endswith(": inputs"):
                last.clear()
                last.update({kv.key: kv.value for kv in st.values})
                last["_message"] = st.message

    listener.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 10)
    rc = 0
    try:
        deadline = time.monotonic() + 60
        while not last and time.monotonic() < deadline:
            rclpy.spin_once(listener, timeout_sec=0.1)
        if not last:
            raise SystemExit("[demo] the node published no diagnostics within 60 s")
        replay_cmd = [sys.executable, "-m", "realsim_ros.replay", str(bag),
                      "--rate", str(args.rate), "--wait-for-subscribers", "10",
                      "--no-clock"]  # the node runs on wall time here
        print(f"[demo] replay: {' '.join(replay_cmd)}", flush=True)
        replay_proc = subprocess.Popen(replay_cmd)
        while replay_proc.poll() is None:
            rclpy.spin_once(listener, timeout_sec=0.1)
        if replay_proc.returncode != 0:
            raise SystemExit(f"[demo] replay failed (exit {replay_proc.returncode})")
        # two diagnostics periods so the last messages are counted
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            rclpy.spin_once(listener, timeout_sec=0.1)
        print("\n[demo] what the node received over ROS 2:")
        for cam in defaults.CAMERAS:
            print(f"  {cam:<16} images {last.get(f'received/{cam}/image', '?'):>5}   "
                  f"camera_info {last.get(f'received/{cam}/camera_info', '?'):>5}")
        for arm in defaults.ARMS:
            print(f"  {arm:<16} joint_states {last.get(f'received/{arm}/joint_states', '?'):>5}")
        print(f"  status: {last.get('_message')}")
        if any(last.get(f"received/{c}/image") in (None, "0") for c in defaults.CAMERAS):
            print("[demo] error: some camera stream did not arrive", file=sys.stderr)
            rc = 1
    finally:
        listener.destroy_node()
        rclpy.shutdown()
        node_proc.send_signal(signal.SIGINT)
        try:
            node_rc = node_proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(node_proc.pid, signal.SIGKILL)
            node_rc = -9
        if node_rc != 0:
            print(f"[demo] node exited with {node_rc}", file=sys.stderr)
            rc = rc or 1
    print(f"[demo] done in {time.monotonic() - t_start:.1f} s", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
