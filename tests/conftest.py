"""Shared test setup.

DDS stays on this machine and every test session gets its own random domain id, so
parallel runs (and other developers' runs) never see each other's traffic.
"""

import os
import random

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
if os.environ.get("ROS_DISTRO") == "humble":
    os.environ["ROS_LOCALHOST_ONLY"] = "1"
os.environ["ROS_DOMAIN_ID"] = str(random.SystemRandom().randint(1, 101))

# XLA compilations persist across test runs (same cache as the `realsim` CLI); results
# do not depend on it, only the time to the first step.
from realsim_core.cli import enable_compilation_cache  # noqa: E402

enable_compilation_cache()
