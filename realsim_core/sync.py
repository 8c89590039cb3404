"""Time synchronisation of camera images and joint states, shared by the offline and online paths.

No ROS here (no message_filters): the ROS node converts messages to `ImageSample` /
`JointStateSample` and calls the same classes as `assemble_recording` does for bags.

- `JointStateBuffer`: per arm, a bounded, time-sorted buffer of joint positions with linear
  interpolation at any stamp.
- `FrameAssembler`: groups images of several cameras whose stamps lie within a tolerance
  of each other into `FrameSet`s and attaches every arm's interpolated joint positions.
- `KeyframeBuffer`: keeps a bounded, diverse subset of frame sets for calibration.
- `assemble_recording`: the offline path, a `Recording` through a `FrameAssembler`.

All stamps are integer nanoseconds (header stamps); joint positions are float64 [J] in
rad (m for fingers), in the order of the joint names given at construction.

Time is message time, never wall time: "timeouts" are measured by the newest stamp seen,
so offline runs are deterministic. The node may pass its clock to `pop_ready(now_ns)` so
that sets also come out while every input is silent.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import cv2
import numpy as np

from realsim_core.errors import RealsimError
from realsim_core.types import CameraIntrinsics, ImageSample, JointStateSample

MS = 1_000_000  # ns per millisecond

# JointStateBuffer.add() results
ACCEPTED = "accepted"
DUPLICATE = "duplicate"
# A loop shorter than the clock-jump threshold (a 0.5 s bag looping): stamps step back by
# less than the threshold but then KEEP arriving well behind the newest one (by more than
# the set timeout for images, the joint tolerance for joint states). That many in a row
# on one stream is a new timeline, not late arrivals.
LOOP_RUN_IMAGES = 3
LOOP_RUN_JOINTS = 10
RESET = "reset"  # accepted after clearing the buffer (clock jumped backwards)
REJECTED_NAMES = "rejected_names"
REJECTED_SIZE = "rejected_size"
REJECTED_NONFINITE = "rejected_nonfinite"


class JointStateBuffer:
    """Bounded, time-sorted joint positions of one arm, with linear interpolation.

    Args:
        joint_names: the arm's joints in the order `interpolate` returns them. Samples may
            name them in any order and may carry extra joints (ignored); a sample lacking
            any of them is rejected.
        capacity: samples kept; the oldest are dropped beyond it.
        tolerance_ns: how far outside the buffered time range `interpolate` still answers
            (with the first / last sample, no extrapolation).
        reset_threshold_ns: a stamp this much older than the newest one means the clock
            jumped back (bag looped, sim restarted): the buffer is cleared and restarts.
            Smaller backward steps are out-of-order arrivals and are inserted in place.
        max_gap_ns: `interpolate` returns None between two samples further apart than this
            (a dropout); None disables the check.

    """

    def __init__(
        self,
        joint_names: Sequence[str],
        capacity: int = 1000,
        tolerance_ns: int = 50 * MS,
        reset_threshold_ns: int = 1000 * MS,
        max_gap_ns: int | None = 1000 * MS,
    ) -> None:
        if not joint_names:
            raise RealsimError("JointStateBuffer needs at least one joint name")
        if len(set(joint_names)) != len(joint_names):
            raise RealsimError(f"JointStateBuffer: duplicate joint names in {list(joint_names)}")
        if capacity < 2:
            raise RealsimError(f"JointStateBuffer capacity must be >= 2, got {capacity}")
        self.joint_names = tuple(joint_names)
        self.capacity = int(capacity)
        self.tolerance_ns = int(tolerance_ns)
        self.reset_threshold_ns = int(reset_threshold_ns)
        self.max_gap_ns = None if max_gap_ns is None else int(max_gap_ns)
        self._stamps: list[int] = []
        self._positions: list[np.ndarray] = []
        self._behind = 0  # consecutive samples older than the newest (a short loop?)
        self.stats: Counter[str] = Counter()
        self.last_message = ""  # human-readable detail of the last non-accepted sample

    def __len__(self) -> int:
        return len(self._stamps)

    @property
    def earliest_ns(self) -> int | None:
        """Stamp of the oldest buffered sample (None when empty)."""
        return self._stamps[0] if self._stamps else None

    @property
    def latest_ns(self) -> int | None:
        """Stamp of the newest buffered sample (None when empty)."""
        return self._stamps[-1] if self._stamps else None

    def clear(self) -> None:
        """Forget every sample (stats are kept)."""
        self._stamps.clear()
        self._positions.clear()
        self._behind = 0

    def _select(self, sample: JointStateSample) -> tuple[str, np.ndarray | None]:
        position = np.asarray(sample.position, dtype=np.float64).reshape(-1)
        names = tuple(sample.names)
        if position.size != len(names):
            self.last_message = (
                f"joint state at {sample.stamp_ns} ns has {len(names)} names but "
                f"{position.size} positions"
            )
            return REJECTED_SIZE, None
        index = {}
        for i, n in enumerate(names):
            index.setdefault(n, i)
        missing = [n for n in self.joint_names if n not in index]
        if missing:
            self.last_message = (
                f"joint state at {sample.stamp_ns} ns lacks joints {missing} "
                f"(has {list(names)})"
            )
            return REJECTED_NAMES, None
        selected = position[[index[n] for n in self.joint_names]]
        if not np.all(np.isfinite(selected)):
            bad = [n for n, v in zip(self.joint_names, selected) if not np.isfinite(v)]
            self.last_message = f"joint state at {sample.stamp_ns} ns has non-finite {bad}"
            return REJECTED_NONFINITE, None
        return ACCEPTED, selected

    def add(self, sample: JointStateSample) -> str:
        """Buffer one sample; returns ACCEPTED, RESET, DUPLICATE or a REJECTED_* status.

        Details of anything not accepted are in `last_message`; counts in `stats`.
        """
        self.stats["received"] += 1
        status, selected = self._select(sample)
        if selected is None:
            self.stats[status] += 1
            return status
        stamp = int(sample.stamp_ns)
        result = ACCEPTED
        behind = self._stamps and stamp < self._stamps[-1] - self.tolerance_ns
        self._behind = self._behind + 1 if behind else 0
        if self._stamps and (stamp < self._stamps[-1] - self.reset_threshold_ns
                             or self._behind >= LOOP_RUN_JOINTS):
            self.last_message = (
                f"clock jumped back from {self._stamps[-1]} to {stamp} ns: buffer reset"
            )
            self._behind = 0
            self.clear()
            self.stats[RESET] += 1
            result = RESET
        i = bisect.bisect_left(self._stamps, stamp)
        if i < len(self._stamps) and self._stamps[i] == stamp:
            self.stats[DUPLICATE] += 1
            self.last_message = f"duplicate joint state stamp {stamp} ns ignored"
            return DUPLICATE
        self._stamps.insert(i, stamp)
        self._positions.insert(i, selected)
        if len(self._stamps) > self.capacity:
            del self._stamps[0]
            del self._positions[0]
        self.stats[ACCEPTED] += 1
        return result

    def interpolate(self, stamp_ns: int) -> np.ndarray | None:
        """Joint positions [J] (float64) at `stamp_ns`, linear between the bracketing samples.

        Within `tolerance_ns` outside the buffered range the first / last sample is
        returned; further out, across a gap longer than `max_gap_ns`, or when empty: None.
        """
        stamps = self._stamps
        if not stamps:
            return None
        t = int(stamp_ns)
        if t <= stamps[0]:
            return self._positions[0].copy() if stamps[0] - t <= self.tolerance_ns else None
        if t >= stamps[-1]:
            return self._positions[-1].copy() if t - stamps[-1] <= self.tolerance_ns else None
        i = bisect.bisect_right(stamps, t)
        t0, t1 = stamps[i - 1], stamps[i]
        if t == t0:
            return self._positions[i - 1].copy()
        if self.max_gap_ns is not None and t1 - t0 > self.max_gap_ns:
            return None
        w = (t - t0) / (t1 - t0)
        return (1.0 - w) * self._positions[i - 1] + w * self._positions[i]


@dataclass(frozen=True)
class FrameSet:
    """Images of several cameras taken at (nearly) the same time, plus joint positions.

    stamp_ns: the reference stamp: that of the first camera (in the assembler's camera
        order) present in the set; joints are interpolated there.
    images: camera name -> ImageSample (own stamps kept); cameras may be missing from a
        partial set.
    joints: arm name -> positions [J] float64 (rad, m for fingers), the arm's joint order.
    """

    stamp_ns: int
    images: dict[str, ImageSample] = field(default_factory=dict)
    joints: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class _Pending:
    images: dict[str, ImageSample]
    min_ns: int
    max_ns: int


class FrameAssembler:
    """Group images of several cameras into FrameSets and attach interpolated joints.

    An image joins a pending set lacking its camera if all stamps of the set then lie
    within `image_tolerance_ns` of each other; otherwise it starts a new set. A set is
    closed when every camera is in it, when every missing camera has already sent a later
    image, or when the newest stamp seen is `set_timeout_ns` past it (a silent camera:
    the set goes out partial if it has at least `min_cameras` images). A closed set is
    emitted once every arm has a joint state at or after its stamp (so positions are
    interpolated, not held), or, after `max_latency_ns`, with whatever is within
    `joint_tolerance_ns`; without usable joints it is dropped.

    Memory is bounded: at most `max_pending` open sets (the oldest is dropped beyond, also
    when nobody calls `pop_ready`) and `joint_capacity` samples per arm. Every drop and
    rejection is counted in `stats`.

    A stamp that jumps back by more than `clock_jump_ns` on one input stream (one camera,
    one arm), as when a bag loops or a simulation restarts, resets the whole assembler
    (pending sets and joint buffers) and counts `clock_resets`. Jumps are judged per
    stream, so a stream whose clock is offset from the others never triggers resets (its
    data just fails to sync, visible as drops). A loop shorter than `clock_jump_ns` is
    caught by its persistence instead: `LOOP_RUN_IMAGES` images of one camera (or
    `LOOP_RUN_JOINTS` joint states of one arm) in a row older than that stream's newest.
    A loop seen by N streams may count up to N resets and lose the few messages around
    the loop point.

    Args:
        cameras: camera names; the first present one gives a set its stamp.
        arms: arm name -> joint names, in the order of `FrameSet.joints[arm]`.
        image_tolerance_ns: max spread of image stamps within one set.
        joint_tolerance_ns: how far from the nearest joint state a set may be when
            the joints cannot be bracketed.

    """

    def __init__(
        self,
        cameras: Sequence[str],
        arms: Mapping[str, Sequence[str]],
        image_tolerance_ns: int = 15 * MS,
        joint_tolerance_ns: int = 50 * MS,
        *,
        set_timeout_ns: int | None = None,
        max_latency_ns: int = 500 * MS,
        min_cameras: int = 1,
        max_pending: int = 64,
        joint_capacity: int = 1000,
        clock_jump_ns: int = 1000 * MS,
        max_joint_gap_ns: int | None = 1000 * MS,
    ) -> None:
        if not cameras:
            raise RealsimError("FrameAssembler needs at least one camera")
        if len(set(cameras)) != len(cameras):
            raise RealsimError(f"FrameAssembler: duplicate camera names in {list(cameras)}")
        if not 1 <= min_cameras <= len(cameras):
            raise RealsimError(
                f"FrameAssembler: min_cameras must be in 1..{len(cameras)}, got {min_cameras}"
            )
        if max_pending < 1:
            raise RealsimError(f"FrameAssembler: max_pending must be >= 1, got {max_pending}")
        self.cameras = tuple(cameras)
        self.image_tolerance_ns = int(image_tolerance_ns)
        self.joint_tolerance_ns = int(joint_tolerance_ns)
        self.set_timeout_ns = (
            int(set_timeout_ns) if set_timeout_ns is not None
            else max(3 * self.image_tolerance_ns, 100 * MS)
        )
        self.max_latency_ns = int(max_latency_ns)
        self.min_cameras = int(min_cameras)
        self.max_pending = int(max_pending)
        self.clock_jump_ns = int(clock_jump_ns)
        self.buffers = {
            arm: JointStateBuffer(
                names, joint_capacity, joint_tolerance_ns, clock_jump_ns, max_joint_gap_ns
            )
            for arm, names in arms.items()
        }
        self.stats: Counter[str] = Counter()
        self.last_message = ""
        self._pending: list[_Pending] = []
        self._closed: deque[tuple[int, int, frozenset[str]]] = deque(maxlen=2 * max_pending)
        self._camera_last: dict[str, int] = {}
        self._camera_behind: dict[str, int] = {}  # consecutive images older than the last
        self._now: int | None = None

    # ------------------------------------------------------------------ inputs
    @property
    def pending_count(self) -> int:
        """Open sets (waiting for images or joints)."""
        return len(self._pending)

    def reset(self) -> None:
        """Drop pending sets and joint buffers; stats are kept."""
        self.stats["dropped_reset"] += len(self._pending)
        self._pending.clear()
        self._closed.clear()
        self._camera_last.clear()
        self._camera_behind.clear()
        self._now = None
        for buf in self.buffers.values():
            buf.clear()

    def _tick(self, stamp: int) -> None:
        self._now = stamp if self._now is None else max(self._now, stamp)

    def add_image(self, camera: str, sample: ImageSample) -> None:
        """Offer one decoded image of `camera` (stamp = its header stamp)."""
        if camera not in self.cameras:
            raise RealsimError(f"unknown camera {camera!r}; configured: {list(self.cameras)}")
        self.stats["images_received"] += 1
        t = int(sample.stamp_ns)
        last = self._camera_last.get(camera)
        behind = self._camera_behind[camera] = (
            self._camera_behind.get(camera, 0) + 1
            if last is not None and t < last - self.set_timeout_ns else 0)
        if last is not None and (t < last - self.clock_jump_ns or behind >= LOOP_RUN_IMAGES):
            self.last_message = f"clock jumped back from {last} to {t} ns on {camera}: reset"
            self.stats["clock_resets"] += 1
            self.reset()
            last = None
        if last is not None and t <= last:
            key = "rejected_duplicate_image" if t == last else "rejected_out_of_order_image"
            self.stats[key] += 1
            return
        self._camera_last[camera] = t
        self._tick(t)
        tol = self.image_tolerance_ns
        for lo, hi, cams in self._closed:
            if camera not in cams and max(hi, t) - min(lo, t) <= tol:
                self.stats["dropped_late_image"] += 1
                return
        best, best_d = None, None
        for p in self._pending:
            if camera in p.images or max(p.max_ns, t) - min(p.min_ns, t) > tol:
                continue
            d = abs(t - (p.min_ns + p.max_ns) // 2)
            if best_d is None or d < best_d:
                best, best_d = p, d
        if best is None:
            best = _Pending({}, t, t)
            self._pending.append(best)
            self.stats["sets_created"] += 1
            if len(self._pending) > self.max_pending:
                oldest = min(self._pending, key=lambda p: p.min_ns)
                self._pending.remove(oldest)
                self.stats["dropped_overflow"] += 1
                if oldest is best:
                    return
        best.images[camera] = sample
        best.min_ns, best.max_ns = min(best.min_ns, t), max(best.max_ns, t)

    def add_joint_state(self, arm: str, sample: JointStateSample) -> str:
        """Offer one joint state of `arm`; returns the buffer's status (see JointStateBuffer)."""
        buf = self.buffers.get(arm)
        if buf is None:
            raise RealsimError(f"unknown arm {arm!r}; configured: {list(self.buffers)}")
        self.stats["joint_states_received"] += 1
        t = int(sample.stamp_ns)
        status = buf.add(sample)
        if status == RESET:  # this arm's clock jumped back: restart everything
            self.last_message = f"{arm}: {buf.last_message}"
            self.stats["clock_resets"] += 1
            self.reset()
            status = buf.add(sample)
        if status in (ACCEPTED, RESET):
            self._tick(t)
        else:
            key = "joint_duplicate" if status == DUPLICATE else f"joint_{status}"
            self.stats[key] += 1
            self.last_message = f"{arm}: {buf.last_message}"
        return status

    # ------------------------------------------------------------------ outputs
    def _reference(self, p: _Pending) -> int:
        cam = next(c for c in self.cameras if c in p.images)
        return int(p.images[cam].stamp_ns)

    def _is_closed(self, p: _Pending, now: int, flush: bool) -> bool:
        if flush or len(p.images) == len(self.cameras) or now - p.min_ns > self.set_timeout_ns:
            return True
        for cam in self.cameras:
            if cam not in p.images:
                last = self._camera_last.get(cam)
                if last is None or last <= p.max_ns + self.image_tolerance_ns:
                    return False
        return True

    def _joints(self, stamp: int, now: int, flush: bool) -> dict[str, np.ndarray] | str:
        """Joints at stamp, or "wait", or "drop"."""
        joints = {}
        for arm, buf in self.buffers.items():
            latest = buf.latest_ns
            bracketed = latest is not None and latest >= stamp
            if not bracketed and not flush and now - stamp <= self.max_latency_ns:
                return "wait"
            q = buf.interpolate(stamp)
            if q is None:
                return "drop"
            joints[arm] = q
        return joints

    def _close(self, p: _Pending) -> None:
        self._pending.remove(p)
        self._closed.append((p.min_ns, p.max_ns, frozenset(p.images)))

    def pop_ready(self, now_ns: int | None = None, flush: bool = False) -> list[FrameSet]:
        """Take every set that is complete (or timed out) and has its joints, oldest first.

        Args:
            now_ns: current time (ns) from the caller's clock, advancing timeouts while
                inputs are silent; default: the newest stamp seen.
            flush: close and emit every pending set now (end of a recording); sets whose
                joints are not bracketed use the nearest sample within tolerance.

        """
        now = self._now if self._now is not None else 0
        if now_ns is not None:
            now = max(now, int(now_ns))
        out: list[FrameSet] = []
        for p in sorted(self._pending, key=lambda p: p.min_ns):
            if not self._is_closed(p, now, flush):
                continue
            if len(p.images) < self.min_cameras:
                self._close(p)
                self.stats["dropped_incomplete"] += 1
                continue
            stamp = self._reference(p)
            joints = self._joints(stamp, now, flush)
            if joints == "wait":
                continue
            self._close(p)
            if joints == "drop":
                self.stats["dropped_no_joints"] += 1
                continue
            self.stats["assembled"] += 1
            if len(p.images) < len(self.cameras):
                self.stats["partial_sets"] += 1
            images = {c: p.images[c] for c in self.cameras if c in p.images}
            out.append(FrameSet(stamp, images, joints))  # type: ignore[arg-type]
        return out

    def flush(self) -> list[FrameSet]:
        """Emit or drop every pending set (end of input)."""
        return self.pop_ready(flush=True)


# ---------------------------------------------------------------------- keyframes


def _thumbnail(rgb: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Grey thumbnail [h, w] float32 in [0, 1] of uint8 [H, W, 3] (or [H, W])."""
    img = np.asarray(rgb)
    grey = img.mean(axis=2) if img.ndim == 3 else img.astype(np.float32)
    return cv2.resize(grey.astype(np.float32), size, interpolation=cv2.INTER_AREA) / 255.0


class KeyframeBuffer:
    """A bounded, diverse set of FrameSets for calibration.

    Two frames differ by the normalised distance
    `d = max(joint_dist / min_joint_distance, view_dist / min_view_distance)`, where
    joint_dist is the Euclidean distance of all arms' positions (rad, m for fingers)
    concatenated, and view_dist (only when `min_view_distance` is set) is the mean absolute
    difference of grey thumbnails in [0, 1], averaged over the cameras both frames have.
    So a frame is new if the robot moved enough OR the view changed enough.

    A frame is accepted if d > 1 to every kept frame. When full, the most redundant kept
    frame (smallest nearest-neighbour distance; the lower slot of a tie) is replaced by the
    new one if the new one's nearest-neighbour distance to the rest is larger.

    Args:
        capacity: most frames kept.
        min_joint_distance: joint-space threshold (rad), > 0.
        min_view_distance: view threshold in [0, 1] grey levels; None ignores views.
        thumbnail_size: (width, height) of the view thumbnails.

    """

    def __init__(
        self,
        capacity: int,
        min_joint_distance: float,
        min_view_distance: float | None = None,
        thumbnail_size: tuple[int, int] = (16, 12),
    ) -> None:
        if capacity < 1:
            raise RealsimError(f"KeyframeBuffer capacity must be >= 1, got {capacity}")
        if not min_joint_distance > 0:
            raise RealsimError(
                f"KeyframeBuffer min_joint_distance must be > 0, got {min_joint_distance}"
            )
        if min_view_distance is not None and not min_view_distance > 0:
            raise RealsimError(
                f"KeyframeBuffer min_view_distance must be > 0, got {min_view_distance}"
            )
        self.capacity = int(capacity)
        self.min_joint_distance = float(min_joint_distance)
        self.min_view_distance = None if min_view_distance is None else float(min_view_distance)
        self.thumbnail_size = thumbnail_size
        self._frames: list[FrameSet] = []
        self._q: list[np.ndarray] = []
        self._thumbs: list[dict[str, np.ndarray]] = []
        self._arms: tuple[str, ...] | None = None
        self._dist = np.full((capacity, capacity), np.inf)  # normalised pairwise distances
        self.stats: Counter[str] = Counter()

    @property
    def frames(self) -> list[FrameSet]:
        """Kept frames (a copy of the list), in slot order."""
        return list(self._frames)

    def __len__(self) -> int:
        return len(self._frames)

    def _distances(self, q: np.ndarray, thumbs: dict[str, np.ndarray]) -> np.ndarray:
        """Normalised distances [N] from a candidate to every kept frame."""
        if not self._frames:
            return np.zeros(0)
        d = np.linalg.norm(np.stack(self._q) - q, axis=1) / self.min_joint_distance
        if self.min_view_distance is not None:
            for i, kept in enumerate(self._thumbs):
                common = [c for c in thumbs if c in kept]
                if common:
                    view = np.mean([np.abs(thumbs[c] - kept[c]).mean() for c in common])
                    d[i] = max(d[i], view / self.min_view_distance)
        return d

    def add(self, frame: FrameSet) -> bool:
        """Offer a frame; True if it was kept (added or replacing a redundant one)."""
        self.stats["offered"] += 1
        arms = tuple(sorted(frame.joints))
        if self._arms is None:
            self._arms = arms
        if arms != self._arms or not arms:
            self.stats["rejected_incomplete"] += 1
            return False
        q = np.concatenate([np.asarray(frame.joints[a], dtype=np.float64) for a in arms])
        if self._q and q.shape != self._q[0].shape:
            self.stats["rejected_incomplete"] += 1
            return False
        thumbs = (
            {c: _thumbnail(s.rgb, self.thumbnail_size) for c, s in frame.images.items()}
            if self.min_view_distance is not None else {}
        )
        d = self._distances(q, thumbs)
        if d.size and d.min() <= 1.0:
            self.stats["rejected_similar"] += 1
            return False
        n = len(self._frames)
        if n < self.capacity:
            self._frames.append(frame)
            self._q.append(q)
            self._thumbs.append(thumbs)
            self._dist[n, :n] = self._dist[:n, n] = d
            self.stats["accepted"] += 1
            return True
        nn = self._dist[:n, :n].min(axis=1)  # diagonal is inf
        victim = int(np.argmin(nn))  # argmin takes the lower slot of a tie
        rest = np.delete(d, victim)
        new_nn = rest.min() if rest.size else np.inf
        if new_nn <= nn[victim]:
            self.stats["rejected_not_diverse"] += 1
            return False
        self._frames[victim] = frame
        self._q[victim] = q
        self._thumbs[victim] = thumbs
        self._dist[victim, :n] = self._dist[:n, victim] = d
        self._dist[victim, victim] = np.inf
        self.stats["replaced"] += 1
        return True

    def min_pairwise_distance(self) -> float:
        """Smallest normalised distance between two kept frames (inf with fewer than 2)."""
        n = len(self._frames)
        return float(self._dist[:n, :n].min()) if n >= 2 else float("inf")

    def holdout(self, fraction: float, seed: int = 0) -> tuple[list[int], list[int]]:
        """Split `frames` indices into (train, holdout), deterministically.

        Each frame gets a pseudo-random key u in [0, 1) from (seed, its stamp) and is held
        out when u < fraction; if that leaves one side empty (N >= 2, 0 < fraction < 1),
        the frame with the smallest (or largest) key moves over. Keys depend on the frame,
        not its slot or the other frames, so online a frame never changes side while the
        buffer evolves (no train/holdout leakage); the holdout size is about fraction * N.
        Both lists are sorted.
        """
        if not 0.0 <= fraction <= 1.0:
            raise RealsimError(f"holdout fraction must be in [0, 1], got {fraction}")
        n = len(self._frames)
        keys = [self._holdout_key(seed, f.stamp_ns) for f in self._frames]
        held = {i for i in range(n) if keys[i] < fraction}
        if n >= 2 and 0.0 < fraction < 1.0:
            if not held:
                held = {min(range(n), key=lambda i: keys[i])}
            elif len(held) == n:
                held.discard(max(range(n), key=lambda i: keys[i]))
        return [i for i in range(n) if i not in held], sorted(held)

    @staticmethod
    def _holdout_key(seed: int, stamp_ns: int) -> float:
        digest = hashlib.blake2b(f"{seed}:{stamp_ns}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") / 2.0**64


# ---------------------------------------------------------------------- offline path


def _pick_intrinsics(
    infos: list[tuple[int, CameraIntrinsics]], images: list[ImageSample], stats: Counter[str]
) -> CameraIntrinsics:
    counts = Counter(k for _, k in infos)
    intr = counts.most_common(1)[0][0]
    if len(counts) > 1:
        stats["camera_info_changes"] += 1
    if images:
        h, w = images[0].rgb.shape[:2]
        if (w, h) != (intr.width, intr.height):
            intr = intr.scaled(w, h)
            stats["camera_info_rescaled"] += 1
    return intr


def assemble_recording(
    rec: object,
    cameras: Mapping[str, tuple[str, str | None]],
    arms: Mapping[str, tuple[str, Sequence[str]]],
    image_tolerance_ns: int = 15 * MS,
    joint_tolerance_ns: int = 50 * MS,
    **assembler_options: object,
) -> tuple[list[FrameSet], dict[str, CameraIntrinsics], dict[str, int]]:
    """Synchronise a `Recording` (from `read_bag`) into FrameSets, like the node does live.

    Messages are replayed in header-stamp order (joint states before images of equal
    stamp) through a `FrameAssembler`, which is flushed at the end.

    Args:
        rec: a `realsim_core.bag.Recording`.
        cameras: camera name -> (image topic, camera_info topic or None).
        arms: arm name -> (joint state topic, joint names in output order).
        image_tolerance_ns: see `FrameAssembler`.
        joint_tolerance_ns: see `FrameAssembler`.
        **assembler_options: further `FrameAssembler` keyword options.

    Returns:
        (frame sets sorted by stamp, camera -> intrinsics for cameras with camera_info
        (the most frequent one, rescaled to the image size if that differs), stats
        counters of the assembler plus `cameras_without_info`).

    Raises:
        RealsimError: a camera's image topic or an arm's joint state topic is not in the
            recording (or has no messages).

    """
    images_by_topic = {**rec.images, **rec.masks}  # type: ignore[attr-defined]
    stats: Counter[str] = Counter()
    intrinsics: dict[str, CameraIntrinsics] = {}
    events: list[tuple[int, int, str, object]] = []
    for cam, (image_topic, info_topic) in cameras.items():
        samples = rec.images.get(image_topic)  # type: ignore[attr-defined]
        if not samples:
            known = sorted(images_by_topic) or ["none"]
            raise RealsimError(
                f"camera {cam}: image topic {image_topic} has no images in the recording "
                f"(image topics: {', '.join(known)})"
            )
        infos = rec.camera_infos.get(info_topic) if info_topic else None  # type: ignore[attr-defined]
        if infos:
            intrinsics[cam] = _pick_intrinsics(infos, samples, stats)
        else:
            stats["cameras_without_info"] += 1
        events.extend((s.stamp_ns, 1, cam, s) for s in samples)
    for arm, (topic, _names) in arms.items():
        samples = rec.joint_states.get(topic)  # type: ignore[attr-defined]
        if not samples:
            known = sorted(rec.joint_states) or ["none"]  # type: ignore[attr-defined]
            raise RealsimError(
                f"arm {arm}: joint state topic {topic} has no messages in the recording "
                f"(joint state topics: {', '.join(known)})"
            )
        events.extend((s.stamp_ns, 0, arm, s) for s in samples)
    events.sort(key=lambda e: (e[0], e[1]))

    assembler = FrameAssembler(
        list(cameras),
        {arm: list(names) for arm, (_topic, names) in arms.items()},
        image_tolerance_ns,
        joint_tolerance_ns,
        **assembler_options,  # type: ignore[arg-type]
    )
    frames: list[FrameSet] = []
    for i, (_t, kind, name, sample) in enumerate(events):
        if kind == 0:
            assembler.add_joint_state(name, sample)  # type: ignore[arg-type]
        else:
            assembler.add_image(name, sample)  # type: ignore[arg-type]
        if i % 16 == 15:
            frames.extend(assembler.pop_ready())
    frames.extend(assembler.flush())
    frames.sort(key=lambda f: f.stamp_ns)
    stats.update(assembler.stats)
    return frames, intrinsics, dict(stats)
