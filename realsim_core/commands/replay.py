"""`realsim replay BAG`: publish a recording on ROS 2 (runs `realsim_ros.replay`).

realsim_core never imports rclpy; this command starts the ROS package's replay module as a
child process with the same interpreter and environment.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from realsim_core.errors import RealsimError


def add_parser(sub) -> None:
    p = sub.add_parser("replay", help="publish a rosbag2 recording on ROS 2 (with /clock)",
                       description="Publish a rosbag2 recording at its recorded rate, with /clock.")
    p.add_argument("bag", help="rosbag2 folder (MCAP or sqlite3)")
    p.add_argument("--rate", type=float, default=1.0, help="playback speed factor (default 1)")
    p.add_argument("--loop", action="store_true", help="start again at the end")
    p.add_argument("--topics", nargs="+", help="only these topics")
    p.add_argument("--no-clock", action="store_true", help="do not publish /clock")
    p.add_argument("--wait-for-subscribers", type=float, default=0.0, metavar="S",
                   help="wait up to S seconds (in all) until every topic has a subscriber")
    p.set_defaults(func=run)


def run(args) -> int:
    if not os.path.isdir(args.bag):
        raise RealsimError(f"bag folder not found: {args.bag}")
    if importlib.util.find_spec("realsim_ros") is None:
        raise RealsimError(
            "replay needs the ROS 2 package realsim_ros: run it through scripts/with-env "
            "or source ros2_ws/install/setup.bash"
        )
    cmd = [sys.executable, "-m", "realsim_ros.replay", args.bag, "--rate", str(args.rate),
           "--wait-for-subscribers", str(args.wait_for_subscribers)]
    if args.loop:
        cmd.append("--loop")
    if args.no_clock:
        cmd.append("--no-clock")
    if args.topics:
        cmd += ["--topics", *args.topics]
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 130
