"""The calibration engine behind the online node (`Estimator` of `realsim_core.online`).

Node parameter `estimator: realsim_core.online_engine:make_estimator` selects it. Keyframes
go into the session's training slots; one in `holdout_every` other frames becomes a
held-out frame. Each `step()` runs one colour/pose alternation at the finest pyramid level
and, every `accept_every` steps, accepts the estimate only if the held-out L1 did not get
worse (never publishes a worse calibration).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from realsim_core.calibration import CalibrationConfig, CalibrationSession, rig_gaussians
from realsim_core.calibration_io import Calibration
from realsim_core.sync import FrameSet
from realsim_core.types import CameraIntrinsics


class SessionEstimator:
    """`Estimator` backed by a `CalibrationSession` (built once intrinsics are known)."""

    is_calibration = True

    def __init__(self, rig, start: Calibration, config: CalibrationConfig | None = None,
                 max_frames: int = 24, min_frames: int = 4, n_gaussians: int = 8000,
                 accept_every: int = 5, holdout_every: int = 5) -> None:
        self.rig = rig
        self.cfg = config or CalibrationConfig(levels=(2,), warmup_colour_steps=40)
        self.max_frames = max_frames
        self.min_frames = min_frames
        self.n_gaussians = n_gaussians
        self.accept_every = accept_every
        self.holdout_every = holdout_every
        self.reset(start)

    # ------------------------------------------------------------------ Estimator
    def reset(self, start: Calibration) -> None:  # noqa: D102 (see Estimator)
        self._start = start
        self.session: CalibrationSession | None = None
        self._others = 0
        self._steps = 0
        self._t0 = time.monotonic()
        self.state = "waiting for frames"

    def add_frame(self, frame: FrameSet, intrinsics: Mapping[str, CameraIntrinsics],
                  keyframe: bool) -> None:  # noqa: D102
        if self.session is None:
            if not all(c in intrinsics for c in self.rig.camera_names):
                return
            self._build({c: intrinsics[c] for c in self.rig.camera_names})
        s = self.session
        holdout = False
        if not keyframe:
            self._others += 1
            if self._others % self.holdout_every:
                return
            holdout = True
        q = np.concatenate([frame.joints[a.name] for a in self.rig.arms])
        images = {c: img.rgb for c, img in frame.images.items() if c in self.rig.camera_names}
        s.add_frame(images, q, frame.stamp_ns, holdout=holdout)

    def step(self) -> bool:  # noqa: D102
        s = self.session
        if s is None or int(np.sum(np.asarray(s.bufs.train))) < self.min_frames:
            n = 0 if s is None else int(np.sum(np.asarray(s.bufs.train)))
            self.state = f"waiting for frames ({n}/{self.min_frames})"
            return False
        if not getattr(s, "_started", False):
            self.state = "compiling"
            s.start()
            s.cycle(colour_steps=self.cfg.warmup_colour_steps)
        self.state = "optimising"
        s.cycle()
        self._steps += 1
        if self._steps % self.accept_every:
            return False
        return s.try_accept()

    def estimate(self) -> Calibration:  # noqa: D102
        if self.session is None:
            return self._start
        est = self.session.estimate()
        return Calibration(cameras=est.cameras, joint_offsets=est.joint_offsets,
                           objects=self._start.objects, metrics=est.metrics)

    def metrics(self) -> dict[str, float]:  # noqa: D102
        if self.session is None:
            return {}
        m = self.session.metrics
        return {"steps": float(m.steps), "loss": float(m.loss),
                "holdout_l1": float(m.holdout_l1), "holdout_l1_start": float(m.holdout_l1_start),
                "accepted": float(m.accepted), "rejected": float(m.rejected),
                "rollbacks": float(m.rollbacks), "frames": float(self.session.n_frames),
                "steps_per_s": m.steps / max(time.monotonic() - self._t0, 1e-9)}

    # ------------------------------------------------------------------ internals
    def _build(self, intrinsics: dict[str, CameraIntrinsics]) -> None:
        from realsim_core.rig import load_mjmodel

        model = load_mjmodel(self.rig)
        gauss = rig_gaussians(model, self.n_gaussians, seed=self.cfg.seed)
        s = CalibrationSession(self.rig, model, intrinsics, gauss, self.cfg,
                               max_frames=self.max_frames)
        s.set_start(dict(self._start.joint_offsets),
                    {n: c.pose for n, c in self._start.cameras.items()})
        self.session = s


def make_estimator(rig, start: Calibration) -> SessionEstimator:
    """Factory named by the node parameter `estimator`."""
    return SessionEstimator(rig, start)
