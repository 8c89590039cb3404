"""Helpers for tests that talk to real ROS 2 processes over Fast DDS (localhost only)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PARAMS_FILE = REPO / "config" / "realsim.yaml"

try:
    import rclpy  # noqa: F401
    from rclpy.executors import SingleThreadedExecutor  # noqa: F401

    HAVE_RCLPY = True
    WHY_NO_RCLPY = ""
except ImportError as exc:  # pragma: no cover - depends on the machine
    HAVE_RCLPY = False
    WHY_NO_RCLPY = f"rclpy not importable ({exc}); run the tests through `make test`"

needs_ros = pytest.mark.skipif(not HAVE_RCLPY, reason=WHY_NO_RCLPY or "rclpy missing")


def start_node(*ros_args: str, env: dict | None = None) -> subprocess.Popen:
    """Start the calibration node as its own process, with the launch files' params file."""
    cmd = [
        sys.executable, "-m", "realsim_ros.calibration_node",
        "--ros-args", "--params-file", str(PARAMS_FILE), *ros_args,
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})}, start_new_session=True,
    )


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout: float = 15.0):
    """Send `sig`, wait, and return (returncode, stdout, stderr); kills on timeout."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return proc.returncode, out, err


def spin_until(node, predicate: Callable[[], bool], timeout: float) -> bool:
    """Spin `node` until `predicate()` is true or `timeout` seconds pass."""
    import rclpy

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rclpy.spin_once(node, timeout_sec=0.05)
        if predicate():
            return True
    return False
