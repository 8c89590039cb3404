"""realsim_ros: thin ROS 2 layer over realsim_core (messages, parameters, node)."""
