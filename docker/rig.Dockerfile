# realsim for the ALOHA 2 rig: ROS 2 Jazzy base + realsim_core with the repository's pins.
# Untested here (no Docker engine on the development machines); mirrors scripts/install.sh.
#   docker build -f docker/rig.Dockerfile -t realsim:rig .
#   docker run --net=host --ipc=host realsim:rig ros2 launch realsim_ros aloha2_calibration.launch.py
ARG ROS_DISTRO=jazzy
FROM ros:${ROS_DISTRO}-ros-base
ARG ROS_DISTRO
ENV ROS_DISTRO=${ROS_DISTRO} MUJOCO_GL=egl PYTHON=python3 REALSIM_VENV=/opt/realsim/venv
RUN apt-get update && apt-get install -y --no-install-recommends \
      python3-venv python3-pip libegl1 libgl1 libosmesa6 libglib2.0-0 \
      ros-${ROS_DISTRO}-tf2-msgs ros-${ROS_DISTRO}-diagnostic-msgs ros-${ROS_DISTRO}-visualization-msgs \
      ros-${ROS_DISTRO}-shape-msgs ros-${ROS_DISTRO}-std-srvs \
      ros-${ROS_DISTRO}-launch-testing ros-${ROS_DISTRO}-launch-testing-ros \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/realsim/src
COPY . .
# ROS_DISTRO is set: the venv sees the system rclpy and no ROS wheels or shim are installed.
RUN bash -c "source /opt/ros/${ROS_DISTRO}/setup.bash && scripts/install.sh"
RUN printf 'source /opt/ros/%s/setup.bash\nsource /opt/realsim/venv/bin/activate\nsource /opt/realsim/src/ros2_ws/install/setup.bash\n' \
      "${ROS_DISTRO}" >> /etc/bash.bashrc
SHELL ["/bin/bash", "-lc"]
ENTRYPOINT ["/opt/realsim/src/scripts/with-env"]
CMD ["ros2", "launch", "realsim_ros", "aloha2_calibration.launch.py"]
