"""Time sync: joint interpolation, frame assembly, keyframe selection, the offline path."""

from __future__ import annotations

import numpy as np
import pytest

from realsim_core.bag import BagWriter, Recording, read_bag
from realsim_core.errors import RealsimError
from realsim_core.sync import (
    ACCEPTED,
    DUPLICATE,
    MS,
    REJECTED_NAMES,
    REJECTED_NONFINITE,
    REJECTED_SIZE,
    RESET,
    FrameAssembler,
    FrameSet,
    JointStateBuffer,
    KeyframeBuffer,
    assemble_recording,
)
from realsim_core.types import CameraIntrinsics, ImageSample, JointStateSample

NAMES = ("waist", "shoulder", "elbow")
T0 = 1_000_000_000_000  # ns
# Linear interpolation of sin(w t) sampled every dt errs by at most w^2 dt^2 / 8.
OMEGA, JS_DT = 2.0, 20 * MS  # rad/s, ns


def _js(t: int, pos, names=NAMES) -> JointStateSample:
    return JointStateSample(t, tuple(names), np.asarray(pos, dtype=np.float64))


def _img(t: int, value: int = 0, shape=(6, 8)) -> ImageSample:
    return ImageSample(t, np.full((*shape, 3), value, np.uint8))


def _truth(t_ns: int) -> np.ndarray:
    s = (t_ns - T0) * 1e-9
    return np.array([np.sin(OMEGA * s), 0.5 * s, -0.25])


# ---------------------------------------------------------------- JointStateBuffer


def test_interpolation_linear_exact_and_sin_bounded():
    buf = JointStateBuffer(NAMES)
    for i in range(100):
        t = T0 + i * JS_DT
        assert buf.add(_js(t, _truth(t))) == ACCEPTED
    # The linear joint is reproduced exactly, the sine within the chord error bound.
    bound = OMEGA**2 * (JS_DT * 1e-9) ** 2 / 8
    errors = []
    for t in np.linspace(T0, T0 + 99 * JS_DT, 997).astype(np.int64):
        q = buf.interpolate(int(t))
        assert q.shape == (3,) and q.dtype == np.float64
        np.testing.assert_allclose(q[1:], _truth(int(t))[1:], atol=1e-12)
        errors.append(abs(q[0] - _truth(int(t))[0]))
    assert max(errors) <= bound + 1e-12
    assert max(errors) > bound / 10  # the check is not vacuous
    # Midpoint of two samples of a linear joint: exact average.
    np.testing.assert_allclose(buf.interpolate(T0 + JS_DT // 2)[1], 0.5 * 0.01)


def test_interpolation_range_tolerance_and_gap():
    buf = JointStateBuffer(NAMES, tolerance_ns=10 * MS, max_gap_ns=100 * MS)
    assert buf.interpolate(T0) is None  # empty
    buf.add(_js(T0, [1.0, 2.0, 3.0]))
    buf.add(_js(T0 + 50 * MS, [2.0, 2.0, 3.0]))
    buf.add(_js(T0 + 500 * MS, [9.0, 2.0, 3.0]))
    assert buf.interpolate(T0 - 10 * MS)[0] == 1.0  # held within tolerance, no extrapolation
    assert buf.interpolate(T0 - 11 * MS) is None
    assert buf.interpolate(T0 + 510 * MS)[0] == 9.0
    assert buf.interpolate(T0 + 511 * MS) is None
    assert buf.interpolate(T0 + 25 * MS)[0] == pytest.approx(1.5)
    assert buf.interpolate(T0 + 200 * MS) is None  # inside a 450 ms dropout
    assert buf.interpolate(T0 + 500 * MS)[0] == 9.0


def test_names_reordered_subset_and_missing():
    buf = JointStateBuffer(NAMES)
    # permutation plus an extra joint: reordered by name, extra ignored
    st = buf.add(_js(T0, [30.0, 99.0, 10.0, 20.0], ("elbow", "gripper", "waist", "shoulder")))
    assert st == ACCEPTED
    np.testing.assert_array_equal(buf.interpolate(T0), [10.0, 20.0, 30.0])
    # fewer names than expected: rejected with a reason naming the missing joint
    assert buf.add(_js(T0 + MS, [1.0, 2.0], ("waist", "shoulder"))) == REJECTED_NAMES
    assert "['elbow']" in buf.last_message
    assert buf.add(_js(T0 + MS, [1.0, 2.0, 3.0], ("a", "b", "c"))) == REJECTED_NAMES
    assert buf.add(_js(T0 + MS, [1.0, 2.0], NAMES)) == REJECTED_SIZE
    assert len(buf) == 1
    assert buf.stats[REJECTED_NAMES] == 2 and buf.stats[REJECTED_SIZE] == 1


def test_nan_and_inf_rejected_but_nan_in_ignored_joint_ok():
    buf = JointStateBuffer(NAMES)
    assert buf.add(_js(T0, [np.nan, 0.0, 0.0])) == REJECTED_NONFINITE
    assert "waist" in buf.last_message
    assert buf.add(_js(T0, [0.0, np.inf, 0.0])) == REJECTED_NONFINITE
    assert buf.add(_js(T0, [0.0, 1.0, 2.0, np.nan], (*NAMES, "gripper"))) == ACCEPTED
    assert len(buf) == 1 and buf.stats[REJECTED_NONFINITE] == 2
    assert np.all(np.isfinite(buf.interpolate(T0)))


def test_duplicates_out_of_order_and_backwards_clock():
    buf = JointStateBuffer(NAMES, reset_threshold_ns=1000 * MS)
    buf.add(_js(T0, [0.0, 0.0, 0.0]))
    buf.add(_js(T0 + 20 * MS, [2.0, 0.0, 0.0]))
    assert buf.add(_js(T0 + 20 * MS, [7.0, 0.0, 0.0])) == DUPLICATE
    assert buf.interpolate(T0 + 20 * MS)[0] == 2.0  # the first one is kept
    # A small step back is a late arrival: inserted in order.
    assert buf.add(_js(T0 + 10 * MS, [5.0, 0.0, 0.0])) == ACCEPTED
    assert buf.interpolate(T0 + 15 * MS)[0] == pytest.approx(3.5)
    # A big step back is a clock jump (bag loop): everything before is forgotten.
    assert buf.add(_js(T0 - 5000 * MS, [1.0, 1.0, 1.0])) == RESET
    assert len(buf) == 1 and buf.earliest_ns == T0 - 5000 * MS
    assert buf.interpolate(T0 + 15 * MS) is None
    assert buf.stats[RESET] == 1 and buf.stats[DUPLICATE] == 1


def test_buffer_capacity_bounded():
    buf = JointStateBuffer(NAMES, capacity=50)
    for i in range(1000):
        buf.add(_js(T0 + i * MS, [i, 0.0, 0.0]))
    assert len(buf) == 50
    assert buf.earliest_ns == T0 + 950 * MS and buf.latest_ns == T0 + 999 * MS


# ---------------------------------------------------------------- FrameAssembler

CAMS = ["cam_high", "cam_low", "cam_left_wrist"]


def _assembler(**kw) -> FrameAssembler:
    return FrameAssembler(CAMS, {"left": list(NAMES)}, 10 * MS, 50 * MS, **kw)


def _feed_joints(fa: FrameAssembler, t_from: int, t_to: int, arm: str = "left") -> None:
    for t in range(t_from, t_to + 1, JS_DT):
        fa.add_joint_state(arm, _js(t, _truth(t)))


def test_sets_group_images_and_interpolate_joints():
    fa = _assembler()
    _feed_joints(fa, T0, T0 + 100 * MS)
    # cam_low arrives first but cam_high (first listed) gives the reference stamp.
    fa.add_image("cam_low", _img(T0 + 48 * MS, 2))
    fa.add_image("cam_high", _img(T0 + 50 * MS, 1))
    fa.add_image("cam_left_wrist", _img(T0 + 57 * MS, 3))
    fa.add_image("cam_high", _img(T0 + 83 * MS, 4))
    out = fa.pop_ready()
    assert len(out) == 1
    fs = out[0]
    assert fs.stamp_ns == T0 + 50 * MS
    assert list(fs.images) == CAMS
    assert [s.stamp_ns for s in fs.images.values()] == [T0 + 50 * MS, T0 + 48 * MS, T0 + 57 * MS]
    bound = OMEGA**2 * (JS_DT * 1e-9) ** 2 / 8
    assert np.max(np.abs(fs.joints["left"] - _truth(T0 + 50 * MS))) <= bound
    assert fa.stats["assembled"] == 1 and fa.pending_count == 1
    # an image 11 ms from the set's spread does not join it
    fa.add_image("cam_low", _img(T0 + 94 * MS))
    assert fa.pending_count == 2


def test_set_waits_for_joint_state_after_its_stamp():
    fa = _assembler(max_latency_ns=300 * MS)
    _feed_joints(fa, T0, T0 + 100 * MS)
    for cam in CAMS:
        fa.add_image(cam, _img(T0 + 110 * MS))
    assert fa.pop_ready() == []  # joints end at T0+100ms: not bracketed yet
    fa.add_joint_state("left", _js(T0 + 120 * MS, _truth(T0 + 120 * MS)))
    out = fa.pop_ready()
    assert len(out) == 1
    np.testing.assert_allclose(
        out[0].joints["left"], (_truth(T0 + 100 * MS) + _truth(T0 + 120 * MS)) / 2)


def test_joint_latency_expiry_uses_nearest_within_tolerance_or_drops():
    fa = _assembler(max_latency_ns=300 * MS)
    _feed_joints(fa, T0, T0 + 100 * MS)
    for cam in CAMS:
        fa.add_image(cam, _img(T0 + 130 * MS))
    for cam in CAMS:
        fa.add_image(cam, _img(T0 + 400 * MS))  # joints silent: both sets wait
    assert fa.pop_ready() == []
    out = fa.pop_ready(now_ns=T0 + 440 * MS)  # latency of the first set has passed
    # 30 ms after the last joint state: within the 50 ms tolerance, held value.
    assert [f.stamp_ns for f in out] == [T0 + 130 * MS]
    np.testing.assert_allclose(out[0].joints["left"], _truth(T0 + 100 * MS))
    assert fa.pop_ready(now_ns=T0 + 800 * MS) == []  # 300 ms away from joints: dropped
    assert fa.stats["dropped_no_joints"] == 1 and fa.pending_count == 0


def test_partial_set_when_a_camera_is_silent():
    fa = _assembler(set_timeout_ns=100 * MS)
    _feed_joints(fa, T0, T0 + 140 * MS)  # newest stamp seen: T0 + 140 ms
    for k in range(5):  # cam_left_wrist never publishes
        t = T0 + k * 33 * MS
        fa.add_image("cam_high", _img(t))
        fa.add_image("cam_low", _img(t + 2 * MS))
    out = fa.pop_ready()
    # Sets older than the 100 ms timeout go out partial; the newest ones still wait.
    assert [f.stamp_ns for f in out] == [T0, T0 + 33 * MS]
    assert all(list(f.images) == ["cam_high", "cam_low"] for f in out)
    out += fa.flush()
    assert len(out) == 5 and fa.stats["partial_sets"] == 5
    # min_cameras = 3 drops them instead
    fb = _assembler(set_timeout_ns=100 * MS, min_cameras=3)
    _feed_joints(fb, T0, T0 + 1000 * MS)
    fb.add_image("cam_high", _img(T0))
    assert fb.flush() == [] and fb.stats["dropped_incomplete"] == 1


def test_missing_camera_that_moved_on_closes_set_early():
    fa = _assembler(set_timeout_ns=10_000 * MS)
    _feed_joints(fa, T0, T0 + 1000 * MS)
    fa.add_image("cam_high", _img(T0 + 100 * MS))
    fa.add_image("cam_low", _img(T0 + 100 * MS))
    assert fa.pop_ready() == []
    fa.add_image("cam_left_wrist", _img(T0 + 150 * MS))  # later than the set: it missed it
    out = fa.pop_ready()
    assert [list(f.images) for f in out] == [["cam_high", "cam_low"]]
    # its own late image for that time is dropped, not turned into a duplicate set
    fa.add_image("cam_left_wrist", _img(T0 + 101 * MS))
    assert fa.stats["rejected_out_of_order_image"] == 1


def test_late_image_of_another_camera_is_dropped():
    fa = _assembler(set_timeout_ns=50 * MS)
    _feed_joints(fa, T0, T0 + 220 * MS)
    fa.add_image("cam_high", _img(T0 + 100 * MS))
    fa.add_image("cam_high", _img(T0 + 200 * MS))
    assert len(fa.pop_ready()) == 1  # first set timed out partial
    fa.add_image("cam_low", _img(T0 + 104 * MS))  # belongs to the emitted set
    assert fa.stats["dropped_late_image"] == 1 and fa.pending_count == 1


def test_duplicate_images_and_unknown_names():
    fa = _assembler()
    fa.add_image("cam_high", _img(T0))
    fa.add_image("cam_high", _img(T0))
    assert fa.stats["rejected_duplicate_image"] == 1 and fa.pending_count == 1
    with pytest.raises(RealsimError, match="unknown camera 'cam_x'"):
        fa.add_image("cam_x", _img(T0))
    with pytest.raises(RealsimError, match="unknown arm 'right'"):
        fa.add_joint_state("right", _js(T0, [0, 0, 0]))
    assert fa.add_joint_state("left", _js(T0, [np.nan, 0, 0])) == REJECTED_NONFINITE
    assert fa.stats["joint_rejected_nonfinite"] == 1 and "waist" in fa.last_message


def test_backwards_clock_resets_and_counts():
    fa = _assembler()
    _feed_joints(fa, T0, T0 + 200 * MS)
    for cam in CAMS:
        fa.add_image(cam, _img(T0 + 100 * MS))
    fa.add_image("cam_high", _img(T0 + 150 * MS))  # pending
    # the bag loops: stamps restart 10 s earlier
    t1 = T0 - 10_000 * MS
    fa.add_joint_state("left", _js(t1, _truth(t1)))
    assert fa.stats["clock_resets"] == 1
    assert fa.pending_count == 0 and len(fa.buffers["left"]) == 1
    assert fa.stats["dropped_reset"] == 2
    _feed_joints(fa, t1 + JS_DT, t1 + 200 * MS)
    for cam in CAMS:
        fa.add_image(cam, _img(t1 + 100 * MS))
    out = fa.pop_ready()
    assert [f.stamp_ns for f in out] == [t1 + 100 * MS]
    np.testing.assert_allclose(out[0].joints["left"], _truth(t1 + 100 * MS), atol=1e-3)
    # images can trigger it too
    fa.add_image("cam_low", _img(t1 - 5000 * MS))
    assert fa.stats["clock_resets"] == 2 and len(fa.buffers["left"]) == 0


def test_short_loop_below_the_jump_threshold_resets_too():
    """A 0.6 s bag looping steps back by < clock_jump_ns (1 s): caught by persistence."""
    fa = _assembler()
    period = 100 * MS

    def play(loop: int) -> list:
        out = []
        for i in range(6):
            t = T0 + i * period
            _feed_joints(fa, t - 40 * MS, t + 40 * MS)
            for cam in CAMS:
                fa.add_image(cam, _img(t, loop))
            out += fa.pop_ready()
        return out

    first = play(0)
    assert fa.stats["clock_resets"] == 0 and len(first) >= 2
    again = play(1)  # same stamps again: every image is behind its camera's newest
    assert fa.stats["clock_resets"] >= 1
    assert [f.stamp_ns for f in again] != [] and fa.stats["assembled"] > len(first)
    assert fa.stats["rejected_out_of_order_image"] <= 2 * len(CAMS)  # only around the loop
    # one late image or a few late joint states are not a loop
    fb = _assembler()
    _feed_joints(fb, T0, T0 + 200 * MS)
    fb.add_image("cam_high", _img(T0 + 100 * MS))
    fb.add_image("cam_high", _img(T0 + 90 * MS))
    for t in (T0 + 150 * MS, T0 + 130 * MS, T0 + 110 * MS):
        fb.add_joint_state("left", _js(t + 1, _truth(t)))
    for k in range(5):  # a run of slightly late images (less than the set timeout behind)
        fb.add_image("cam_low", _img(T0 + 100 * MS))
        fb.add_image("cam_low", _img(T0 + 60 * MS + k))
    assert fb.stats["clock_resets"] == 0


def test_bounded_memory_under_overload():
    fa = _assembler(max_pending=16, joint_capacity=64, max_latency_ns=500 * MS)
    _feed_joints(fa, T0, T0 + 100 * MS)  # then the joint states stop
    n = 10_000
    for i in range(n):  # 3 cameras, each image too far from the others to share a set
        fa.add_image(CAMS[i % 3], _img(T0 + i * 11 * MS))
        assert fa.pending_count <= 16
        if i % 10 == 9:
            fa.pop_ready()
    # Sets wait up to 500 ms (~45 images) for joints, longer than 16 pending sets last:
    # the oldest waiting set is dropped each time a new one starts.
    s = fa.stats
    assert s["images_received"] == n and s["sets_created"] == n
    assert s["assembled"] == 10  # images at 0..99 ms, bracketed by joints at 0..100 ms
    pending = fa.pending_count
    assert pending == 16
    assert s["dropped_overflow"] == n - 10 - pending
    t_end = T0 + n * 11 * MS
    for i in range(2000):
        fa.add_joint_state("left", _js(t_end + i * MS, [0.0, 0.0, 0.0]))
    assert len(fa.buffers["left"]) == 64
    assert fa.pop_ready() == []  # joints now exist, but not near the waiting sets' stamps
    assert s["dropped_no_joints"] == pending and fa.pending_count == 0
    assert len(fa._closed) <= 32  # the late-image memory is bounded too


# ---------------------------------------------------------------- KeyframeBuffer


def _frame(t: int, q, views: dict | None = None) -> FrameSet:
    images = {c: _img(t, v) for c, v in (views or {"c": 0}).items()}
    return FrameSet(t, images, {"left": np.asarray(q, float)})


def test_keyframes_reject_similar_and_fill():
    kb = KeyframeBuffer(capacity=10, min_joint_distance=0.1)
    assert kb.add(_frame(0, [0.0, 0.0]))
    assert not kb.add(_frame(1, [0.05, 0.05]))  # 0.0707 rad away
    assert kb.add(_frame(2, [0.2, 0.0]))
    assert not kb.add(_frame(3, [0.2, 0.1]))  # exactly 0.1: not more than the threshold
    assert [f.stamp_ns for f in kb.frames] == [0, 2]
    assert kb.stats["rejected_similar"] == 2 and kb.stats["accepted"] == 2
    assert not kb.add(FrameSet(9, {}, {"right": np.zeros(2)}))  # different arms
    assert kb.stats["rejected_incomplete"] == 1


def test_keyframes_capacity_replaces_most_redundant():
    kb = KeyframeBuffer(capacity=3, min_joint_distance=0.1)
    for t, q in enumerate([[0.0], [1.0], [1.3]]):
        assert kb.add(_frame(t, q))
    assert kb.min_pairwise_distance() == pytest.approx(3.0)  # 0.3 rad / 0.1
    # [0.5]: nearest to the rest after dropping 1.0 or 1.3 is 0.5 (> 0.3): replaces slot 1
    assert kb.add(_frame(3, [0.5]))
    assert sorted(float(f.joints["left"][0]) for f in kb.frames) == [0.0, 0.5, 1.3]
    assert kb.min_pairwise_distance() == pytest.approx(5.0)
    # [0.75] would be 0.25 from its neighbours: less diverse than the current set
    assert not kb.add(_frame(4, [0.75]))
    assert kb.stats["replaced"] == 1 and kb.stats["rejected_not_diverse"] == 1
    assert len(kb) == 3


def test_keyframes_diversity_grows_under_a_stream():
    rng = np.random.default_rng(0)
    kb = KeyframeBuffer(capacity=20, min_joint_distance=0.05)
    first_full = None
    for t in range(2000):
        kb.add(_frame(t, rng.uniform(-1, 1, size=2)))
        if len(kb) == 20 and first_full is None:
            first_full = kb.min_pairwise_distance()
    assert len(kb) == 20
    assert kb.min_pairwise_distance() > first_full
    # 20 points in [-1, 1]^2: the best packing spacing is about 0.5; random stays below
    assert 0.2 / 0.05 < kb.min_pairwise_distance() < 0.6 / 0.05


def test_keyframes_view_distance():
    kb = KeyframeBuffer(capacity=5, min_joint_distance=0.1, min_view_distance=0.1)
    assert kb.add(_frame(0, [0.0], {"c": 0}))
    assert not kb.add(_frame(1, [0.0], {"c": 20}))  # 20/255 = 0.078 grey: same view
    assert kb.add(_frame(2, [0.0], {"c": 100}))  # same joints, the scene changed
    assert not kb.add(_frame(3, [0.0], {"other": 255}))  # no common camera: joints only


def test_holdout_deterministic_and_stable():
    kb = KeyframeBuffer(capacity=500, min_joint_distance=0.01)
    for t in range(400):
        kb.add(_frame(1000 + t, [0.1 * t]))
    train, held = kb.holdout(0.2, seed=3)
    assert sorted(train + held) == list(range(400))
    assert 50 <= len(held) <= 110  # Binomial(400, 0.2): mean 80, sd 8
    assert kb.holdout(0.2, seed=3) == (train, held)
    assert kb.holdout(0.2, seed=4)[1] != held
    assert kb.holdout(0.0) == (list(range(400)), []) and kb.holdout(1.0)[0] == []
    # a frame never changes side as frames come and go (keys depend on the frame)
    held_stamps = {kb.frames[i].stamp_ns for i in held}
    for t in range(400, 450):
        kb.add(_frame(1000 + t, [0.1 * t]))
    train2, held2 = kb.holdout(0.2, seed=3)
    assert held_stamps <= {kb.frames[i].stamp_ns for i in held2}
    assert not held_stamps & {kb.frames[i].stamp_ns for i in train2}
    with pytest.raises(RealsimError, match="fraction"):
        kb.holdout(1.5)
    small = KeyframeBuffer(capacity=5, min_joint_distance=0.01)
    for t in range(3):
        small.add(_frame(t, [float(t)]))
    for seed in range(20):  # both sides non-empty for tiny buffers
        tr, ho = small.holdout(0.01, seed)
        assert len(ho) == 1 and len(tr) == 2
        tr, ho = small.holdout(0.99, seed)
        assert len(ho) == 2 and len(tr) == 1


# ---------------------------------------------------------------- offline path

K = CameraIntrinsics(16, 12, 20.0, 20.0, 7.5, 5.5)


def _recording(tmp_path) -> Recording:
    path = tmp_path / "bag"
    with BagWriter(path) as w:
        w.write_camera_info("/hi/info", T0, K, "hi")
        w.write_camera_info("/lo/info", T0, K.scaled(32, 24), "lo")  # info for 2x the image
        for i in range(60):
            t = T0 + i * JS_DT
            w.write_joint_state("/left/js", t, list(NAMES), _truth(t))
        for k in range(30):
            t = T0 + 10 * MS + k * 33 * MS
            w.write_image("/hi/img", t, np.full((12, 16, 3), k, np.uint8))
            if k % 5 != 4:  # cam lo drops every fifth frame
                w.write_image("/lo/img", t + 3 * MS, np.full((12, 16, 3), k, np.uint8))
    return read_bag(path)


def test_assemble_recording(tmp_path):
    rec = _recording(tmp_path)
    frames, intr, stats = assemble_recording(
        rec,
        {"hi": ("/hi/img", "/hi/info"), "lo": ("/lo/img", "/lo/info"), "w": ("/hi/img", None)},
        {"left": ("/left/js", list(NAMES))},
        image_tolerance_ns=10 * MS,
        joint_tolerance_ns=30 * MS,
    )
    # joint states cover T0 .. T0+1180 ms; images T0+10 .. T0+967 ms: all 30 assemble
    assert [f.stamp_ns for f in frames] == [T0 + 10 * MS + k * 33 * MS for k in range(30)]
    assert sum(len(f.images) == 2 for f in frames) == 6  # the frames cam lo dropped
    f7 = frames[7]
    assert f7.images["lo"].stamp_ns == f7.stamp_ns + 3 * MS
    assert int(f7.images["hi"].rgb[0, 0, 0]) == 7
    bound = OMEGA**2 * (JS_DT * 1e-9) ** 2 / 8
    for f in frames:
        assert np.max(np.abs(f.joints["left"] - _truth(f.stamp_ns))) <= bound + 1e-12
    assert intr == {"hi": K, "lo": K}  # lo's info rescaled to the 16x12 images
    assert stats["camera_info_rescaled"] == 1 and stats["cameras_without_info"] == 1
    assert stats["assembled"] == 30 and stats["partial_sets"] == 6


def test_assemble_recording_missing_topics(tmp_path):
    rec = _recording(tmp_path)
    arms = {"left": ("/left/js", list(NAMES))}
    with pytest.raises(RealsimError, match=r"camera x: image topic /nope .*/hi/img"):
        assemble_recording(rec, {"x": ("/nope", None)}, arms)
    with pytest.raises(RealsimError, match=r"arm right: joint state topic /r/js .*/left/js"):
        assemble_recording(rec, {"hi": ("/hi/img", None)}, {"right": ("/r/js", NAMES)})
