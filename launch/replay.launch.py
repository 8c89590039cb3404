"""Replay a rosbag2 recording into the realsim calibration node (simulated time).

ros2 launch realsim_ros replay.launch.py bag:=/path/to/bag [loop:=true] [rate:=0.5]

Starts the node with use_sim_time:=true and `python -m realsim_ros.replay BAG`, which
publishes the bag at its recorded rate with /clock and waits for the node's subscribers.
"""

import os
import sys

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument, ExecuteProcess, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from launch import LaunchDescription


def _replay(context):
    """The replay process, built once the arguments are known."""
    cfg = {k: LaunchConfiguration(k).perform(context)
           for k in ("bag", "rate", "loop", "wait_for_subscribers_s")}
    cmd = [sys.executable, "-m", "realsim_ros.replay", cfg["bag"], "--rate", cfg["rate"],
           "--wait-for-subscribers", cfg["wait_for_subscribers_s"]]
    if cfg["loop"].lower() in ("true", "1", "yes"):
        cmd.append("--loop")
    return [ExecuteProcess(cmd=cmd, name="realsim_replay", output="screen")]


def generate_launch_description() -> LaunchDescription:
    share = get_package_share_directory("realsim_ros")
    args = [
        DeclareLaunchArgument(
            "bag",
            description="rosbag2 folder (MCAP or sqlite3) to replay, e.g. from `realsim synth`.",
        ),
        DeclareLaunchArgument(
            "rate", default_value="1.0",
            description="Playback speed factor (1.0 = recorded rate).",
        ),
        DeclareLaunchArgument(
            "loop", default_value="false",
            description="Start the bag again at its end (true/false).",
        ),
        DeclareLaunchArgument(
            "wait_for_subscribers_s", default_value="20",
            description="Seconds the replay waits (in all) for the node's subscriptions.",
        ),
        DeclareLaunchArgument(
            "params_file", default_value=os.path.join(share, "config", "realsim.yaml"),
            description="Node parameters (YAML).",
        ),
        DeclareLaunchArgument(
            "rig_file", default_value="builtin:aloha2",
            description="Rig file of the recording (`realsim synth` writes OUT/rig.yaml).",
        ),
        DeclareLaunchArgument(
            "output_dir", default_value="~/.ros/realsim",
            description="Where calibration.yaml is written (on ~/save and at shutdown).",
        ),
        DeclareLaunchArgument(
            "image_transport", default_value="raw",
            description="raw (sensor_msgs/Image) or compressed, as recorded in the bag.",
        ),
    ]
    node = Node(
        package="realsim_ros",
        executable="calibration_node",
        name="realsim",
        output="screen",
        emulate_tty=True,
        parameters=[
            LaunchConfiguration("params_file"),
            {
                "rig_file": LaunchConfiguration("rig_file"),
                "output_dir": LaunchConfiguration("output_dir"),
                "image_transport": LaunchConfiguration("image_transport"),
                "use_sim_time": True,
            },
        ],
    )
    return LaunchDescription([*args, node, OpaqueFunction(function=_replay)])
