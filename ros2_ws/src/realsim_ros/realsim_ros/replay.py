"""Publish a rosbag2 recording on ROS 2 at its recorded rate, with /clock.

    python -m realsim_ros.replay BAG [--rate 1.0] [--loop] [--topics T ...] [--no-clock]

Messages are published as the recorded CDR bytes (no decode/encode round trip). Reading
the bag is realsim_core's job (`realsim_core.bag.iter_raw`); this module only publishes.
`realsim replay` runs this module.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock

from realsim_core.bag import bag_topics, iter_raw
from realsim_core.errors import RealsimError

CLOCK_PERIOD_S = 0.01  # /clock at 100 Hz between messages
# A publisher sees a subscription before that subscriber has matched the publisher; a
# best-effort reader drops what arrives in between. Give the reverse match this long.
MATCH_SETTLE_S = 1.0


def message_class(msgtype: str):
    """'sensor_msgs/msg/Image' -> the generated Python class."""
    pkg, kind, name = msgtype.split("/")
    try:
        return getattr(importlib.import_module(f"{pkg}.{kind}"), name)
    except (ImportError, AttributeError) as exc:
        raise RealsimError(f"message type {msgtype} is not available in this ROS install") from exc


def _qos_for(topic: str) -> QoSProfile:
    if topic == "/tf_static":
        return QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                          reliability=ReliabilityPolicy.RELIABLE)
    return QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)


def _stamp_msg(ns: int):
    from builtin_interfaces.msg import Time

    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def replay(node, bag: str, rate: float = 1.0, loop: bool = False, topics=None,
           clock: bool = True, wait_for_subscribers_s: float = 0.0) -> int:
    """Publish `bag` through `node`; returns the number of messages published."""
    # every publisher exists before the first message, so discovery runs for all at once
    publishers = {t: node.create_publisher(message_class(m), t, _qos_for(t))
                  for t, m in bag_topics(bag, topics).items()}
    clock_pub = node.create_publisher(Clock, "/clock", 10) if clock else None
    published = 0
    if wait_for_subscribers_s > 0:
        deadline = time.monotonic() + wait_for_subscribers_s  # one budget for all topics
        waiting = [*publishers.values(), *([clock_pub] if clock_pub else [])]
        while (any(p.get_subscription_count() == 0 for p in waiting)
               and time.monotonic() < deadline):
            time.sleep(0.02)
        time.sleep(MATCH_SETTLE_S)
    while True:
        t0_wall = None
        t0_bag = None
        last_clock = -1.0
        for topic, _msgtype, stamp_ns, data in iter_raw(bag, topics):
            if t0_wall is None:
                t0_wall, t0_bag = time.monotonic(), stamp_ns
            target = t0_wall + (stamp_ns - t0_bag) / 1e9 / rate
            while True:
                now = time.monotonic()
                if clock_pub is not None and now - last_clock >= CLOCK_PERIOD_S:
                    sim_ns = t0_bag + int((now - t0_wall) * rate * 1e9)
                    clock_pub.publish(Clock(clock=_stamp_msg(min(sim_ns, stamp_ns))))
                    last_clock = now
                if now >= target:
                    break
                time.sleep(min(target - now, CLOCK_PERIOD_S))
            publishers[topic].publish(data)
            published += 1
        if not loop or not rclpy.ok():
            return published


def main(argv=None) -> int:
    """Entry point (`realsim replay` runs this)."""
    parser = argparse.ArgumentParser(prog="realsim replay", description=__doc__.splitlines()[0])
    parser.add_argument("bag", help="rosbag2 folder (MCAP or sqlite3)")
    parser.add_argument("--rate", type=float, default=1.0, help="playback speed factor")
    parser.add_argument("--loop", action="store_true", help="start again at the end")
    parser.add_argument("--topics", nargs="+", help="only these topics")
    parser.add_argument("--no-clock", action="store_true", help="do not publish /clock")
    parser.add_argument("--wait-for-subscribers", type=float, default=0.0, metavar="S",
                        help="wait up to S seconds (in all) for a subscriber on every topic")
    args, ros_args = parser.parse_known_args(argv)
    if args.rate <= 0:
        parser.error("--rate must be > 0")
    rclpy.init(args=ros_args)
    node = rclpy.create_node("realsim_replay")
    try:
        n = replay(node, args.bag, args.rate, args.loop, args.topics, not args.no_clock,
                   args.wait_for_subscribers)
        node.get_logger().info(f"published {n} messages from {args.bag}")
        return 0
    except RealsimError as exc:
        print(f"realsim replay: error: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, ExternalShutdownException):
        return 0
    finally:
        node.destroy_node()
        if rclpy.ok():
            rclpy.shutdown()


if __name__ == "__main__":
    sys.exit(main())
