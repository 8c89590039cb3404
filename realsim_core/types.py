"""Plain data types exchanged between I/O, sync and the engine (numpy only, no ROS)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class CameraIntrinsics:
    """Pinhole intrinsics of one camera image (pixels). Distortion is ignored (rectified input)."""

    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float

    def matrix(self) -> np.ndarray:
        """3x3 K matrix, float64."""
        return np.array([[self.fx, 0.0, self.cx], [0.0, self.fy, self.cy], [0.0, 0.0, 1.0]])

    def scaled(self, width: int, height: int) -> CameraIntrinsics:
        """The same camera resampled to width x height (pixel-centre convention)."""
        sx, sy = width / self.width, height / self.height
        return CameraIntrinsics(
            width, height, self.fx * sx, self.fy * sy,
            (self.cx + 0.5) * sx - 0.5, (self.cy + 0.5) * sy - 0.5,
        )


@dataclass(frozen=True)
class ImageSample:
    """One decoded camera image. `rgb` is uint8 [H, W, 3]; stamp in nanoseconds."""

    stamp_ns: int
    rgb: np.ndarray
    frame_id: str = ""


@dataclass(frozen=True)
class JointStateSample:
    """One `sensor_msgs/JointState`: names and positions (rad, m for fingers)."""

    stamp_ns: int
    names: tuple[str, ...]
    position: np.ndarray  # [J] float64
    velocity: np.ndarray = field(default_factory=lambda: np.zeros(0))
    effort: np.ndarray = field(default_factory=lambda: np.zeros(0))
