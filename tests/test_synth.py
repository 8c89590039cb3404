"""`realsim synth`: bag contents, truth bookkeeping, determinism, camera conventions."""

import time

import mujoco
import numpy as np
import pytest

from realsim_core.bag import read_bag
from realsim_core.calibration_io import read_ground_truth
from realsim_core.errors import RealsimError
from realsim_core.rig import load_mjmodel, load_rig
from realsim_core.synth import (
    SceneObject,
    SynthConfig,
    build_render_model,
    render_frames,
    simulate,
    synthesize,
)

FRAMES, W, H = 40, 212, 120  # the size the issue asks to time


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "rec"
    cfg = SynthConfig(seed=3, frames=FRAMES, resolution=(W, H), joint_offset_std=0.02,
                      camera_offset_mm=7.0, camera_offset_deg=0.7, objects=4)
    t0 = time.perf_counter()
    res = synthesize(out, cfg)
    print(f"\nsynth {FRAMES} frames {W}x{H}: {time.perf_counter() - t0:.1f} s")
    return res, cfg


def test_bag_topics_rates_and_stamps(recording):
    res, cfg = recording
    rig = load_rig(res.rig)
    rec = read_bag(res.bag)
    stamps = None
    for c in rig.cameras:
        imgs = rec.images[c.image_topic]
        assert len(imgs) == FRAMES
        assert imgs[0].rgb.shape == (H, W, 3) and imgs[0].rgb.dtype == np.uint8
        assert imgs[0].frame_id == c.optical_frame
        s = np.array([i.stamp_ns for i in imgs])
        stamps = s if stamps is None else stamps
        np.testing.assert_array_equal(s, stamps)  # all cameras at the same stamps
        infos = rec.camera_infos[c.info_topic]
        assert len(infos) == FRAMES
        k = infos[0][1]
        assert (k.width, k.height) == (W, H) and k.fx == pytest.approx(k.fy)
        assert imgs[0].rgb.std() > 5  # textured, not blank
    np.testing.assert_array_equal(np.diff(stamps), 200_000_000)  # 5 Hz
    for a in rig.arms:
        js = rec.joint_states[a.joint_states_topic]
        assert len(js) == (FRAMES - 1) * 10 + 1
        assert np.all(np.diff([j.stamp_ns for j in js]) == 20_000_000)  # 50 Hz
        assert js[0].names[:7] == a.ros_joint_names
        assert js[0].names[7:] == ("left_finger", "right_finger")


def test_measured_is_true_minus_offset(recording):
    res, _ = recording
    gt = read_ground_truth(res.ground_truth)
    rig = load_rig(gt.rig)
    with np.load(gt.trajectory) as z:
        q_true, q_meas, names = z["q_true"], z["q_measured"], list(z["joint_names"])
        stamps = z["stamp_ns"]
    off = np.array([gt.truth.joint_offsets[n] for n in names])
    np.testing.assert_allclose(q_true - q_meas, np.broadcast_to(off, q_true.shape), atol=1e-12)
    # the bag carries exactly q_measured at the image stamps
    rec = read_bag(res.bag)
    j = 0
    for a in rig.arms:
        js = {s.stamp_ns: s for s in rec.joint_states[a.joint_states_topic]}
        for f in (0, len(stamps) - 1):
            np.testing.assert_allclose(js[int(stamps[f])].position[:7], q_meas[f, j:j + 7])
        j += 7
    # nominal (rig.yaml) != truth by exactly the injected offsets
    assert set(gt.truth.cameras) == set(rig.camera_names)
    for c in rig.cameras:
        np.testing.assert_allclose(gt.nominal.cameras[c.name].pose, c.nominal, atol=1e-8)
    assert len(gt.truth.objects) == 4 and len(gt.object_meshes) == 4


def test_deterministic_per_seed():
    rig = load_rig()
    model = load_mjmodel(rig)
    a = simulate(rig, model, SynthConfig(seed=5, frames=4, joint_noise_std=0.01))
    b = simulate(rig, model, SynthConfig(seed=5, frames=4, joint_noise_std=0.01))
    c = simulate(rig, model, SynthConfig(seed=6, frames=4, joint_noise_std=0.01))
    np.testing.assert_array_equal(a.q_measured, b.q_measured)
    np.testing.assert_array_equal(a.objects[3].vertices, b.objects[3].vertices)
    assert not np.allclose(a.q_measured, c.q_measured)
    rm = build_render_model(rig, a.objects, 64, 48)
    i1 = render_frames(rig, rm, a.q_true[:1], a.camera_truth, 64, 48)
    i2 = render_frames(rig, rm, b.q_true[:1], b.camera_truth, 64, 48)
    for k in i1:
        np.testing.assert_array_equal(i1[k], i2[k])


def test_projection_matches_mujoco_image():
    """A sphere's centre, projected with our optical frame + camera_info, lands on its pixels.

    Checks the MJCF <-> REP-103 axis conversion and the intrinsics (fovy, principal point)
    against MuJoCo's own rasterisation (segmentation image), with a camera offset applied.
    """
    from realsim_core.rig import intrinsics_from_fovy
    from realsim_core.synth import camera_fovy_deg, random_camera_offset

    rig = load_rig()
    import trimesh

    ball = trimesh.creation.icosphere(subdivisions=3, radius=0.02)
    pose = np.eye(4)
    pose[:3, 3] = [0.05, 0.02, 0.02]
    obj = SceneObject("ball", "sphere", ball.vertices, ball.faces, pose, (1, 1, 0, 1))
    w, h = 160, 120
    rm = build_render_model(rig, (obj,), w, h)
    gid = mujoco.mj_name2id(rm, mujoco.mjtObj.mjOBJ_BODY, "realsim/ball")
    geom = int(np.flatnonzero(rm.geom_bodyid == gid)[0])
    q = np.zeros((1, 14))
    q[0, [0, 7]] = 1.4  # both waists turned away from the table centre
    q[0, [6, 13]] = 0.02
    rng = np.random.default_rng(0)
    truth = {c.name: c.nominal @ random_camera_offset(rng, 5.0, 2.0) for c in rig.cameras}
    seg = render_frames(rig, rm, q, truth, w, h, segmentation=True)
    for c in rig.fixed_cameras:
        mask = seg[c.name][0] == geom
        assert mask.sum() > 10, c.name
        K = intrinsics_from_fovy(w, h, camera_fovy_deg(c.intrinsics))
        p_cam = np.linalg.inv(truth[c.name]) @ np.append(pose[:3, 3], 1.0)
        u = K.fx * p_cam[0] / p_cam[2] + K.cx
        v = K.fy * p_cam[1] / p_cam[2] + K.cy
        ys, xs = np.nonzero(mask)
        # silhouette centroid vs projected centre: perspective skew of a 2 cm ball < 0.5 px
        assert abs(xs.mean() - u) < 1.0 and abs(ys.mean() - v) < 1.0, (c.name, u, v)


def test_bad_options(tmp_path):
    with pytest.raises(RealsimError, match="resolution"):
        synthesize(tmp_path / "a", SynthConfig(resolution=(4, 4)))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("")
    with pytest.raises(RealsimError, match="not empty"):
        synthesize(tmp_path / "b", SynthConfig())


def test_bump_moves_one_camera_mid_recording(tmp_path):
    """--bump: frames before are those of the unbumped recording; truth = final pose."""
    from realsim_core.se3 import rotation_error_deg

    base = SynthConfig(seed=5, frames=6, resolution=(64, 36), objects=0)
    plain = synthesize(tmp_path / "plain", base)
    bumped = synthesize(tmp_path / "bumped",
                        SynthConfig(**{**base.__dict__, "bumps": (("cam_high", 0.5, 12.0, 1.5),)}))
    gt_plain, gt = read_ground_truth(plain.ground_truth), read_ground_truth(bumped.ground_truth)
    (event,) = gt.noise["bump_events"]
    assert event["camera"] == "cam_high" and event["frame"] == 3
    before = np.asarray(event["pose_before"])
    np.testing.assert_allclose(before, gt_plain.truth.cameras["cam_high"].pose, atol=1e-7)
    final = gt.truth.cameras["cam_high"].pose
    assert np.linalg.norm(final[:3, 3] - before[:3, 3]) * 1e3 == pytest.approx(12.0, abs=1e-4)
    assert rotation_error_deg(final[:3, :3], before[:3, :3]) == pytest.approx(1.5, abs=1e-4)
    for cam in ("cam_low", "cam_left_wrist", "cam_right_wrist"):
        np.testing.assert_array_equal(gt.truth.cameras[cam].pose,
                                      gt_plain.truth.cameras[cam].pose)
    assert gt.truth.joint_offsets == gt_plain.truth.joint_offsets

    def images(res, topic):
        return [s.rgb for s in read_bag(res.bag, topics=[topic]).images[topic]]

    for cam, moved in (("cam_high", True), ("cam_low", False)):
        topic = f"/{cam}/camera/color/image_rect_raw"
        a, b = images(plain, topic), images(bumped, topic)
        assert len(a) == len(b) == 6
        assert all(np.array_equal(x, y) for x, y in zip(a[:3], b[:3]))  # before: same
        assert [not np.array_equal(x, y) for x, y in zip(a[3:], b[3:])] == [moved] * 3


@pytest.mark.parametrize("bump, why", [
    (("cam_nope", 0.5, 1.0, 1.0), "unknown camera 'cam_nope'"),
    (("cam_high", 1.0, 1.0, 1.0), "T_FRAC must be in (0, 1)"),
    (("cam_high", 0.5, -1.0, 1.0), "MM and DEG must be finite and >= 0"),
])
def test_bad_bump(tmp_path, bump, why):
    with pytest.raises(RealsimError) as exc:
        synthesize(tmp_path / "x", SynthConfig(frames=4, resolution=(32, 18), objects=0,
                                               bumps=(bump,)))
    assert why in str(exc.value)
