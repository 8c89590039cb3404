"""The online calibration loop without ROS: ingest -> sync -> keyframes -> estimator.

The ROS node (realsim_ros.calibration_node) converts messages to `ImageSample` /
`JointStateSample` and calls `OnlineCalibrator.add_image` / `add_joint_state` from its
callbacks (cheap: a lock and a list insert). A worker thread pops assembled `FrameSet`s,
feeds the `KeyframeBuffer` and the `Estimator`, and steps the estimator; every accepted
improvement bumps `version`, which the node polls to republish its outputs.

The engine plugs in through the `Estimator` protocol. Until it exists, `NominalEstimator`
answers the rig's nominal calibration and says so in its `state` (it never claims to
have calibrated anything).

`CalibrationStore` persists `calibration.yaml` in the node's output folder: atomic
writes, resume on start, and a corrupt file is refused and moved aside (never silently
overwritten) on the next save.

All stamps are integer nanoseconds; joint positions rad (m for the gripper slide).
"""

from __future__ import annotations

import glob
import logging
import math
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from realsim_core.calibration_io import (
    Calibration,
    CameraCalibration,
    read_calibration,
    write_calibration,
)
from realsim_core.errors import RealsimError
from realsim_core.sync import RESET, FrameAssembler, FrameSet, KeyframeBuffer
from realsim_core.types import CameraIntrinsics, ImageSample, JointStateSample

log = logging.getLogger(__name__)

CALIBRATION_FILE = "calibration.yaml"
ACCEPTED = "accepted"
# FrameAssembler counters an incoming image may raise (first match is reported)
_IMAGE_EVENTS = ("clock_resets", "rejected_duplicate_image", "rejected_out_of_order_image",
                 "dropped_late_image", "dropped_overflow")


# ------------------------------------------------------------------------- estimator


@runtime_checkable
class Estimator(Protocol):
    """What the online loop needs from a calibration engine (e.g. `CalibrationSession`).

    Every method is called from ONE worker thread (never from ROS callbacks), so an
    implementation needs no locking. `step` may take as long as one optimisation step
    takes; the loop checks for new frames between steps. An implementation may also define
    `request_stop()`: `OnlineCalibrator.stop` calls it from another thread so that a long
    `step` ends early when the node shuts down.
    """

    #: short human-readable state for /diagnostics, e.g. "optimising", "converged".
    state: str
    #: True once `estimate()` is a real calibration (not the nominal starting point).
    is_calibration: bool

    def reset(self, start: Calibration) -> None:
        """Forget all progress and restart from `start` (nominal or resumed calibration)."""

    def add_frame(
        self, frame: FrameSet, intrinsics: Mapping[str, CameraIntrinsics], keyframe: bool
    ) -> None:
        """Offer one assembled frame set.

        Args:
            frame: images (uint8 [H, W, 3] RGB) + joints ([J] rad, rig arm order).
            intrinsics: camera -> pinhole intrinsics valid for `frame`'s image sizes.
            keyframe: True if the `KeyframeBuffer` kept it (train on it); False frames
                may be used as held-out data (drift monitoring) or ignored.

        """

    def step(self) -> bool:
        """Run a bounded amount of optimisation; True if the estimate improved."""

    def estimate(self) -> Calibration:
        """The current best calibration (cameras in their mount frames, joint offsets)."""

    def metrics(self) -> dict[str, float]:
        """Scalars for /diagnostics (loss, residual per camera, steps/s, ...)."""


class NominalEstimator:
    """Stand-in until the engine exists: answers the starting calibration, never improves."""

    state = "nominal (engine not available)"
    is_calibration = False

    def __init__(self, start: Calibration) -> None:
        self._start = start
        self.frames_offered = 0

    def reset(self, start: Calibration) -> None:  # noqa: D102 (see Estimator)
        self._start = start

    def add_frame(self, frame, intrinsics, keyframe) -> None:  # noqa: D102
        self.frames_offered += 1

    def step(self) -> bool:  # noqa: D102
        return False

    def estimate(self) -> Calibration:  # noqa: D102
        return self._start

    def metrics(self) -> dict[str, float]:  # noqa: D102
        return {}


class DriftDetector:
    """Flags a camera whose held-out residual on NEW frames rose and stayed up (a bump).

    Feed it, for every new frame, the photometric residual of each camera under the
    accepted calibration (mean L1 in [0, 1]). Per camera it keeps a baseline, the median
    of the last `window` residuals judged normal; a residual above both
    `ratio * baseline` and `baseline + min_excess` is high. After `patience` high
    residuals in a row the camera has drifted: `update` returns it (the highest
    residual/baseline ratio wins when several qualify in the same frame), and that
    camera's history restarts, so a new baseline is learnt at the new pose.

    The threshold is relative because residuals differ a lot between cameras (a wrist
    camera sees a moving scene) and fall while the calibration improves; the absolute
    `min_excess` keeps noise on a near-perfect fit (baseline ~0) from counting.

    Args:
        ratio: residual / baseline above which a residual is high (> 1).
        min_excess: residual - baseline above which a residual is high (L1, 0-1 units).
        patience: consecutive high residuals that make a drift.
        window: residuals in the baseline median.
        min_history: residuals needed before a camera can be judged at all.

    """

    def __init__(self, ratio: float = 1.3, min_excess: float = 0.005, patience: int = 3,
                 window: int = 8, min_history: int = 5) -> None:
        if (ratio <= 1 or min_excess < 0 or patience < 1 or window < 1 or min_history < 1
                or min_history > window):
            raise RealsimError(
                f"DriftDetector: need ratio > 1, min_excess >= 0, patience/window/min_history"
                f" >= 1 and min_history <= window; got ratio {ratio}, min_excess {min_excess},"
                f" patience {patience}, window {window}, min_history {min_history}")
        self.ratio, self.min_excess = float(ratio), float(min_excess)
        self.patience, self.window, self.min_history = int(patience), int(window), int(min_history)
        self._history: dict[str, deque[float]] = {}
        self._high: dict[str, int] = {}
        self.events: list[tuple[str, float, float]] = []  # (camera, residual, baseline)
        self.last_ratio: dict[str, float] = {}

    def baseline(self, camera: str) -> float:
        """Median of the camera's normal residuals (nan before any)."""
        h = self._history.get(camera)
        return float(np.median(h)) if h else math.nan

    def reset(self, camera: str | None = None) -> None:
        """Forget the history of `camera` (all cameras when None)."""
        for c in ([camera] if camera is not None else list(self._history)):
            self._history.pop(c, None)
            self._high.pop(c, None)

    def update(self, residuals: Mapping[str, float]) -> str | None:
        """Residuals {camera: L1} of one new frame -> the camera that drifted, or None.

        Non-finite residuals (camera absent from the frame) are skipped.
        """
        candidates = []
        for cam, r in residuals.items():
            r = float(r)
            if not math.isfinite(r):
                continue
            hist = self._history.setdefault(cam, deque(maxlen=self.window))
            if len(hist) < self.min_history:
                hist.append(r)
                continue
            base = float(np.median(hist))
            self.last_ratio[cam] = r / base if base > 0 else math.inf
            if r > self.ratio * base and r > base + self.min_excess:
                self._high[cam] = self._high.get(cam, 0) + 1
                if self._high[cam] >= self.patience:
                    candidates.append((r / max(base, 1e-12), cam, r, base))
            else:
                self._high[cam] = 0
                hist.append(r)
        if not candidates:
            return None
        _, cam, r, base = max(candidates)
        self.events.append((cam, r, base))
        self.reset(cam)
        return cam


def nominal_calibration(rig) -> Calibration:
    """The rig file's nominal poses and zero joint offsets, as a `Calibration`.

    Args:
        rig: a `realsim_core.rig.Rig`.

    """
    cams = {
        c.name: CameraCalibration(c.mount, c.optical_frame, np.asarray(c.nominal, np.float64))
        for c in rig.cameras
    }
    return Calibration(cams, {j: 0.0 for j in rig.joint_names}, (), {"source": "nominal"})


def check_calibration(cal: Calibration, nominal: Calibration) -> str | None:
    """Why `cal` cannot replace `nominal` (None if it can).

    Checks: finite values, rotation parts orthonormal (1e-6), the same cameras (with the
    same parent/child frames) and joint offsets as the nominal.
    """
    if set(cal.cameras) != set(nominal.cameras):
        return (f"cameras {sorted(cal.cameras)} do not match the rig's "
                f"{sorted(nominal.cameras)}")
    for name, cam in cal.cameras.items():
        ref = nominal.cameras[name]
        if (cam.parent_frame, cam.child_frame) != (ref.parent_frame, ref.child_frame):
            return (f"camera {name}: frames {cam.parent_frame} -> {cam.child_frame}, rig has "
                    f"{ref.parent_frame} -> {ref.child_frame}")
        pose = np.asarray(cam.pose, np.float64)
        if pose.shape != (4, 4) or not np.all(np.isfinite(pose)):
            return f"camera {name}: pose is not a finite 4x4 matrix"
        rot = pose[:3, :3]
        if not np.allclose(rot @ rot.T, np.eye(3), atol=1e-6) or np.linalg.det(rot) < 0:
            return f"camera {name}: rotation is not orthonormal"
    if set(cal.joint_offsets) != set(nominal.joint_offsets):
        missing = sorted(set(nominal.joint_offsets) - set(cal.joint_offsets))
        extra = sorted(set(cal.joint_offsets) - set(nominal.joint_offsets))
        return f"joint offsets do not match the rig (missing {missing}, unknown {extra})"
    bad = [k for k, v in cal.joint_offsets.items() if not math.isfinite(v)]
    if bad:
        return f"non-finite joint offsets {bad}"
    return None


# ------------------------------------------------------------------------- persistence


class CalibrationStore:
    """`<output_dir>/calibration.yaml`: resume on start, atomic saves, corrupt files kept.

    Args:
        output_dir: folder (created on the first save; `~` expanded).

    """

    def __init__(self, output_dir: str | os.PathLike) -> None:
        self.dir = Path(os.path.expanduser(str(output_dir)))
        self.path = self.dir / CALIBRATION_FILE
        self.corrupt = False  # the file on disk was refused: move it aside before saving

    def load(self, nominal: Calibration) -> tuple[Calibration | None, str]:
        """Read the saved calibration if present.

        Returns:
            (calibration or None, one log line saying what happened; "" if no file).
            A file that cannot be read or does not fit the rig is refused (None) and
            marked `corrupt`.

        """
        self._remove_stale_temp_files()
        if not self.path.exists():
            return None, ""
        try:
            cal = read_calibration(self.path)
            why = check_calibration(cal, nominal)
        except (RealsimError, OSError, ValueError, TypeError) as exc:
            why = " ".join(str(exc).split())
        if why is not None:
            self.corrupt = True
            return None, (
                f"refusing saved calibration {self.path}: {why}; keeping the nominal "
                f"(the file will be moved aside before the next save)"
            )
        cal = replace(cal, metrics={**cal.metrics, "source": "resumed"})
        return cal, f"resumed calibration from {self.path}"

    def save(self, cal: Calibration) -> Path:
        """Write `cal` atomically (temp file + rename); returns the path written.

        A previously refused file is first renamed to `calibration.yaml.corrupt-<stamp>`.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.corrupt and self.path.exists():
            stamp = time.strftime("%Y%m%d-%H%M%S")
            aside = self.path.with_name(f"{CALIBRATION_FILE}.corrupt-{stamp}")
            os.replace(self.path, aside)
            log.warning("moved the refused calibration aside to %s", aside)
        self.corrupt = False
        write_calibration(self.path, cal)
        return self.path

    def _remove_stale_temp_files(self) -> None:
        """Temp files left by a process killed mid-save (never the real file)."""
        for tmp in glob.glob(str(self.dir / f".{CALIBRATION_FILE}.*.tmp")):
            try:
                os.unlink(tmp)
            except OSError:
                pass


# ------------------------------------------------------------------------- the loop


@dataclass(frozen=True)
class SyncOptions:
    """FrameAssembler / KeyframeBuffer settings (times in ms, distances in rad)."""

    image_tolerance_ms: float = 15.0
    joint_tolerance_ms: float = 50.0
    max_latency_ms: float = 500.0
    min_cameras: int = 1
    max_pending: int = 16
    joint_capacity: int = 1000
    keyframe_capacity: int = 32
    keyframe_min_joint_distance: float = 0.05
    keyframe_min_view_distance: float = 0.0  # 0 = views ignored
    queue_capacity: int = 8  # assembled sets waiting for the worker


class OnlineCalibrator:
    """Thread-safe front end (callbacks) + worker thread (keyframes, estimator).

    Args:
        cameras: camera names in assembler order.
        arms: arm -> joint names (unprefixed, rig order).
        nominal: the rig's nominal calibration (`nominal_calibration(rig)`).
        start: where to start (a resumed calibration) or None for the nominal.
        estimator_factory: builds the estimator from the start calibration; default
            `NominalEstimator`.
        options: sync and buffer settings.
        idle_wait_s: how long the worker sleeps when there is nothing to do.

    """

    def __init__(
        self,
        cameras: Sequence[str],
        arms: Mapping[str, Sequence[str]],
        nominal: Calibration,
        start: Calibration | None = None,
        estimator_factory: Callable[[Calibration], Estimator] | None = None,
        options: SyncOptions | None = None,
        idle_wait_s: float = 0.05,
    ) -> None:
        self.options = options or SyncOptions()
        o = self.options
        ms = 1_000_000
        self.assembler = FrameAssembler(
            list(cameras), {a: list(n) for a, n in arms.items()},
            int(o.image_tolerance_ms * ms), int(o.joint_tolerance_ms * ms),
            max_latency_ns=int(o.max_latency_ms * ms), min_cameras=o.min_cameras,
            max_pending=o.max_pending, joint_capacity=o.joint_capacity,
        )
        self.keyframes = KeyframeBuffer(
            o.keyframe_capacity, o.keyframe_min_joint_distance,
            o.keyframe_min_view_distance or None,
        )
        self.nominal = nominal
        self._start = start or nominal
        self._factory = estimator_factory or NominalEstimator
        self.estimator: Estimator = self._factory(self._start)
        self._lock = threading.Lock()  # assembler, intrinsics, masks, stats
        self._est_lock = threading.Lock()  # estimator + keyframes (worker vs reset)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._queue: deque[FrameSet] = deque()
        self._intrinsics: dict[str, CameraIntrinsics] = {}
        self._masks: dict[str, tuple[int, np.ndarray]] = {}
        self.stats: Counter[str] = Counter()
        self.frozen = False
        self.current: Calibration = self._start
        self.version = 0  # bumped on every accepted change of `current`
        self.idle_wait_s = idle_wait_s
        self._thread: threading.Thread | None = None
        self.worker_error = ""
        self._generation = 0  # bumped by reset(); the worker catches up before stepping
        self._worker_generation = 0

    # ------------------------------------------------------------ callbacks (cheap)
    def add_image(self, camera: str, sample: ImageSample) -> str:
        """One decoded image (uint8 [H, W, 3]) of `camera`.

        Returns "accepted", or the sync counter that this image raised (e.g.
        "rejected_duplicate_image", "dropped_late_image", "clock_resets").
        """
        with self._lock:
            stats = self.assembler.stats
            before = {k: stats[k] for k in _IMAGE_EVENTS}
            self.assembler.add_image(camera, sample)
            status = next((k for k in _IMAGE_EVENTS if stats[k] != before[k]), ACCEPTED)
        self._wake.set()
        return status

    def add_joint_state(self, arm: str, sample: JointStateSample) -> str:
        """One joint state of `arm`; returns the sync status (see `realsim_core.sync`)."""
        with self._lock:
            resets = self.assembler.stats["clock_resets"]
            status = self.assembler.add_joint_state(arm, sample)
            if self.assembler.stats["clock_resets"] != resets:
                status = RESET  # the assembler re-adds the sample after its reset
        self._wake.set()
        return status

    def set_intrinsics(self, camera: str, intr: CameraIntrinsics) -> None:
        """Intrinsics to hand the estimator with `camera`'s frames."""
        with self._lock:
            self._intrinsics[camera] = intr

    def add_mask(self, camera: str, stamp_ns: int, mask: np.ndarray) -> None:
        """Latest object mask (uint8 [H, W]) of `camera`; only the newest is kept."""
        with self._lock:
            self._masks[camera] = (int(stamp_ns), mask)
            self.stats["masks_received"] += 1

    def latest_mask(self, camera: str) -> tuple[int, np.ndarray] | None:
        """(stamp_ns, uint8 [H, W]) of the newest mask of `camera`, or None."""
        with self._lock:
            return self._masks.get(camera)

    # ------------------------------------------------------------ control
    def set_frozen(self, frozen: bool) -> None:
        """Stop (True) or resume (False) updating the estimate; outputs keep publishing."""
        self.frozen = bool(frozen)

    def reset(self) -> None:
        """Back to the nominal calibration; keyframes are kept, progress is dropped.

        Never waits for the worker (a step may take a minute while XLA compiles): the
        nominal is published at once, and the worker resets the estimator before its next
        step; whatever the step in flight produces is discarded.
        """
        with self._lock:
            self._generation += 1
            self._set_current(self.nominal)
        self._wake.set()

    def set_tolerances(self, image_ms: float | None = None, joint_ms: float | None = None,
                       max_latency_ms: float | None = None) -> None:
        """Change sync tolerances at run time (ms)."""
        with self._lock:
            a = self.assembler
            if image_ms is not None:
                a.image_tolerance_ns = int(image_ms * 1e6)
                a.set_timeout_ns = max(3 * a.image_tolerance_ns, 100_000_000)
            if joint_ms is not None:
                a.joint_tolerance_ns = int(joint_ms * 1e6)
                for b in a.buffers.values():
                    b.tolerance_ns = a.joint_tolerance_ns
            if max_latency_ms is not None:
                a.max_latency_ns = int(max_latency_ms * 1e6)

    def snapshot(self) -> dict[str, int]:
        """Counters for diagnostics: sync stats, keyframe stats, loop stats."""
        with self._lock:
            out = {f"sync/{k}": v for k, v in self.assembler.stats.items()}
            out["sync/pending"] = self.assembler.pending_count
            out.update({f"loop/{k}": v for k, v in self.stats.items()})
            out["loop/queue"] = len(self._queue)
        out.update({f"keyframes/{k}": v for k, v in self.keyframes.stats.items()})
        out["keyframes/kept"] = len(self.keyframes)
        return out

    # ------------------------------------------------------------ worker
    def start(self) -> None:
        """Start the worker thread (daemon)."""
        self._thread = threading.Thread(target=self._run, name="realsim-optimise", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Ask the worker to finish and wait for it.

        An estimator with a `request_stop()` method (optional, called from this thread) is
        told to cut its running step short. The wait matters: a process that exits while
        the worker is inside an XLA computation aborts ("FATAL: exception not rethrown").
        """
        self._stop.set()
        self._wake.set()
        request_stop = getattr(self.estimator, "request_stop", None)
        if callable(request_stop):
            request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("realsim worker still busy %.0f s after the stop request", timeout)

    def _set_current(self, cal: Calibration) -> None:
        self.current = cal
        self.version += 1

    def _drain(self) -> list[FrameSet]:
        with self._lock:
            ready = self.assembler.pop_ready()
            cap = max(1, self.options.queue_capacity)
            for f in ready:
                self._queue.append(f)
                if len(self._queue) > cap:
                    self._queue.popleft()
                    self.stats["dropped_worker_busy"] += 1
            taken = list(self._queue)
            self._queue.clear()
            intrinsics = dict(self._intrinsics)
        self._frame_intrinsics = intrinsics
        return taken

    def run_once(self) -> bool:
        """One iteration of the worker: frames -> keyframes/estimator -> one step.

        Returns True if anything was done. Public so tests can drive it without a thread.
        """
        frames = self._drain()
        did = bool(frames)
        with self._est_lock:
            generation = self._generation
            if generation != self._worker_generation:
                self.estimator.reset(self.nominal)
                self._worker_generation = generation
                self.worker_error = ""
            for f in frames:
                kept = self.keyframes.add(f)
                intr = {c: self._frame_intrinsics[c] for c in f.images
                        if c in self._frame_intrinsics}
                self.estimator.add_frame(f, intr, kept)
                self.stats["frames_offered"] += 1
            if self.frozen:
                return did
            improved = self.estimator.step()
            if improved:
                did = True
                cand = self.estimator.estimate()
                why = check_calibration(cand, self.nominal)
                if why is None:
                    with self._lock:
                        if generation != self._generation:
                            return did  # reset while stepping: this estimate is stale
                        self._set_current(cand)
                    self.stats["estimates_accepted"] += 1
                else:  # optimiser produced garbage: roll back to the last good estimate
                    self.stats["estimates_rejected"] += 1
                    self.worker_error = f"estimate rejected ({why}); rolled back"
                    self.estimator.reset(self.current)
        return did

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                did = self.run_once()
            except Exception as exc:  # keep the node alive; report it in diagnostics
                self.stats["worker_errors"] += 1
                self.worker_error = f"{type(exc).__name__}: {exc}"
                log.exception("realsim worker step failed")
                did = False
            if not did:
                self._wake.wait(self.idle_wait_s)
                self._wake.clear()
