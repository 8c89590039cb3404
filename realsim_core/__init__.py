"""realsim_core: the real-to-sim calibration engine (no ROS imports here).

The names below are the public API; modules not re-exported here are internal. Heavy
modules (JAX, MuJoCo) load on first use of their names, so `import realsim_core` stays
cheap for the ROS node and the CLI.
"""

from __future__ import annotations

import importlib

from realsim_core.errors import RealsimError
from realsim_core.types import CameraIntrinsics, ImageSample, JointStateSample

__version__ = "0.1.0"

_LAZY = {
    # rig model and kinematics
    "Rig": "realsim_core.rig", "load_rig": "realsim_core.rig",
    "load_mjmodel": "realsim_core.rig",
    "KinematicModel": "realsim_core.kinematics",
    "build_kinematic_model": "realsim_core.kinematics", "forward": "realsim_core.kinematics",
    # data
    "BagWriter": "realsim_core.bag", "read_bag": "realsim_core.bag",
    "iter_raw": "realsim_core.bag",
    "FrameAssembler": "realsim_core.sync", "KeyframeBuffer": "realsim_core.sync",
    "assemble_recording": "realsim_core.sync",
    "Calibration": "realsim_core.calibration_io",
    "read_calibration": "realsim_core.calibration_io",
    "write_calibration": "realsim_core.calibration_io",
    # engine
    "CalibrationConfig": "realsim_core.calibration",
    "CalibrationSession": "realsim_core.calibration",
    "rig_gaussians": "realsim_core.calibration",
    "rasterize": "realsim_core.render",
    "synthesize": "realsim_core.synth", "SynthConfig": "realsim_core.synth",
}

__all__ = ["CameraIntrinsics", "ImageSample", "JointStateSample", "RealsimError",
           "__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'realsim_core' has no attribute {name!r}")
