"""Drift and the online loop without ROS.

Residual sequences -> drift flag and camera (DriftDetector); the engine adapter re-opening
a bumped camera (SessionEstimator on frames rendered by our renderer); the online loop's
reset never waiting for a busy worker.
"""

from __future__ import annotations

import threading

import jax.numpy as jnp
import numpy as np
import pytest

from realsim_core.errors import RealsimError
from realsim_core.online import DriftDetector

CAMS = ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist")


def _feed(det, rows):
    """Feed residual rows; returns [(index, camera)] of every drift flagged."""
    out = []
    for i, row in enumerate(rows):
        cam = det.update(dict(zip(CAMS, row)))
        if cam is not None:
            out.append((i, cam))
    return out


def _noisy(n, level=(0.05, 0.06, 0.12, 0.10), noise=0.003, seed=0):
    rng = np.random.default_rng(seed)
    return [np.asarray(level) + rng.normal(0, noise, 4) for _ in range(n)]


def test_steady_and_slowly_improving_residuals_never_drift():
    assert _feed(DriftDetector(), _noisy(200)) == []
    improving = [np.asarray([0.12, 0.1, 0.2, 0.2]) * (1 - 0.004 * i) for i in range(200)]
    assert _feed(DriftDetector(), improving) == []


def test_a_bumped_camera_is_flagged_after_patience_and_relearns():
    rows = _noisy(30)
    for r in rows[12:]:
        r[1] += 0.05  # cam_low bumped at frame 12: its residual doubles and stays up
    det = DriftDetector(patience=3)
    assert _feed(det, rows) == [(14, "cam_low")]
    cam, residual, baseline = det.events[0]
    assert cam == "cam_low" and residual > 1.3 * baseline
    # after the flag the camera's baseline is learnt again at the new level
    assert det.baseline("cam_low") == pytest.approx(0.11, abs=0.01)


def test_single_spikes_and_tiny_absolute_rises_do_not_count():
    rows = _noisy(40)
    for i in (10, 20, 21, 30):  # isolated spikes shorter than patience
        rows[i][0] += 0.1
    assert _feed(DriftDetector(patience=3), rows) == []
    tiny = [np.asarray([1e-4, 1e-4, 1e-4, 1e-4]) * (1 if i < 10 else 5) for i in range(30)]
    assert _feed(DriftDetector(min_excess=0.005), tiny) == []  # 5x, but 0.0004 absolute


def test_the_camera_with_the_larger_relative_rise_is_chosen():
    rows = _noisy(20, noise=0.0)
    for r in rows[10:]:
        r[0] *= 1.5  # cam_high +50 %
        r[2] *= 3.0  # cam_left_wrist x3: this one moved
    assert _feed(DriftDetector(patience=2), rows)[0] == (11, "cam_left_wrist")


def test_missing_cameras_are_skipped_and_bad_settings_refused():
    det = DriftDetector()
    for _ in range(10):
        assert det.update({"cam_high": 0.05, "cam_low": float("nan")}) is None
    assert det.baseline("cam_high") == pytest.approx(0.05)
    assert np.isnan(det.baseline("cam_low"))
    with pytest.raises(RealsimError, match="ratio > 1"):
        DriftDetector(ratio=0.9)
    with pytest.raises(RealsimError, match="min_history <= window"):
        DriftDetector(window=4, min_history=5)  # could never judge


def test_no_judgement_before_min_history_normal_residuals():
    det = DriftDetector(min_history=5, patience=1)
    rows = [np.asarray([0.05, 0.06, 0.12, 0.10])] * 4 + [np.asarray([0.05, 0.06, 0.5, 0.10])]
    assert _feed(det, rows) == []  # the 5th residual still builds the baseline
    assert _feed(det, [np.asarray([0.05, 0.06, 0.5, 0.10])]) == [(0, "cam_left_wrist")]


# ------------------------------------------------------------------ the engine adapter


W, H = 80, 45             # the known-answer problems' size (tests/test_calibration.py):
N_GAUSS = 2500            # same shapes and config, so the XLA cache serves both
N_FRAMES = 4


def _frame(rig, q, imgs, k):
    from realsim_core.sync import FrameSet
    from realsim_core.types import ImageSample

    n = len(rig.arms[0].ros_joint_names)
    return FrameSet(stamp_ns=k, images={c: ImageSample(k, im) for c, im in imgs.items()},
                    joints={a.name: np.asarray(q[i * n:(i + 1) * n])
                            for i, a in enumerate(rig.arms)})


def test_engine_flags_a_bumped_camera_and_reopens_it():
    from realsim_core import calibration as C
    from realsim_core.online import nominal_calibration
    from realsim_core.online_engine import SessionEstimator
    from realsim_core.rig import load_mjmodel, load_rig
    from realsim_core.types import CameraIntrinsics

    rig = load_rig("builtin:aloha2")
    model = load_mjmodel(rig)
    intr = {c: CameraIntrinsics(W, H, 0.9 * W, 0.9 * W, (W - 1) / 2, (H - 1) / 2)
            for c in rig.camera_names}
    cfg = C.CalibrationConfig(levels=(1,), cycles_per_level=(18,), warmup_colour_steps=0,
                              colour_steps=0, pose_steps=4, batch_frames=N_FRAMES,
                              holdout_fraction=0.0, lr_camera=3e-3, lr_joint=3e-3,
                              init_colours=False, prior_weight=1e-3)
    est = SessionEstimator(rig, nominal_calibration(rig), config=cfg, max_frames=N_FRAMES,
                           min_frames=N_FRAMES, n_gaussians=N_GAUSS, accept_every=2,
                           holdout_every=10**6, drift_patience=3, drift_min_history=5)
    n_early, n_normal = 2, 5  # frames before the first acceptance test; normal frames after
    rng = np.random.default_rng(1)
    J = len(rig.joint_names)
    qs = [rng.uniform(-0.3, 0.3, J) * np.r_[np.ones(6), 0.05, np.ones(6), 0.05]
          + np.r_[0, -0.6, 0.6, 0, 0.5, 0, 0.02, 0, -0.6, 0.6, 0, 0.5, 0, 0.02]
          for _ in range(N_FRAMES + n_early + n_normal + 4)]
    # targets by a reference session with the estimator's shapes and initial appearance:
    # the nominal scene (the estimate's start), then cam_low bumped 15 mm / ~1.6 deg
    gauss = C.rig_gaussians(model, N_GAUSS, seed=0,
                            near_bodies=C.mount_subtree_bodies(rig, model))
    ref = C.CalibrationSession(rig, model, intr, gauss, cfg, max_frames=N_FRAMES)
    truth = dict(ref.params)
    bumped = dict(truth)
    ci = [c.name for c in rig.fixed_cameras].index("cam_low")
    delta = np.zeros((len(rig.fixed_cameras), 6), np.float32)
    delta[ci] = [0.009, -0.012, 0.0, 0.02, 0.0, -0.02]
    bumped["fixed_deltas"] = jnp.asarray(delta)

    def render(q, params):
        imgs = C.render_batch(ref.static, params, jnp.asarray(q, jnp.float32)[None],
                              jnp.zeros((1, J), jnp.float32), 0)
        return {c: np.asarray(np.clip(np.asarray(im[0]) * 255, 0, 255), np.uint8)
                for c, im in zip(ref.cameras, imgs)}

    for k in range(N_FRAMES):
        est.add_frame(_frame(rig, qs[k], render(qs[k], truth), k), intr, keyframe=True)
    s = est.session
    est.step()  # starts the session (compiles), one cycle, no acceptance test yet
    # frames before the first acceptance test are not judged, even bumped ones: the
    # appearance is not fitted yet, so a high residual says nothing about the pose
    for k in range(N_FRAMES, N_FRAMES + n_early):
        est.add_frame(_frame(rig, qs[k], render(qs[k], bumped), 100 + k), intr, keyframe=True)
    assert est.residuals == {} and np.isnan(est.detector.baseline("cam_low"))
    est.step()  # the first acceptance test: from now on new frames are judged
    assert est.drift == ""
    flagged_at = None
    first = N_FRAMES + n_early
    for k in range(first, len(qs)):
        params = truth if k < first + n_normal else bumped  # baseline frames, then the bump
        est.add_frame(_frame(rig, qs[k], render(qs[k], params), 100 + k), intr,
                      keyframe=True)
        if est.drift and flagged_at is None:
            flagged_at = k
    # judged from the 6th frame on (5 make the baseline), flagged after 3 high in a row
    assert flagged_at == first + n_normal + 2, (flagged_at, est.residuals, est.detector.events)
    (event,) = est.drift_events
    assert event["camera"] == "cam_low" and event["stamp_ns"] == 100 + first + n_normal
    assert event["masked_frames"] >= 1 and "cam_low drifted" in est.drift
    # cam_low's images from before the bump are out of the buffer; the others stay
    valid = np.asarray(s.bufs.valid)
    cams = list(s.cameras)
    for slot, stamp in enumerate(s.stamps):
        assert valid[slot, cams.index("cam_high")] == 1.0
        assert valid[slot, cams.index("cam_low")] == (1.0 if stamp >= event["stamp_ns"] else 0.0)
    assert "re-opened cam_low" in est.state
    assert s.lr_scale == 1.0  # full pose steps again for the re-opened camera
    assert est.metrics()["drift_events"] == 1.0


def test_make_estimator_refuses_unknown_and_bad_options():
    from realsim_core.online import nominal_calibration
    from realsim_core.online_engine import make_estimator
    from realsim_core.rig import load_rig

    rig = load_rig("builtin:aloha2", check_model=False)
    start = nominal_calibration(rig)
    with pytest.raises(RealsimError, match="unknown estimator option"):
        make_estimator(rig, start, bogus=1)
    with pytest.raises(RealsimError, match="max_frames"):
        make_estimator(rig, start, max_frames=0)
    with pytest.raises(RealsimError, match="levels"):
        make_estimator(rig, start, levels=[0])
    with pytest.raises(RealsimError, match="flat_colour_levels is for the offline"):
        make_estimator(rig, start, flat_colour_levels=1)
    with pytest.raises(RealsimError, match="flat_fixed_cameras"):
        make_estimator(rig, start, flat_fixed_cameras="bogus")
    est = make_estimator(rig, start, levels=[1], n_gaussians=100, drift=False)
    assert est.cfg.levels == (1,) and est.n_gaussians == 100 and not est.drift_enabled


def test_estimator_without_textured_planes_keeps_the_floor_and_table_as_surfels():
    """`textured_planes: false` must not also drop the planes' surfels (no table at all)."""
    from realsim_core.online import nominal_calibration
    from realsim_core.online_engine import make_estimator
    from realsim_core.rig import intrinsics_from_fovy, load_rig

    rig = load_rig("builtin:aloha2")
    start = nominal_calibration(rig)
    intr = {c.name: intrinsics_from_fovy(64, 36, 58.0) for c in rig.cameras}
    on_world = {}
    for planes in (True, False):
        est = make_estimator(rig, start, levels=[1], n_gaussians=2000, drift=False,
                             textured_planes=planes)
        est._build(intr)
        assert (est.session.static.planes is None) == (not planes)
        on_world[planes] = int((np.asarray(est.session.static.gauss.body) == 0).sum())
    assert on_world[True] == 0          # the floor is a textured plane
    assert on_world[False] > 0          # the floor is surfels again


# ------------------------------------------------------------------ the online loop


class _SlowEstimator:
    """Blocks in step() until released (a step while XLA compiles)."""

    state = "compiling"
    is_calibration = True

    def __init__(self, start):
        self.start, self.resets = start, []
        self.entered, self.release = threading.Event(), threading.Event()

    def reset(self, start):
        self.resets.append(start)

    def add_frame(self, frame, intrinsics, keyframe):
        pass

    def step(self):
        self.entered.set()
        self.release.wait(30)
        return True

    def estimate(self):
        offs = {k: 0.01 for k in self.start.joint_offsets}
        return type(self.start)(self.start.cameras, offs, (), {})

    def metrics(self):
        return {}


def test_reset_does_not_wait_for_a_busy_worker_and_drops_its_result():
    from realsim_core.online import OnlineCalibrator, nominal_calibration
    from realsim_core.rig import load_rig

    rig = load_rig("builtin:aloha2", check_model=False)
    nominal = nominal_calibration(rig)
    cal = OnlineCalibrator(rig.camera_names, {a.name: a.ros_joint_names for a in rig.arms},
                           nominal, estimator_factory=_SlowEstimator)
    worker = threading.Thread(target=cal.run_once)
    worker.start()
    assert cal.estimator.entered.wait(30)
    cal.reset()  # returns while the worker is inside step()
    assert worker.is_alive() and cal.current is nominal and cal.version == 1
    cal.estimator.release.set()
    worker.join(30)
    assert cal.current is nominal and cal.version == 1  # the stale improvement is dropped
    cal.run_once()  # the worker catches up: estimator reset to nominal, then steps again
    assert cal.estimator.resets == [nominal]
    assert cal.version == 2 and cal.current.joint_offsets["follower_left/waist"] == 0.01
