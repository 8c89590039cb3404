"""ament_python package for the realsim ROS 2 node; the engine is the realsim_core package."""

import os
from glob import glob
from pathlib import Path

from setuptools import find_packages, setup

PACKAGE = "realsim_ros"
HERE = Path(__file__).resolve().parent
# launch/ and config/ live at the repository root; install them into this package's share
# so `ros2 launch realsim_ros <file>` finds them. Paths must be relative to setup.py.
REPO = HERE.parents[2]


def _rel(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, HERE) for p in glob(str(REPO / pattern)))


setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", _rel("launch/*.launch.py")),
        (f"share/{PACKAGE}/config", _rel("config/*.yaml")),
    ],
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="realsim developers",
    maintainer_email="dev@realsim.invalid",
    description="ROS 2 node for realsim (online calibration of the ALOHA 2 rig)",
    license="Apache-2.0",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [
            "calibration_node = realsim_ros.calibration_node:main",
        ],
    },
)
