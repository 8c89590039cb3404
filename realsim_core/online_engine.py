"""The calibration engine behind the online node (`Estimator` of `realsim_core.online`).

Node parameter `estimator: realsim_core.online_engine:make_estimator` selects it, and
`estimator_options` (a YAML mapping) passes keyword options to `make_estimator` (engine
size, schedule, drift thresholds; see `OPTIONS`). Keyframes go into the session's
training slots; one in `holdout_every` other frames becomes a held-out frame. Each
`step()` runs one colour/pose alternation at the finest pyramid level and, every
`accept_every` steps, accepts the estimate only if the held-out L1 did not get worse
(never publishes a worse calibration). The held-out set grows while frames arrive, so
the accepted estimate (and the nominal start) are re-scored on the current held-out set
before each comparison. Each rejected test halves the pose step size (reduce on plateau,
down to `lr_final_fraction` of the configured rates), so the estimate settles instead of
jittering at Adam's constant step; a drift re-open restores full steps. After each test
that accepted an estimate or saw a new held-out set, `metrics()` carries the outline
check of `realsim calibrate` per camera (`edge_distance_px_start/<camera>`,
`edge_distance_px/<camera>`: robot outline to image edges on the held-out frames, px).

Drift: once the session has run its first acceptance test (so the appearance has been
fitted to the buffered frames for `accept_every` cycles after the colour warm-up), every
new frame is scored per camera under the accepted estimate (mean L1 at the finest level)
and fed to a `DriftDetector`. Frames that arrive earlier are not judged: under colours
painted from a few frames, a wrist view that moves onto content none of them showed
scores high without any bump (`make demo`, session 12: a false drift of
`cam_left_wrist` that masked 14 of its 20 images). When a camera's
residual stays above its recent baseline (a bumped camera), the estimator reports it in
`drift` (the node puts it in /diagnostics) and re-opens that camera: its images older
than the drift onset are masked out of the buffer (training and held-out), the
optimiser state is reset (Adam moments would otherwise still hold the old equilibrium)
and the held-out baseline is re-scored, so the camera's pose can move to where the new
frames put it.
"""

from __future__ import annotations

import inspect
import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import fields

import numpy as np

from realsim_core.calibration import (
    CalibrationConfig,
    CalibrationSession,
    mount_subtree_bodies,
    rig_gaussians,
)
from realsim_core.calibration_io import Calibration
from realsim_core.errors import RealsimError
from realsim_core.online import DriftDetector
from realsim_core.sync import FrameSet
from realsim_core.types import CameraIntrinsics

#: the default engine config of the node: one pyramid level (half resolution), table top
#: and floor as surfels. The online engine has no flat level, and textured planes painted
#: at the nominal poses pull the fixed cameras away (`make demo`, 2026-12-01: TCP 7.62 mm
#: and cam_high 14.7 mm with them, 4.66 mm and 5.3 mm without; docs/calibration.md)
DEFAULT_CONFIG = CalibrationConfig(levels=(2,), warmup_colour_steps=40, textured_planes=False)

class SessionEstimator:
    """`Estimator` backed by a `CalibrationSession` (built once intrinsics are known).

    Options (the keyword arguments after `config`; `OPTIONS` lists them with defaults):
    max_frames: session buffer slots (training + held out); min_frames: training frames
    before optimising; n_gaussians: surfels on the rig; accept_every: cycles between
    acceptance tests; holdout_every: one in N non-keyframes is held out; converged_after:
    rejected acceptance tests in a row -> state "converged"; drift: score new frames per
    camera and re-open bumped cameras; drift_ratio, drift_min_excess, drift_patience,
    drift_window, drift_min_history: `DriftDetector` thresholds (see realsim_core.online).
    """

    is_calibration = True

    def __init__(self, rig, start: Calibration, config: CalibrationConfig | None = None,
                 max_frames: int = 24, min_frames: int = 4, n_gaussians: int = 8000,
                 accept_every: int = 5, holdout_every: int = 5, converged_after: int = 3,
                 drift: bool = True, drift_ratio: float = 1.3, drift_min_excess: float = 0.005,
                 drift_patience: int = 3, drift_window: int = 8,
                 drift_min_history: int = 5) -> None:
        self.rig = rig
        self.cfg = config or DEFAULT_CONFIG
        self.max_frames = max_frames
        self.min_frames = min_frames
        self.n_gaussians = n_gaussians
        self.accept_every = max(1, accept_every)
        self.holdout_every = max(1, holdout_every)
        self.converged_after = max(1, converged_after)
        self.drift_enabled = bool(drift)
        self._drift_args = dict(ratio=drift_ratio, min_excess=drift_min_excess,
                                patience=drift_patience, window=drift_window,
                                min_history=drift_min_history)
        DriftDetector(**self._drift_args)  # bad thresholds fail here, at start
        self.drift_events: list[dict] = []  # every drift seen: camera, residual, baseline, stamp
        self.reset(start)

    # ------------------------------------------------------------------ Estimator
    def reset(self, start: Calibration) -> None:  # noqa: D102 (see Estimator)
        self._start = start
        self.session: CalibrationSession | None = None
        self._started = False
        self._judging = False  # drift is judged after the first acceptance test
        self._nominal_params = None
        self._dirty = False  # held-out set changed since the last scoring
        self._others = 0
        self._steps = 0
        self._rejected_in_row = 0
        self._recent_stamps: deque[int] = deque(maxlen=max(1, self._drift_args["patience"]))
        self.detector = DriftDetector(**self._drift_args)
        self.residuals: dict[str, float] = {}
        # camera -> (start, accepted) outline-to-edge distance (px) on the held-out frames
        self.outline: dict[str, tuple[float, float]] = {}
        self._outline_start = None  # the start's scores on the current held-out set
        self.drift = ""  # "" = no drift seen; else what was seen and done (for diagnostics)
        self._t0 = time.monotonic()
        self.state = "waiting for frames"

    def add_frame(self, frame: FrameSet, intrinsics: Mapping[str, CameraIntrinsics],
                  keyframe: bool) -> None:  # noqa: D102
        if self.session is None:
            if not all(c in intrinsics for c in self.rig.camera_names):
                return
            self._build({c: intrinsics[c] for c in self.rig.camera_names})
        s = self.session
        q = np.concatenate([frame.joints[a.name] for a in self.rig.arms])
        images = {c: img.rgb for c, img in frame.images.items() if c in self.rig.camera_names}
        if self._judging and self.drift_enabled:
            self._check_drift(images, q, frame.stamp_ns)
        holdout = False
        if not keyframe:
            self._others += 1
            if self._others % self.holdout_every:
                return
            holdout = True
        s.add_frame(images, q, frame.stamp_ns, holdout=holdout)
        self._dirty = self._dirty or self._started

    def request_stop(self) -> None:
        """Called from another thread: let the running step end after its current Adam step."""
        if self.session is not None:
            self.session.stop_requested = True
            self.session._cancel_precompiled()  # a compilation under way still ends first

    def step(self) -> bool:  # noqa: D102
        s = self.session
        if s is None or int(np.sum(np.asarray(s.bufs.train))) < self.min_frames:
            n = 0 if s is None else int(np.sum(np.asarray(s.bufs.train)))
            self.state = f"waiting for frames ({n}/{self.min_frames})"
            return False
        if not self._started:
            self.state = "compiling"
            s.start(levels=[len(s.cfg.levels) - 1])   # cycle() runs the last level
            self._nominal_params = dict(s.accepted)
            s.cycle(colour_steps=self.cfg.warmup_colour_steps)
            self._started = True
        s.cycle()
        self._steps += 1
        if self._rejected_in_row < self.converged_after:
            self.state = "optimising"
        if self._steps % self.accept_every:
            return False
        changed = self._dirty
        self._rescore()
        ok = s.try_accept()
        if ok or changed or not self.outline:
            self._score_outlines(rescore_start=changed or not self.outline)
        self._judging = True
        self._rejected_in_row = 0 if ok else self._rejected_in_row + 1
        if not ok:  # reduce on plateau: halve the pose step, down to the offline floor
            s.lr_scale = max(self.cfg.lr_final_fraction, 0.5 * s.lr_scale)
        if self._rejected_in_row >= self.converged_after:
            self.state = "converged"
        return ok

    def estimate(self) -> Calibration:  # noqa: D102
        if self.session is None:
            return self._start
        est = self.session.estimate()
        return Calibration(cameras=est.cameras, joint_offsets=est.joint_offsets,
                           objects=self._start.objects,
                           metrics={**est.metrics, "drift_events": len(self.drift_events)})

    def metrics(self) -> dict[str, float]:  # noqa: D102
        if self.session is None:
            return {}
        m = self.session.metrics
        out = {"steps": float(m.steps), "loss": float(m.loss),
               "holdout_l1": float(m.holdout_l1), "holdout_l1_start": float(m.holdout_l1_start),
               "accepted": float(m.accepted), "rejected": float(m.rejected),
               "rollbacks": float(m.rollbacks), "frames": float(self.session.n_frames),
               "camera_reverts": float(m.camera_reverts),
               "steps_per_s": m.steps / max(time.monotonic() - self._t0, 1e-9),
               "drift_events": float(len(self.drift_events))}
        out.update({f"residual/{c}": r for c, r in self.residuals.items()})
        for c, (start, now) in self.outline.items():
            out[f"edge_distance_px_start/{c}"] = start
            out[f"edge_distance_px/{c}"] = now
        return out

    # ------------------------------------------------------------------ held-out scoring
    def _rescore(self) -> None:
        """Score the accepted estimate and the nominal start on the current held-out set."""
        if not self._dirty:
            return
        s = self.session
        s.metrics.holdout_l1 = s.metrics.holdout_l1_best = s.holdout_residual(s.accepted)
        s.metrics.holdout_l1_start = s.holdout_residual(self._nominal_params)
        self._dirty = False

    def _score_outlines(self, rescore_start: bool) -> None:
        """The appearance-free check of `realsim calibrate`, for /diagnostics.

        Mean distance (px) from each camera's rendered robot outline to the edges of its
        held-out images, at the nominal start and at the accepted estimate
        (`CalibrationSession.silhouette_edge_scores`); the start is re-scored only when
        the held-out set changed. A camera that sees no robot there is left out.
        """
        s = self.session
        if rescore_start:
            start, now = s.silhouette_edge_scores(self._nominal_params, s.accepted)
            self._outline_start = start
        else:
            start, (now,) = self._outline_start, s.silhouette_edge_scores(s.accepted)
        self.outline = {c: (float(a), float(b)) for c, a, b in zip(s.cameras, start, now)
                        if np.isfinite(a) and np.isfinite(b)}

    # ------------------------------------------------------------------ drift
    def camera_residuals(self, images: Mapping[str, np.ndarray], q: np.ndarray,
                         params=None) -> dict[str, float]:
        """Mean L1 (0-1) per camera of one frame under `params` (default: accepted).

        images: {camera: uint8 [H, W, 3]} at the session's full resolution; q: [J] rad.
        Cameras not in `images` are left out.
        """
        return self.session.camera_residuals(images, q, params)

    def _check_drift(self, images, q, stamp_ns: int) -> None:
        self._recent_stamps.append(int(stamp_ns))
        self.residuals = self.camera_residuals(images, q)
        cam = self.detector.update(self.residuals)
        if cam is None:
            return
        _, r, base = self.detector.events[-1]
        since = self._recent_stamps[0]  # the first of the `patience` high frames
        masked = self._reopen(cam, since)
        self.drift_events.append({"camera": cam, "residual": r, "baseline": base,
                                  "stamp_ns": since, "masked_frames": masked})
        self.drift = (f"{cam} drifted at {since} ns: held-out residual {r:.4f} vs baseline "
                      f"{base:.4f}; re-opened (masked {masked} older images, optimiser reset)")
        self._rejected_in_row = 0
        self.state = f"optimising (re-opened {cam} after drift)"

    def _reopen(self, camera: str, since_ns: int) -> int:
        """Mask `camera`'s images older than `since_ns`, reset the optimiser; returns count."""
        s = self.session
        masked = s.mask_camera(camera, since_ns)
        s.restart_optimiser()
        s.lr_scale = 1.0  # the camera may have moved far: full pose steps again
        self._dirty = True
        return masked

    # ------------------------------------------------------------------ internals
    def _build(self, intrinsics: dict[str, CameraIntrinsics]) -> None:
        from realsim_core.cli import enable_compilation_cache
        from realsim_core.rig import load_mjmodel

        enable_compilation_cache()  # the node process: same XLA cache as the CLI
        model = load_mjmodel(self.rig)
        gauss = rig_gaussians(model, self.n_gaussians, seed=self.cfg.seed,
                              near_bodies=mount_subtree_bodies(self.rig, model),
                              exclude_planes=self.cfg.textured_planes)
        s = CalibrationSession(self.rig, model, intrinsics, gauss, self.cfg,
                               max_frames=self.max_frames)
        s.set_start(dict(self._start.joint_offsets),
                    {n: c.pose for n, c in self._start.cameras.items()})
        self.session = s


#: estimator options besides CalibrationConfig's fields -> default (derived from the
#: signature, so the factory and the class cannot disagree)
OPTIONS = {n: p.default for n, p in inspect.signature(SessionEstimator).parameters.items()
           if p.default is not inspect.Parameter.empty and n != "config"}


def _config_from(options: dict) -> CalibrationConfig:
    names = {f.name for f in fields(CalibrationConfig)}
    cfg = {k: v for k, v in options.items() if k in names}
    for k, v in cfg.items():
        if isinstance(v, list):
            cfg[k] = tuple(v)
    return DEFAULT_CONFIG.replace(**cfg)


def make_estimator(rig, start: Calibration, **options) -> SessionEstimator:
    """Factory named by the node parameter `estimator`; `options` from `estimator_options`.

    Options: any `CalibrationConfig` field (e.g. `levels: [1]`, `warmup_colour_steps`,
    `colour_steps`, `pose_steps`, `batch_frames`, `seed`) and the keys of `OPTIONS`.
    Unknown names or bad values raise `RealsimError` with one line.
    """
    names = {f.name for f in fields(CalibrationConfig)}
    unknown = sorted(set(options) - names - set(OPTIONS))
    if unknown:
        raise RealsimError(f"unknown estimator option(s) {unknown}; known: "
                           f"{sorted(OPTIONS)} and CalibrationConfig fields {sorted(names)}")
    kw = {k: options.get(k, v) for k, v in OPTIONS.items()}
    for k, default in OPTIONS.items():
        v = kw[k]
        if isinstance(default, bool):
            ok = isinstance(v, bool)
        elif isinstance(default, int):
            ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
        else:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok:
            raise RealsimError(f"estimator option {k} = {v!r} is not a valid "
                               f"{type(default).__name__}")
    try:
        cfg = _config_from(options)
    except (TypeError, ValueError) as exc:
        raise RealsimError(f"bad estimator options: {exc}") from None
    if cfg.flat_colour_levels:
        raise RealsimError("estimator option flat_colour_levels is for the offline schedule "
                           "(realsim calibrate); the online engine runs textured levels only")
    if not cfg.levels or any(not isinstance(f, int) or f < 1 for f in cfg.levels):
        raise RealsimError(f"estimator option levels must be positive integers, got "
                           f"{list(cfg.levels)}")
    return SessionEstimator(rig, start, cfg, **kw)
