"""The main job: calibrate a synthetic ALOHA 2 recording online, through the ROS 2 node.

    python -m realsim_ros.demo [--out out/demo] [--frames 20] [--resolution 212x120]
                               [--budget 240] [--quick]

1. `realsim synth` renders a recording with ground truth (MuJoCo's renderer; no objects:
   the engine calibrates cameras and joints, object reconstruction is not in the node);
2. the calibration node starts as its own process (the launch files' params file) with
   the engine (`estimator: realsim_core.online_engine:make_estimator`);
3. `realsim replay` publishes the recording over Fast DDS (localhost only);
4. this process watches /diagnostics until the engine reports "converged" or the
   optimisation budget is spent, calls `~/save`, and prints the `realsim evaluate`
   numbers before (the rig file's nominal) and after (the saved calibration.yaml).

`--quick` (or REALSIM_DEMO_QUICK=1) is the CI form: 8 frames at 106x60, 60 s budget.
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
from std_srvs.srv import Trigger

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


#: engine options (node parameter estimator_options) for the full and the quick job
ENGINE_FULL = ("{levels: [2], n_gaussians: 6000, max_frames: 16, min_frames: 6, "
               "accept_every: 3, holdout_every: 2}")
ENGINE_QUICK = ("{levels: [1], n_gaussians: 3000, max_frames: 8, min_frames: 3, "
                "accept_every: 2, holdout_every: 1, warmup_colour_steps: 10, "
                "colour_steps: 2, pose_steps: 2, batch_frames: 1}")


def _engine_params(path: Path, options: str) -> str:
    """A params file that switches the engine on (layered over the launch files' one)."""
    path.write_text("realsim:\n  ros__parameters:\n"
                    "    estimator: realsim_core.online_engine:make_estimator\n"
                    f"    estimator_options: \"{options}\"\n"
                    "    resume: false\n"
                    # the worker builds the engine while the replay runs: buffer it all
                    "    sync:\n      max_pending: 64\n"
                    "    worker:\n      queue_capacity: 64\n")
    return str(path)


def _table(before, after, saved) -> str:
    """Before/after rows of two `EvaluationReport`s (+ the held-out L1 of the saved file)."""
    rows = [f"{'':<34}{'before (nominal)':>18}{'after (saved)':>18}"]
    for cam in before.cameras:
        b, a = before.cameras[cam], after.cameras[cam]
        rows.append(f"{cam + ' [mm / deg]':<34}"
                    f"{b.translation_mm:>9.2f} / {b.rotation_deg:<6.3f}"
                    f"{a.translation_mm:>9.2f} / {a.rotation_deg:<6.3f}")
    mb = sum(before.joint_offsets.values()) / max(len(before.joint_offsets), 1)
    ma = sum(after.joint_offsets.values()) / max(len(after.joint_offsets), 1)
    rows.append(f"{'joint offsets, mean |error| [rad]':<34}{mb:>18.5f}{ma:>18.5f}")
    if before.tcp_mm is not None and after.tcp_mm is not None:
        rows.append(f"{'TCP error, mean [mm]':<34}{before.tcp_mm:>18.3f}{after.tcp_mm:>18.3f}")
    m = saved.metrics
    if "photometric_l1" in m and "photometric_l1_start" in m:
        rows.append(f"{'held-out photometric L1':<34}{m['photometric_l1_start']:>18.4f}"
                    f"{m['photometric_l1']:>18.4f}")
    if "drift_events" in m:  # the recording has no bump: anything here is a false alarm
        rows.append(f"{'drift events (camera re-opened)':<34}{'':>18}{int(m['drift_events']):>18d}")
    return "\n".join(rows)


def main(argv=None) -> int:
    """Run the main job; returns a process exit code."""
    ap = argparse.ArgumentParser(prog="realsim_ros.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/demo", help="working folder (default out/demo)")
    ap.add_argument("--frames", type=int, default=None, help="frames (default 20; quick 8)")
    ap.add_argument("--resolution", default=None, help="WxH (default 212x120; quick 96x54)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=1.0, help="replay speed factor")
    ap.add_argument("--budget", type=float, default=None,
                    help="optimisation seconds after the first step (default 240; quick 60)")
    ap.add_argument("--quick", action="store_true",
                    default=os.environ.get("REALSIM_DEMO_QUICK", "") not in ("", "0"),
                    help="small CI form (also REALSIM_DEMO_QUICK=1)")
    args = ap.parse_args(argv)
    frames = args.frames or (8 if args.quick else 20)
    resolution = args.resolution or ("96x54" if args.quick else "212x120")
    budget = args.budget if args.budget is not None else (60.0 if args.quick else 240.0)

    t_start = time.monotonic()
    out = Path(args.out)
    rec = out / f"recording-{frames}f-{resolution}-s{args.seed}"
    if not (rec / "ground_truth.yaml").exists():
        if rec.exists():
            import shutil

            shutil.rmtree(rec)
        out.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "realsim_core", "synth", str(rec), "--seed", str(args.seed),
              "--frames", str(frames), "--resolution", resolution, "--objects", "0"], "synth")
    else:
        print(f"[demo] reusing recording {rec}", flush=True)
    bag = next((p.parent for p in rec.rglob("metadata.yaml")), None)
    if bag is None:
        raise SystemExit(f"[demo] no rosbag2 folder under {rec}")
    cal_dir = out / "calibration"
    saved_path = cal_dir / "calibration.yaml"
    if saved_path.exists():
        saved_path.unlink()  # this run's result only

    engine = _engine_params(out / "engine.yaml", ENGINE_QUICK if args.quick else ENGINE_FULL)
    node_cmd = [sys.executable, "-m", "realsim_ros.calibration_node", "--ros-args",
                "--params-file", _params_file(), "--params-file", engine,
                "-p", f"rig_file:={rec / 'rig.yaml'}", "-p", f"output_dir:={cal_dir}"]
    print(f"[demo] node: {' '.join(node_cmd)}", flush=True)
    node_proc = subprocess.Popen(node_cmd, start_new_session=True)

    rclpy.init()
    listener = rclpy.create_node("realsim_demo")
    inputs: dict[str, str] = {}
    calib: dict[str, str] = {}

    def on_diag(msg: DiagnosticArray) -> None:
        for st in msg.status:
            target = inputs if st.name.endswith(": inputs") else calib
            target.clear()
            target.update({kv.key: kv.value for kv in st.values})
            target["_message"] = st.message

    listener.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 10)

    def spin_for(seconds: float, until=lambda: False) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if node_proc.poll() is not None:
                raise SystemExit(f"[demo] the node exited ({node_proc.returncode})")
            rclpy.spin_once(listener, timeout_sec=0.1)
            if until():
                return True
        return False

    rc = 0
    try:
        if not spin_for(60, lambda: bool(inputs)):
            raise SystemExit("[demo] the node published no diagnostics within 60 s")
        replay_cmd = [sys.executable, "-m", "realsim_ros.replay", str(bag),
                      "--rate", str(args.rate), "--wait-for-subscribers", "10",
                      "--no-clock"]  # the node runs on wall time here
        print(f"[demo] replay: {' '.join(replay_cmd)}", flush=True)
        replay_proc = subprocess.Popen(replay_cmd)
        while replay_proc.poll() is None:
            spin_for(0.1)
        if replay_proc.returncode != 0:
            raise SystemExit(f"[demo] replay failed (exit {replay_proc.returncode})")
        spin_for(2.5)  # two diagnostics periods so the last messages are counted
        print("\n[demo] what the node received over ROS 2:")
        for cam in defaults.CAMERAS:
            print(f"  {cam:<16} images {inputs.get(f'received/{cam}/image', '?'):>5}   "
                  f"camera_info {inputs.get(f'received/{cam}/camera_info', '?'):>5}")
        for arm in defaults.ARMS:
            print(f"  {arm:<16} joint_states "
                  f"{inputs.get(f'received/{arm}/joint_states', '?'):>5}")
        if any(inputs.get(f"received/{c}/image") in (None, "0") for c in defaults.CAMERAS):
            print("[demo] error: some camera stream did not arrive", file=sys.stderr)
            return 1

        # the engine: compile, then optimise until converged or the budget is spent
        print(f"\n[demo] calibrating (budget {budget:.0f} s after the first step; XLA "
              "compiles first, ~1-2 min on 2 cores unless cached)", flush=True)
        t_opt = None
        last_print = 0.0
        while True:
            spin_for(0.5)
            state = calib.get("state", "")
            now = time.monotonic()
            if t_opt is None and state.startswith(("optimising", "converged")):
                t_opt = now
                print(f"[demo] first step after {now - t_start:.0f} s", flush=True)
            if now - last_print > 15:
                last_print = now
                print(f"[demo] {now - t_start:5.0f} s  state: {state:<22} "
                      f"accepted {calib.get('metrics/accepted', '-'):>3}  "
                      f"held-out L1 {calib.get('metrics/holdout_l1', '-'):>9} "
                      f"(start {calib.get('metrics/holdout_l1_start', '-')})", flush=True)
            if state.startswith("converged"):
                print("[demo] the engine reports converged", flush=True)
                break
            if t_opt is not None and now - t_opt > budget:
                print(f"[demo] budget of {budget:.0f} s spent", flush=True)
                break
            if t_opt is None and now - t_start > 600:
                print("[demo] error: the engine did not start within 600 s", file=sys.stderr)
                return 1
        version = int(calib.get("estimate_version", "0"))
        client = listener.create_client(Trigger, "/realsim/save")
        if not spin_for(20, client.service_is_ready):
            raise SystemExit("[demo] ~/save not available")
        fut = client.call_async(Trigger.Request())
        if not spin_for(60, fut.done) or not fut.result().success:
            raise SystemExit(f"[demo] ~/save failed: {fut.result() and fut.result().message}")
        print(f"[demo] {fut.result().message}", flush=True)

        from realsim_core.calibration_io import read_calibration, read_ground_truth
        from realsim_core.evaluate import evaluate

        gt = read_ground_truth(rec / "ground_truth.yaml")
        saved = read_calibration(saved_path)
        print(f"\n[demo] realsim evaluate (truth: {rec / 'ground_truth.yaml'}):\n")
        print(_table(evaluate(gt.nominal, gt), evaluate(saved, gt), saved))
        print(f"\n[demo] full table of the saved calibration: realsim evaluate {saved_path} "
              f"{rec / 'ground_truth.yaml'}\n", flush=True)
        subprocess.call([sys.executable, "-m", "realsim_core", "evaluate", str(saved_path),
                         str(rec / "ground_truth.yaml")])
        if version < 1:
            print("[demo] error: the engine accepted no estimate (saved the nominal)",
                  file=sys.stderr)
            rc = 1
    finally:
        listener.destroy_node()
        rclpy.shutdown()
        node_proc.send_signal(signal.SIGINT)
        try:
            node_rc = node_proc.wait(timeout=60)
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
