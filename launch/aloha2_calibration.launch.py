"""Run the realsim calibration node on the ALOHA 2 rig.

ros2 launch realsim_ros aloha2_calibration.launch.py rig_file:=/path/rig.yaml
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from launch import LaunchDescription


def generate_launch_description() -> LaunchDescription:
    share = get_package_share_directory("realsim_ros")
    args = [
        DeclareLaunchArgument(
            "params_file", default_value=os.path.join(share, "config", "realsim.yaml"),
            description="Node parameters (YAML).",
        ),
        DeclareLaunchArgument(
            "rig_file", default_value="builtin:aloha2",
            description="Rig file (cameras, joints, model) or builtin:aloha2.",
        ),
        DeclareLaunchArgument(
            "output_dir", default_value="~/.ros/realsim",
            description="Where calibration.yaml and meshes are written.",
        ),
        DeclareLaunchArgument(
            "image_transport", default_value="raw",
            description="raw (sensor_msgs/Image) or compressed.",
        ),
        DeclareLaunchArgument(
            "use_sim_time", default_value="false", description="Use /clock (rosbag replay).",
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
                "use_sim_time": LaunchConfiguration("use_sim_time"),
            },
        ],
    )
    return LaunchDescription([*args, node])
