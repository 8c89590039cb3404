"""realsim_core: the real-to-sim calibration engine (no ROS imports here).

Public API is re-exported from this module; everything else is internal.
"""

from realsim_core.errors import RealsimError

__version__ = "0.1.0"

__all__ = ["RealsimError", "__version__"]
