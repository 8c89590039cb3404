"""Known-answer problems for the calibration engine (seconds of optimisation each).

Targets are rendered by our own splat renderer from the *true* parameters, so the scene
model can represent them exactly and the optimum is the truth; the MuJoCo-rendered
end-to-end runs are the benchmark's job (docs/calibration.md).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realsim_core import calibration as C
from realsim_core import kinematics, losses
from realsim_core.rig import load_mjmodel, load_rig
from realsim_core.se3 import se3_exp
from realsim_core.types import CameraIntrinsics

W, H = 80, 45             # small images keep each step cheap
N_GAUSS = 2500
N_FRAMES = 4


@pytest.fixture(scope="module")
def setup():
    rig = load_rig("builtin:aloha2")
    model = load_mjmodel(rig)
    intr = {c: CameraIntrinsics(W, H, 0.9 * W, 0.9 * W, (W - 1) / 2, (H - 1) / 2)
            for c in rig.camera_names}
    # the random layout: at 2500 Gaussians the default face layout cannot go below the
    # model's 3136 native triangles, so its large link faces get ~8 cm triangles and the
    # 18-cycle known answers converge more slowly (one joint: 0.0139 of 0.02 rad); these
    # tests are about the engine, the layouts have their own tests below
    # the table top and floor as surfels, as these tests were built (a uniform textured
    # plane carries less pose signal than the random layout's patchy table); the
    # textured planes have their own tests (tests/test_planes.py), and every end-to-end
    # test (CLI, node, drift) runs with them
    gauss = C.rig_gaussians(model, N_GAUSS, seed=0, layout="random", exclude_planes=False)
    rng = np.random.default_rng(0)
    J = len(rig.joint_names)
    qs = [rng.uniform(-0.3, 0.3, J) * np.r_[np.ones(6), 0.05, np.ones(6), 0.05]
          + np.r_[0, -0.6, 0.6, 0, 0.5, 0, 0.02, 0, -0.6, 0.6, 0, 0.5, 0, 0.02]
          for _ in range(N_FRAMES)]
    cfg = C.CalibrationConfig(levels=(1,), cycles_per_level=(18,), warmup_colour_steps=0,
                              colour_steps=0, pose_steps=4, batch_frames=N_FRAMES,
                              holdout_fraction=0.0, lr_camera=3e-3, lr_joint=3e-3,
                              init_colours=False,  # targets use the initial colours
                              # the known answer is exactly representable: the prior (which
                              # guards real recordings) only needs to be a weak tie-breaker
                              prior_weight=1e-3,
                              # a short, deterministic (full-batch) schedule: no warm-up
                              # ramp, no iterate averaging (both have their own tests)
                              lr_warmup_steps=0, average_fraction=0.0,
                              # the random layout's holes are filled by the back layer
                              cull_backfaces=False, textured_planes=False,
                              # 3DGS's filter: these 2,500 random Gaussians are sparse, and
                              # with the default 0.1 px^2 the one-joint answer converges
                              # more slowly (13.2 of 20 mrad after 18 cycles; 0.3: within
                              # 6 mrad); the default scene is dense (docs/calibration.md)
                              filter_px2=0.3)
    session = C.CalibrationSession(rig, model, intr, gauss, cfg, max_frames=N_FRAMES)
    return rig, session, qs


def _render_targets(session, params, qs):
    out = []
    for q in qs:
        imgs = C.render_batch(session.static, params, jnp.asarray(q, jnp.float32)[None],
                              jnp.zeros((1, len(q)), jnp.float32), 0)
        out.append({cam: np.asarray(np.clip(np.asarray(img[0]) * 255, 0, 255), np.uint8)
                    for cam, img in zip(session.cameras, imgs)})
    return out


def _fresh(session):
    """Nominal pose parameters with the session's (fixed) appearance."""
    appearance = ("color_logits", "opacity_logits", "background_logits", "shading",
                  "plane_logits")
    return dict(session.nominal, **{k: session.params[k] for k in appearance})


def _reset(session, truth_params, qs):
    session.params = _fresh(session)
    session.accepted = dict(session.params)
    session._pose_state = session._pose_opt.init(session.params)
    session._colour_state = session._colour_opt.init(session.params)
    session.n_frames = 0
    session.stamps = []
    session.metrics = C.Metrics()
    for q, imgs in zip(qs, _render_targets(session, truth_params, qs)):
        session.add_frame(imgs, q, holdout=False)


def test_recovers_one_fixed_camera_offset(setup):
    rig, s, qs = setup
    cam = "cam_high"
    ci = [c.name for c in rig.fixed_cameras].index(cam)
    truth = _fresh(s)  # earlier tests moved s.params
    delta = np.zeros((len(rig.fixed_cameras), 6), np.float32)
    delta[ci] = [0.006, -0.004, 0.005, 0.004, -0.006, 0.003]   # 8.8 mm, 0.45 deg
    truth["fixed_deltas"] = jnp.asarray(delta)
    s.cfg = s.cfg.replace(optimise_joints=False)
    s._build_optimisers()
    _reset(s, truth, qs)
    start = s.holdout_residual()
    m = s.run()
    err0 = np.linalg.norm(delta[ci, :3]) * 1e3
    est = np.asarray(s.accepted["fixed_deltas"][ci])
    err = np.linalg.norm(est[:3] - delta[ci, :3]) * 1e3
    rot_err = np.degrees(np.linalg.norm(est[3:] - delta[ci, 3:]))
    assert m.rollbacks == 0
    assert s.metrics.holdout_l1 < start
    assert err < 0.3 * err0, (err0, err, est)
    assert rot_err < 0.15


def test_recovers_one_joint_offset(setup):
    rig, s, qs = setup
    truth = _fresh(s)  # earlier tests moved s.params
    off = np.zeros(len(rig.joint_names), np.float32)
    j = rig.joint_names.index("follower_left/shoulder")
    off[j] = 0.02
    truth["joint_offsets"] = jnp.asarray(off)
    s.cfg = s.cfg.replace(optimise_joints=True, optimise_cameras=False)
    s._build_optimisers()
    _reset(s, truth, qs)
    s.run()
    est = np.asarray(s.accepted["joint_offsets"])
    assert abs(est[j] - 0.02) < 0.006, est[j]
    others = np.delete(est, j)
    assert np.max(np.abs(others)) < 0.01, others


def test_pair_list_is_sized_from_the_views_and_grows_when_short(setup):
    rig, s, qs = setup
    _reset(s, _fresh(s), qs)
    s._set_static(s.static._replace(max_pairs=()))          # the renderer's 8 per Gaussian
    default = C.render_batch(s.static, s.params, s.bufs.q[:2], s.params["corrections"][:2], 0)
    need = s.pair_need()[0]
    n_gauss = int(s.static.gauss.means.shape[0])
    assert 0 < need < 3 * n_gauss       # 2.4 per Gaussian here (sparse, large; calib-std 0.7)
    assert s.fit_pair_budget()
    budget = s.static.max_pairs[0]
    assert max(4096, 2 * need) <= budget < 8 * n_gauss
    assert not s.fit_pair_budget()                          # already fits: no rebuild
    sized = C.render_batch(s.static, s.params, s.bufs.q[:2], s.params["corrections"][:2], 0)
    for a, b in zip(default, sized):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    s._set_static(s.static._replace(max_pairs=(need // 2,)))  # too short: holes
    assert s.fit_pair_budget()
    assert s.static.max_pairs[0] >= 2 * need


def test_value_only_functions_take_the_host_poses_and_agree_with_mjx(setup):
    """Held-out scores, silhouettes, painting views: C MuJoCo poses, MJX's values.

    These functions get their body poses from the host (`_bodies`) rather than tracing
    MJX's kinematics; with joint offsets, per-frame corrections and camera deltas set,
    each agrees with the same function through `forward_batch` (MJX, float32).
    """
    rig, s, qs = setup
    _reset(s, _fresh(s), qs)
    rng = np.random.default_rng(11)
    J = len(rig.joint_names)
    p = dict(s.params)
    p["joint_offsets"] = jnp.asarray(rng.normal(0, 0.02, J), jnp.float32)
    p["corrections"] = jnp.asarray(rng.normal(0, 0.01, p["corrections"].shape), jnp.float32)
    p["fixed_deltas"] = jnp.asarray(rng.normal(0, 0.01, p["fixed_deltas"].shape), jnp.float32)
    p["mounted_deltas"] = jnp.asarray(rng.normal(0, 0.01, p["mounted_deltas"].shape),
                                      jnp.float32)
    idx = np.arange(N_FRAMES)
    mjx = kinematics.forward_batch_jit(s.static.km, s.bufs.q[idx], p["joint_offsets"],
                                       p["corrections"][idx], p["fixed_deltas"],
                                       p["mounted_deltas"])
    np.testing.assert_allclose(s._bodies(p, idx[::-1]), mjx.bodies[::-1], rtol=0, atol=1e-5)
    # the held-out score: host poses vs MJX inside the function
    level = len(s.cfg.levels) - 1
    ref = np.mean([float(C._photometric(s.static, p, s.bufs, jnp.asarray([i], jnp.int32),
                                        level, 0.0)) for i in s._scored_frames()])
    assert s.holdout_residual(p) == pytest.approx(ref, rel=1e-5)
    p0 = {**p, "corrections": jnp.zeros_like(p["corrections"])}
    assert abs(s.holdout_residual(p0) - ref) > 1e-4 * ref   # the corrections count
    # the painting views' cameras (wrists move with the corrected joints)
    views = s._init_views(N_FRAMES, p)
    np.testing.assert_allclose(views[2], np.asarray(mjx.cameras)[views[0]], rtol=0,
                               atol=1e-5)
    # the per-camera residual of a frame outside the buffer (drift detection)
    imgs = _render_targets(s, p, qs[:1])[0]
    got = s.camera_residuals(imgs, qs[0], params=p)
    renders = C.render_batch(s.static, p, jnp.asarray(qs[0], jnp.float32)[None],
                             jnp.zeros((1, J), jnp.float32), level)
    for c, r in zip(s.cameras, renders):
        x = losses.downsample(jnp.asarray(imgs[c], jnp.float32) / 255.0, s.cfg.levels[level])
        assert got[c] == pytest.approx(float(jnp.mean(jnp.abs(r[0] - x))), rel=1e-4, abs=1e-6)


def test_uncertainty_shrinks_with_more_frames(setup):
    rig, s, qs = setup
    truth = _fresh(s)  # earlier tests moved s.params
    s.cfg = s.cfg.replace(optimise_joints=True, optimise_cameras=True)
    s._build_optimisers()
    _reset(s, truth, qs[:1])
    one = s.uncertainty(max_frames=1)
    _reset(s, truth, qs)
    four = s.uncertainty(max_frames=4)
    assert four["cam_high"]["translation_mm"] < one["cam_high"]["translation_mm"]
    j = "follower_left/shoulder"
    assert four["joint_offsets"][j] < one["joint_offsets"][j]
    prior_mm = 1e3 * s.cfg.prior_camera_m * np.sqrt(3)
    assert 0 < four["cam_high"]["translation_mm"] < prior_mm  # the images add information


def _add_noise(frames, rng, smooth: bool, rms: float = 0.06):
    """Targets plus noise: independent per pixel, or smooth blobs (~15 px) of the same RMS."""
    from scipy.ndimage import gaussian_filter

    out = []
    for imgs in frames:
        noisy = {}
        for cam, img in imgs.items():
            n = rng.normal(size=img.shape)
            if smooth:  # low-pass in the image plane: correlated residuals
                n = gaussian_filter(n, sigma=(5.0, 5.0, 0.0), mode="wrap")
            n = rms * n / n.std()
            noisy[cam] = (np.clip(img / 255.0 + n, 0, 1) * 255).round().astype(np.uint8)
        out.append(noisy)
    return out


def test_robust_uncertainty_sees_correlated_residuals(setup):
    """The cluster-robust std grows when each image's residual is one correlated blob field.

    Same noise power both times: independent pixel noise leaves the robust estimate near
    the Laplace one; smooth blobs (what a misregistered appearance leaves) raise it well
    above, while the Laplace std, which counts every pixel as independent, barely moves.
    """
    rig, s, qs = setup
    truth = _fresh(s)
    rng = np.random.default_rng(3)
    ratios = {}
    for smooth in (False, True):
        _reset(s, truth, [])
        for q, imgs in zip(qs, _add_noise(_render_targets(s, truth, qs), rng, smooth)):
            s.add_frame(imgs, q, holdout=False)
        lap = s.uncertainty(max_frames=4, robust=False)
        rob = s.uncertainty(max_frames=4, robust=True)
        r = [rob["joint_offsets"][j] / lap["joint_offsets"][j] for j in rig.joint_names]
        r += [rob[c]["translation_mm"] / lap[c]["translation_mm"] for c in rig.camera_names]
        assert min(r) >= 1.0 - 1e-9          # the reported std is the larger of the two
        ratios[smooth] = float(np.median(r))
    assert ratios[False] < 1.6, ratios
    assert ratios[True] > 2.0 * ratios[False], ratios


def test_silhouette_edge_score_known_answers():
    img = np.zeros((60, 80, 3), np.uint8)
    img[20:40, 30:50] = 200                                   # a bright square
    dist = C.edge_distance_map(img)
    sq = np.zeros((60, 80))
    sq[20:40, 30:50] = 1.0
    s0, n0 = C.silhouette_edge_score(sq, dist)
    assert n0 == 4 * 20 - 4 and s0 / n0 < 1.0                # the outline lies on the edges
    s4, n4 = C.silhouette_edge_score(np.roll(sq, 4, axis=1), dist)
    assert 1.5 < s4 / n4 < 3.0, s4 / n4                       # sides 4 px off, top/bottom on
    flat = C.edge_distance_map(np.full((60, 80, 3), 90, np.uint8))
    assert np.all(flat == 8.0)                                # no edges: the cap everywhere


def test_camera_guard_keeps_the_accepted_pose_of_a_camera_that_got_worse(setup):
    rig, s, qs = setup
    fixed = [c.name for c in rig.fixed_cameras]
    mounted = [c.name for c in rig.mounted_cameras]
    truth = _fresh(s)
    fd = np.zeros((len(fixed), 6), np.float32)
    md = np.zeros((len(mounted), 6), np.float32)
    fd[fixed.index("cam_high")] = [0.006, -0.004, 0.005, 0.004, -0.006, 0.003]
    md[0] = [0.004, 0.003, -0.004, -0.005, 0.004, 0.006]
    truth["fixed_deltas"], truth["mounted_deltas"] = jnp.asarray(fd), jnp.asarray(md)
    _reset(s, truth, qs)                      # accepted: the nominal poses
    cand_f, cand_m = 0.5 * fd, -md            # cam_high halfway there, wrist 0 the wrong way
    # cam_low's truth is nominal; it drifts by 1.7 deg (2.2 px at these 80x45 images)
    cand_f[fixed.index("cam_low")] = [0.008, 0.0, -0.006, 0.0, 0.03, 0.0]
    cand = {**s.accepted, "fixed_deltas": jnp.asarray(cand_f),
            "mounted_deltas": jnp.asarray(cand_m)}
    out, reverted = s.camera_guard(cand, s.accepted)
    assert sorted(reverted) == sorted(["cam_low", mounted[0]])
    np.testing.assert_array_equal(np.asarray(out["fixed_deltas"])[fixed.index("cam_high")],
                                  cand_f[fixed.index("cam_high")])
    np.testing.assert_array_equal(np.asarray(out["fixed_deltas"])[fixed.index("cam_low")], 0)
    np.testing.assert_array_equal(np.asarray(out["mounted_deltas"])[0], 0)
    np.testing.assert_array_equal(np.asarray(out["mounted_deltas"])[1:], cand_m[1:])
    guarded, raw = s.silhouette_edge_scores(out, cand)
    assert np.all(guarded <= raw + 1e-7)
    np.testing.assert_array_equal(s.silhouette_edge_scores(cand)[0], raw)
    # try_accept applies it when enabled: the accepted estimate holds the guarded poses
    s.cfg = s.cfg.replace(camera_guard=True)
    s.params = cand
    s.metrics.holdout_l1 = s.holdout_residual(s.accepted)
    assert s.try_accept() and s.metrics.camera_reverts == 2
    np.testing.assert_array_equal(np.asarray(s.accepted["mounted_deltas"])[0], 0)
    s.cfg = s.cfg.replace(camera_guard=False)


def _reference_step(s, params, pose_state, colour_state, idx, nominal, pose, lr_scale):
    """The step as one gradient over every parameter group (the form of sessions 1-28).

    Each optimiser is applied to the full gradient and keeps to its own groups.
    """
    import optax

    lam = s.cfg.ssim_lambda if pose else 0.0

    def loss(p):
        data = C._photometric(s.static, p, s.bufs, idx, 0, lam, pose)
        prior = C._prior(p, s.cfg, nominal) * s.cfg.level_prior_weight(0)
        return data + (prior if pose else 0.0), data

    (_, data), grads = jax.value_and_grad(loss, has_aux=True)(params)
    opt, state = (s._pose_opt, pose_state) if pose else (s._colour_opt, colour_state)
    updates, state = opt.update(grads, state, params)
    updates = jax.tree_util.tree_map(lambda u: u * (lr_scale if pose else 1.0), updates)
    return optax.apply_updates(params, updates), data, state


def test_colour_and_pose_steps_match_one_gradient_over_every_group(setup,
                                                                    restore_appearance):
    """The split step against the reference that differentiates everything and selects.

    A colour step differentiates the appearance only, a pose step the poses only.
    """
    rig, s, qs = setup
    truth = _fresh(s)
    _reset(s, truth, qs)
    params = dict(truth, fixed_deltas=truth["fixed_deltas"] + 0.003,
                  joint_offsets=truth["joint_offsets"] + 0.01,
                  color_logits=truth["color_logits"] * 0.9)
    nominal = {**s.nominal, "qbar": s.qbar}
    idx = jnp.arange(2, dtype=jnp.int32)
    ps, cs = s._pose_opt.init(params), s._colour_opt.init(params)
    fn = s._step_fn(0)
    for pose in (False, True):
        new, ps2, cs2, data, finite = fn(params, ps, cs, s.bufs, idx, nominal,
                                         jnp.asarray(pose), jnp.float32(0.5))
        ref, ref_data, ref_state = _reference_step(s, params, ps, cs, idx, nominal, pose, 0.5)
        assert bool(finite)
        assert float(data) == pytest.approx(float(ref_data), rel=5e-5)   # float32 sums
        # Adam's first moment after one step is 0.1 x the gradient each optimiser saw:
        # the gradients agree (Adam's first update, ~lr x sign, would hide their size)
        state = ps2 if pose else cs2
        for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(ref_state)):
            a, b = np.asarray(a), np.asarray(b)
            if b.size:
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.abs(b).max()))
        moved = C.POSE_KEYS if pose else C.COLOUR_KEYS
        # it did step (the shared session's appearance may be saturated in places, so
        # not every colour group need move; the offset poses always do)
        assert any(float(jnp.abs(new[k] - params[k]).max()) > 0 for k in moved
                   if params[k].size)
        if pose:
            assert float(jnp.abs(new["fixed_deltas"] - params["fixed_deltas"]).max()) > 1e-4
        lr = 0.5 * s.cfg.lr_camera if pose else s.cfg.lr_colour
        for k in params:
            if k in moved:      # within round-off of Adam's lr-sized steps
                np.testing.assert_allclose(np.asarray(new[k]), np.asarray(ref[k]),
                                           rtol=0, atol=1e-3 * lr, err_msg=k)
            else:                           # the other groups: untouched, bit for bit
                np.testing.assert_array_equal(np.asarray(new[k]), np.asarray(params[k]))
        # only the stepping optimiser's state advances
        for a, b in zip(jax.tree_util.tree_leaves(cs2 if pose else ps2),
                        jax.tree_util.tree_leaves(cs if pose else ps)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_nan_step_is_rolled_back(setup):
    rig, s, qs = setup
    _reset(s, _fresh(s), qs)
    before = {k: np.asarray(v) for k, v in s.params.items()}
    s.bufs = s.bufs._replace(q=s.bufs.q.at[:].set(jnp.nan))   # every frame poisoned
    fn = s._step_fn(0)
    s._do(fn, True)
    s._do(fn, False)
    assert s.metrics.rollbacks == 2
    for k, v in s.params.items():
        np.testing.assert_array_equal(np.asarray(v), before[k])


def test_online_estimator_improves_and_only_publishes_accepted(setup, monkeypatch):
    """The node's engine adapter: frames in, bounded steps, an accepted better estimate."""
    from realsim_core import online_engine
    from realsim_core.online import nominal_calibration
    from realsim_core.online_engine import SessionEstimator
    from realsim_core.sync import FrameSet
    from realsim_core.types import ImageSample

    rig, s, qs = setup
    cam = "cam_low"
    ci = [c.name for c in rig.fixed_cameras].index(cam)
    truth = _fresh(s)
    delta = np.zeros((len(rig.fixed_cameras), 6), np.float32)
    delta[ci] = [-0.005, 0.006, 0.0, 0.0, 0.004, -0.005]
    truth["fixed_deltas"] = jnp.asarray(delta)
    cfg = s.cfg.replace(optimise_joints=False, optimise_cameras=True)
    # the estimator builds the fixture's known scene, so the targets are exactly reachable
    monkeypatch.setattr(online_engine, "rig_gaussians", lambda model, n, seed=0, **_:
                        C.rig_gaussians(model, n, seed=seed, layout="random",
                                        exclude_planes=False))
    est = SessionEstimator(rig, nominal_calibration(rig), config=cfg, max_frames=N_FRAMES,
                           min_frames=N_FRAMES, n_gaussians=N_GAUSS, accept_every=3,
                           holdout_every=10**6)
    assert est.step() is False and est.state.startswith("waiting")
    intr = s.full_intrinsics
    n = len(rig.arms[0].ros_joint_names)
    for k, (q, imgs) in enumerate(zip(qs, _render_targets(s, truth, qs))):
        frame = FrameSet(stamp_ns=k, images={c: ImageSample(k, im) for c, im in imgs.items()},
                         joints={a.name: np.asarray(q[i * n:(i + 1) * n])
                                 for i, a in enumerate(rig.arms)})
        est.add_frame(frame, intr, keyframe=True)
    start_pose = est.estimate().cameras[cam].pose.copy()
    improved = [est.step() for _ in range(12)]
    assert est.state in ("optimising", "converged")
    assert any(improved)
    pose = est.estimate().cameras[cam].pose
    nominal = np.asarray(s.static.km.fixed_nominal[ci], np.float64)
    true_pose = nominal @ np.asarray(se3_exp(delta[ci]), np.float64)
    err = lambda T: np.linalg.norm(T[:3, 3] - true_pose[:3, 3])  # noqa: E731
    assert err(pose) < 0.7 * err(start_pose), (err(start_pose), err(pose))
    m = est.metrics()
    assert m["accepted"] >= 1 and m["holdout_l1"] <= m["holdout_l1_start"]
    # the outline check (appearance-free): the moved camera's rendered robot outline now
    # lies closer to the edges of its images than at the nominal start
    assert m[f"edge_distance_px/{cam}"] < m[f"edge_distance_px_start/{cam}"] - 0.05, m
    assert m["edge_distance_px/cam_high"] == pytest.approx(
        m["edge_distance_px_start/cam_high"], abs=0.02), m    # not moved: same outline
    # reduce on plateau: every rejected acceptance test halved the pose step size
    assert est.session.lr_scale == pytest.approx(
        max(cfg.lr_final_fraction, 0.5 ** m["rejected"]))


def test_rig_gaussians_density_by_body_class(setup):
    """Spacing by body class, wrist subtrees densest; no down-facing static faces.

    Links get a dense cover, the wrist-camera subtrees a denser one, the floor the
    sparsest; down-facing static faces none.
    """
    import mujoco

    from realsim_core.se3 import quat_xyzw_to_matrix

    rig, session, _ = setup
    model = load_mjmodel(rig)
    near = C.mount_subtree_bodies(rig, model)
    names = {mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, b) for b in near}
    assert {"left/gripper_base", "left/left_finger_link", "right/right_finger_link"} <= names
    assert not any("upper_arm" in n or "shoulder" in n for n in names)
    for layout in ("faces", "random"):
        # with the table top and floor as surfels too (textured planes have their own test)
        g = C.rig_gaussians(model, 6000, seed=1, layout=layout, near_bodies=near,
                            exclude_planes=False)
        assert abs(len(g.body) - 6000) < 0.1 * 6000
        assert not np.any(C.rig_gaussians(model, 6000, seed=1, layout=layout,
                                          near_bodies=near).body == 0)   # floor: a plane
        moving = model.body_weldid[g.body] != 0
        close = np.isin(g.body, near)
        # random: one isotropic std per class, 0.6 x its spacing; faces: triangles are
        # bisected until their edges are below the class's spacing, so the largest
        # Gaussian of a class scales with it (finer native tessellation stays as it is)
        size = g.scales[:, 0]
        stat = np.median if layout == "random" else np.max
        link, wrist, table, floor = (stat(size[moving & ~close]), stat(size[close]),
                                     stat(size[~moving & (g.body != 0)]),
                                     stat(size[g.body == 0]))
        # density ratios 1 : 8 : 0.25 : 0.03 -> spacing ratios 1 : 0.35 : 2 : 5.8
        assert table == pytest.approx(2.0 * link, rel=0.3), layout
        assert wrist == pytest.approx(link / np.sqrt(8), rel=0.3), layout
        assert link < floor <= 1.3 * np.sqrt(1 / 0.03) * link, layout
        assert np.all(g.scales[:, 2] < 1e-6)                # surfels
        data = mujoco.MjData(model)
        mujoco.mj_kinematics(model, data)
        normals = np.asarray(quat_xyzw_to_matrix(jnp.asarray(g.quats)))[:, :, 2]
        R = data.xmat[g.body].reshape(-1, 3, 3)
        n_world = np.einsum("nij,nj->ni", R, normals)
        # every static surfel faces up or sideways in the world (cameras are above)
        assert np.all(n_world[~moving, 2] >= -0.1 - 1e-5)
        assert np.any(n_world[moving, 2] < -0.5)             # links keep their undersides


def test_bisect_to_size_keeps_area_and_winding():
    sliver = np.array([[[0.0, 0, 0], [0.25, 0, 0], [0.0, 0.016, 0]],
                       [[0.25, 0, 0], [0.25, 0.016, 0], [0.0, 0.016, 0]]])
    tri = C._bisect_to_size(sliver, 0.01)
    edges = np.linalg.norm(tri[:, [1, 2, 0]] - tri, axis=-1)
    assert edges.max() <= 0.01 + 1e-12
    cross = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    assert np.all(cross[:, 2] > 0)                                   # winding kept (+z)
    assert 0.5 * np.abs(cross[:, 2]).sum() == pytest.approx(0.25 * 0.016, rel=1e-9)
    # only long edges are split: fewer triangles than midpoint subdivision's 648
    assert len(tri) == 492


def test_face_layout_outline_matches_mujoco():
    """A box's outline: MuJoCo segmentation against our rasteriser at the same camera.

    The triangle-matched surfels cover the box without holes and with outward normals
    (back-face culling keeps the near side). With the 3DGS additive low-pass every
    footprint grows by 0.3 px^2, which fattens an outline of ~2 px triangles by ~0.5 px;
    `dilation="clamp"` only raises footprints thinner than the filter.
    """
    import mujoco

    from realsim_core.render import rasterize
    from realsim_core.rig import MJCF_TO_OPTICAL, intrinsics_from_fovy
    from realsim_core.se3 import quat_xyzw_to_matrix

    xml = """<mujoco><worldbody><body name="b" pos="0 0 0.3" euler="20 30 10"><freejoint/>
      <geom type="box" size="0.06 0.04 0.03" rgba="1 1 1 1"/></body>
      <camera name="c" pos="0.05 -0.5 0.7" xyaxes="1 0 0 0 0.8 0.6" fovy="45"/>
      </worldbody></mujoco>"""
    model = mujoco.MjModel.from_xml_string(xml)
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    w, h = 160, 120
    with mujoco.Renderer(model, h, w) as r:
        r.enable_segmentation_rendering()
        r.update_scene(data, camera="c")
        mask = r.render()[..., 0] >= 0                     # 728 px
    T = np.eye(4)
    T[:3, :3], T[:3, 3] = data.cam_xmat[0].reshape(3, 3), data.cam_xpos[0]
    pose = jnp.asarray(T @ MJCF_TO_OPTICAL, jnp.float32)
    bodies = np.tile(np.eye(4), (model.nbody, 1, 1))
    bodies[:, :3, :3], bodies[:, :3, 3] = data.xmat.reshape(-1, 3, 3), data.xpos
    g = C.rig_gaussians(model, 1500)
    normal = np.asarray(quat_xyzw_to_matrix(jnp.asarray(g.quats)))[:, :, 2]
    assert np.all(np.einsum("ni,ni->n", normal, g.means) > 0)       # outward
    means, quats = C.world_gaussians(C.RigGaussians(*(jnp.asarray(x) for x in g)),
                                     jnp.asarray(bodies, jnp.float32))
    edge = ((mask ^ np.roll(mask, 1, 0)) | (mask ^ np.roll(mask, 1, 1))).sum() / 2
    out = {}
    for dilation in ("add", "clamp"):
        a = np.asarray(rasterize(means, quats, jnp.asarray(g.scales), jnp.asarray(g.opacities),
                                 jnp.ones((len(g.body), 3)), pose, intrinsics_from_fovy(w, h, 45.0),
                                 capacity=256, cull_backfaces=True, dilation=dilation).alpha)
        iou = ((a > 0.5) & mask).sum() / ((a > 0.5) | mask).sum()
        outside = a[~mask].sum() / edge                  # alpha spilled past the outline, px
        out[dilation] = (iou, a[mask].mean(), outside)
    # measured: IoU add 0.929, clamp 0.954; inside 0.98 / 0.92; spill 1.12 / 0.73 px
    assert out["add"][0] > 0.9 and out["clamp"][0] > 0.93, out
    assert out["add"][1] > 0.95 and out["clamp"][1] > 0.88, out       # no holes
    assert out["clamp"][2] < out["add"][2] - 0.2, out


def test_pose_warmup_keeps_a_restart_from_kicking_a_good_estimate(setup):
    """Adam's first update is ~lr * sign(g) whatever the gradient; the warm-up ramps it."""
    rig, s, qs = setup
    truth = _fresh(s)
    moved = {}
    for warm in (0, 8):
        s.cfg = s.cfg.replace(optimise_joints=True, optimise_cameras=True,
                              lr_warmup_steps=warm)
        s._build_optimisers()
        _reset(s, truth, qs)          # at the truth: any move is a kick
        s.restart_optimiser()
        s._do(s._step_fn(0), True)
        moved[warm] = np.abs(np.asarray(s.params["fixed_deltas"])).max()
    lr = s.cfg.lr_camera
    assert moved[0] > 0.5 * lr                       # without the ramp: a full-lr step
    assert moved[8] < 1.2 * lr / 9                   # with it: lr / (n + 1)
    s.cfg = s.cfg.replace(lr_warmup_steps=0)
    s._build_optimisers()


def test_pose_average_is_the_tail_mean_of_the_iterates():
    avg = C._PoseAverage(start=2)
    base = {"color_logits": jnp.ones(3)}
    for k, v in enumerate([10.0, 20.0, 1.0, 2.0, 3.0]):
        avg.add(k, {**base, **{key: jnp.full((2,), v) for key in C.POSE_KEYS}})
    out = avg.apply({**base, **{key: jnp.zeros(2) for key in C.POSE_KEYS}})
    for key in C.POSE_KEYS:
        np.testing.assert_allclose(np.asarray(out[key]), 2.0)   # mean of 1, 2, 3 only
    np.testing.assert_array_equal(np.asarray(out["color_logits"]), 1.0)
    one = C._PoseAverage(start=0)
    one.add(0, {key: jnp.full((2,), 5.0) for key in C.POSE_KEYS})
    p = {key: jnp.zeros(2) for key in C.POSE_KEYS}
    assert one.apply(p) is p                                   # a single iterate: unchanged


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nanmedian_views_equals_numpy_nanmedian(dtype):
    """The painting median: numpy's nanmedian values, odd and even counts, unseen points."""
    import warnings

    rng = np.random.default_rng(3)
    for views in (1, 2, 7, 32):
        x = rng.random((views, 5000, 3)).astype(dtype)
        x[rng.random((views, 5000)) < 0.6] = np.nan      # whole points unseen in a view
        x[:, :10] = np.nan                               # seen nowhere
        x[1:, 10:20] = 0.25                              # seen by every view but the first,
        x[0, 10:20, 1] = np.nan                          # which lacks one channel
        with warnings.catch_warnings():                  # all-NaN columns
            warnings.simplefilter("ignore", RuntimeWarning)
            ref = np.nanmedian(x, axis=0)
        got = C.nanmedian_views(x)
        assert got.dtype == ref.dtype
        np.testing.assert_array_equal(got, ref)          # NaN where ref is NaN, else equal
        assert np.isnan(got[:10]).all()
        assert np.isfinite(got[10:20]).all() == (views > 1)


def test_wrist_views_weigh_fully_in_colour_steps_and_little_in_pose_steps(setup):
    """Pose steps: wrist 0.1 / fixed 1.0 (paper); colour steps and held-out L1: all 1.0."""
    rig, s, qs = setup
    _reset(s, _fresh(s), qs)
    idx = jnp.arange(N_FRAMES, dtype=jnp.int32)
    # targets = the exact float renders (zero residual) except one wrist view, all black
    images = list(C.render_batch(s.static, s.params, s.bufs.q[idx],
                                 s.params["corrections"][idx], 0))
    wrist = s.cameras.index("cam_left_wrist")
    images[wrist] = jnp.zeros_like(images[wrist])
    bufs = s.bufs._replace(images=(tuple(images),))
    colour = float(C._photometric(s.static, s.params, bufs, idx, 0, 0.0, False))
    pose = float(C._photometric(s.static, s.params, bufs, idx, 0, 0.0, True))
    w = np.asarray(s.static.cam_weight)
    assert w[wrist] == pytest.approx(0.1)
    assert np.all(np.asarray(s.static.colour_weight) == 1.0)
    err = colour * len(s.cameras)            # the wrist view's mean error
    assert err > 0.05
    assert pose == pytest.approx(err * w[wrist] / w.sum(), rel=1e-4)


def test_flat_levels_show_one_colour_per_geom_side(setup):
    """A flat level shows one colour per (geom, normal direction) group.

    Unflattening hands exactly that appearance to the textured levels.
    """
    import mujoco

    rig, s, qs = setup
    g = C.rig_gaussians(load_mjmodel(rig), 3000, seed=2, exclude_planes=False)
    part = np.asarray(g.part)
    assert part.min() == 0 and np.array_equal(np.unique(part), np.arange(part.max() + 1))
    model = load_mjmodel(rig)
    from realsim_core.se3 import quat_xyzw_to_matrix
    normals = np.asarray(quat_xyzw_to_matrix(jnp.asarray(g.quats)))[:, :, 2]
    for p in np.unique(part):           # a group never spans two bodies or two sides
        sel = part == p
        assert len(np.unique(g.body[sel])) == 1
        nrm = normals[sel]               # one dominant signed axis (up to float32 ties)
        a = np.argmax(np.abs(nrm).sum(0))
        sign = np.sign(nrm[:, a].sum())
        assert np.all(sign * nrm[:, a] >= np.abs(nrm).max(1) - 1e-4)
    box = [i for i in range(model.ngeom) if model.geom_type[i] == mujoco.mjtGeom.mjGEOM_BOX
           and model.body_weldid[model.geom_bodyid[i]] != 0]
    assert box  # the links' boxes split into up to six sides
    assert len(np.unique(part[g.body == model.geom_bodyid[box[0]]])) >= 3

    _reset(s, _fresh(s), qs)
    ps = s.static.gauss.part
    n = int(ps.max()) + 1
    flat_static = s.static._replace(flat_levels=1, n_parts=n)
    rng = np.random.default_rng(3)
    params = {**s.params,
              "color_logits": jnp.asarray(rng.normal(0, 2, s.params["color_logits"].shape),
                                          jnp.float32),
              "opacity_logits": jnp.asarray(rng.normal(0, 2, s.params["opacity_logits"].shape),
                                            jnp.float32)}
    col, op = (np.asarray(x, np.float64) for x in C._colours(params, flat_static, 0))
    raw = 1 / (1 + np.exp(-np.asarray(params["color_logits"], np.float64)))
    ps_np = np.asarray(ps)
    for p in rng.choice(n, 10, replace=False):   # reference: a plain per-group mean
        sel = ps_np == p
        np.testing.assert_allclose(col[sel], np.broadcast_to(raw[sel].mean(0), col[sel].shape),
                                   atol=1e-5)
        assert np.ptp(op[sel]) < 1e-6
    raw_col, _ = C._colours(params, flat_static, 1)   # levels >= flat_levels: untouched
    np.testing.assert_allclose(np.asarray(raw_col), raw, atol=1e-6)

    q = s.bufs.q[:1]
    before = C.render_batch(flat_static, params, q, params["corrections"][:1], 0)
    s.static, saved = flat_static, s.static
    try:
        s.params = params
        s._unflatten_colours(0)
        after = C.render_batch(saved, s.params, q, s.params["corrections"][:1], 0)
    finally:
        s.static = saved
    for a, b in zip(before, after):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-3)


def test_flat_level_fixed_camera_moves_are_discarded_on_request(setup):
    """With flat_fixed_cameras="discard" the fixed cameras leave the flat level at the start.

    The textured level's single short cycle cannot undo a large move by itself.
    """
    rig, s0, qs = setup
    cfg = s0.cfg.replace(levels=(1, 1), cycles_per_level=(6, 1), flat_colour_levels=1,
                         flat_static=True, flat_fixed_cameras="discard", pose_steps=2,
                         optimise_joints=False, lr_warmup_steps=0, lr_final_fraction=1.0)
    gauss = C.rig_gaussians(load_mjmodel(rig), N_GAUSS, seed=0, exclude_planes=False)
    s = C.CalibrationSession(rig, load_mjmodel(rig), s0.full_intrinsics, gauss, cfg,
                             max_frames=N_FRAMES)
    truth = _fresh(s)
    delta = np.zeros((len(rig.fixed_cameras), 6), np.float32)
    delta[:, :3] = 0.02                             # both fixed cameras 35 mm off
    truth["fixed_deltas"] = jnp.asarray(delta)
    _reset(s, truth, qs)
    seen = []
    s.run(callback=lambda m: seen.append(
        (m.level, np.abs(np.asarray(s.params["fixed_deltas"])).max())))
    flat_moves = [v for lvl, v in seen if lvl == 0]
    assert len(flat_moves) == 6 and flat_moves[-1] > 3 * cfg.lr_camera   # moved at the flat level
    # level 1 restarted from zero: one cycle of 2 Adam steps moves at most ~2 lr per
    # parameter ("keep" would leave it > 3 lr - 2 lr away from zero)
    textured = [v for lvl, v in seen if lvl == 1]
    assert textured and textured[-1] <= 2.2 * cfg.lr_camera
    with pytest.raises(C.RealsimError, match="flat_fixed_cameras"):
        cfg.replace(flat_fixed_cameras="frozen")
    with pytest.raises(C.RealsimError, match="flat_colour_levels"):
        cfg.replace(flat_colour_levels=3)


@pytest.mark.parametrize("start,painted_warmup", [("flat", None), ("paint", None),
                                                   ("paint", 2)])
def test_textured_start_paints_the_first_textured_level_at_the_flat_estimate(
        setup, monkeypatch, start, painted_warmup):
    """The first textured level starts from colours painted at the flat estimate, or not.

    "paint": after the flat level the colours are painted from the images at the flat
    level's estimate, then warmed up for painted_warmup_steps (None: warmup_colour_steps);
    "flat" keeps the flat colours spread to every Gaussian (and the short warm-up of a
    later level).
    """
    rig, s0, qs = setup
    cfg = s0.cfg.replace(levels=(1, 1), cycles_per_level=(3, 1), flat_colour_levels=1,
                         flat_static=True, textured_start=start, pose_steps=2,
                         warmup_colour_steps=5, colour_steps=1, optimise_joints=False,
                         lr_warmup_steps=0, lr_final_fraction=1.0,
                         painted_warmup_steps=painted_warmup)
    gauss = C.rig_gaussians(load_mjmodel(rig), N_GAUSS, seed=0, exclude_planes=False)
    s = C.CalibrationSession(rig, load_mjmodel(rig), s0.full_intrinsics, gauss, cfg,
                             max_frames=N_FRAMES)
    truth = _fresh(s)
    delta = np.zeros((len(rig.fixed_cameras), 6), np.float32)
    delta[0, :3] = [0.006, -0.004, 0.005]
    truth["fixed_deltas"] = jnp.asarray(delta)
    _reset(s, truth, qs)
    painted, cycles = [], []
    real_init, real_cycle = s.init_colours_from_frames, s.cycle

    def init_colours(*a, **k):
        before = np.asarray(s.params["color_logits"]).copy()
        real_init(*a, **k)
        changed = np.abs(np.asarray(s.params["color_logits"]) - before).max(axis=-1) > 1e-3
        painted.append((np.asarray(s.params["fixed_deltas"]).copy(), changed.mean()))

    def cycle(level=None, colour_steps=None):
        cycles.append((level, colour_steps))
        return real_cycle(level, colour_steps)

    monkeypatch.setattr(s, "init_colours_from_frames", init_colours)
    monkeypatch.setattr(s, "cycle", cycle)
    flat_end = []
    s.run(callback=lambda m: m.level == 0 and flat_end.append(
        np.asarray(s.params["fixed_deltas"]).copy()))
    # the flat level's warm-up, its 3 cycles, then the textured level's warm-up and cycle
    warm = (3 * cfg.colour_steps if start == "flat" else
            5 if painted_warmup is None else painted_warmup)
    assert cycles == [(0, 5), (0, None), (0, None), (0, None), (1, warm), (1, None)]
    assert cfg.schedule_plan() == [(0, 5), (1, warm)]
    assert s.metrics.steps == cfg.schedule_steps()     # what the progress bar counts to
    if start == "flat":
        assert painted == []        # init_colours=False: nothing paints in this schedule
        return
    (pose, share), = painted
    assert np.abs(pose).max() > 0   # painted at the flat level's (moved) estimate ...
    np.testing.assert_allclose(pose, flat_end[-1])     # ... its last iterate (no averaging)
    assert share > 0.5              # most Gaussians got a colour from the images
    with pytest.raises(C.RealsimError, match="textured_start"):
        cfg.replace(textured_start="painted")


def test_painted_warmup_steps_shortens_only_the_painted_levels_first_pass():
    """`painted_warmup_steps` sets the painted level's warm-up, and only that.

    The first level and the repaint passes (colours painted afresh, not yet fitted) keep
    warmup_colour_steps; without a painted level the setting does nothing.
    """
    base = C.CalibrationConfig(levels=(2, 1), cycles_per_level=(20, 20), flat_colour_levels=1,
                               textured_start="paint", repaint_passes=2,
                               warmup_colour_steps=60, colour_steps=4, pose_steps=4)
    assert base.schedule_plan() == [(0, 60), (1, 60), (1, 60), (1, 60)]
    short = base.with_overrides([("painted_warmup_steps", "30")])
    assert short.painted_warmup_steps == 30 and isinstance(short.painted_warmup_steps, int)
    assert short.schedule_plan() == [(0, 60), (1, 30), (1, 60), (1, 60)]
    assert base.schedule_steps() - short.schedule_steps() == 30
    flat = short.replace(textured_start="flat")          # no painted level
    assert flat.schedule_plan() == [(0, 60), (1, 12), (1, 60), (1, 60)]
    assert short.with_overrides([("painted_warmup_steps", "none")]) == base
    with pytest.raises(C.RealsimError, match="painted_warmup_steps.*integer"):
        base.with_overrides([("painted_warmup_steps", "3.5")])
    with pytest.raises(C.RealsimError, match="painted_warmup_steps must be >= 0"):
        base.replace(painted_warmup_steps=-1)


@pytest.fixture
def restore_appearance(setup):
    """Leave the shared session as it was.

    Later tests take its appearance as their truth (_fresh) and its frame buffer (held-out
    flags included) as they left it.
    """
    _, s, _ = setup
    saved = dict(s.__dict__)
    yield
    s.__dict__.clear()
    s.__dict__.update(saved)


@pytest.mark.parametrize("judge", ["fitted", "painted"])
def test_repaint_passes_repaint_at_the_accepted_estimate_and_rerun_the_last_level(
        setup, monkeypatch, request, judge):
    rig, s, qs = setup
    if judge == "painted":      # later tests see the session as the fitted run left it
        request.getfixturevalue("restore_appearance")
    truth = _fresh(s)
    delta = np.zeros((len(rig.fixed_cameras), 6), np.float32)
    delta[0, :3] = [0.004, -0.003, 0.002]
    truth["fixed_deltas"] = jnp.asarray(delta)
    _reset(s, truth, qs)
    saved_cfg = s.cfg
    s.cfg = s.cfg.replace(cycles_per_level=(2,), repaint_passes=1, repaint_acceptance=judge,
                          repaint_tolerance=0.25)
    painted, judged = [], []     # poses the repaints start from; (iterate, accepted) per test
    tolerances = []
    real_init, real_accept = s.init_colours_from_frames, s.try_accept

    def init_colours(*a, **k):
        painted.append(np.asarray(s.params["fixed_deltas"]).copy())
        return real_init(*a, **k)

    def try_accept(label="", painted=False, tolerance=0.0):
        iterate = np.asarray(s.params["fixed_deltas"]).copy()
        ok = real_accept(label, painted, tolerance)
        judged.append((len(cycles), iterate, np.asarray(s.accepted["fixed_deltas"]).copy(), ok))
        tolerances.append(tolerance)
        return ok

    monkeypatch.setattr(s, "init_colours_from_frames", init_colours)
    monkeypatch.setattr(s, "try_accept", try_accept)
    cycles = []
    n_judged = len(s.metrics.judgements)
    try:
        s.run(callback=lambda m: cycles.append(m.level))
    finally:
        s.cfg = saved_cfg
        monkeypatch.undo()      # before restore_appearance puts the session back
    assert cycles == [0, 0, 0, 0]                    # the level, then its repainted pass
    assert [j[0] for j in judged] == [2, 4]          # each pass judged on its own
    assert tolerances == [0.0, 0.25]                 # the tolerance is the repaint passes'
    # each test is recorded under its pass's name, with its verdict; an accepted
    # candidate's held-out L1 becomes the accepted one
    record = s.metrics.judgements[n_judged:]
    assert [r[0] for r in record] == ["level 1/1", "repaint 1"]
    assert [r[3] for r in record] == [j[3] for j in judged]
    # the level is judged on fitted colours; the repaint pass as configured
    assert [r[4] for r in record] == [False, judge == "painted"]
    for (_, _, h, ok, _), (_, iterate, accepted, _) in zip(record, judged):
        assert np.isfinite(h)
        assert ok == np.array_equal(iterate, accepted)
    last_ok = [(h, p) for _, _, h, ok, p in record if ok]
    if last_ok and not last_ok[-1][1]:
        assert s.metrics.holdout_l1 == last_ok[-1][0]
    # the repaint starts from what the first test left accepted (here the first pass is
    # rejected, so that is the start, not the pass's last iterate)
    (start_pose,) = painted                          # this config does not paint at start
    np.testing.assert_array_equal(start_pose, judged[0][2])
    assert s.metrics.holdout_l1 <= s.metrics.holdout_l1_start
    with pytest.raises(C.RealsimError, match="repaint_passes"):
        C.CalibrationConfig(repaint_passes=-1)


def test_repaint_min_gain_stops_the_repaint_passes(setup, monkeypatch, restore_appearance):
    """No repaint pass follows one that lowered the held-out L1 by less than the minimum.

    At 0.99 no pass can gain enough (that would take the L1 to a hundredth), so of three
    configured passes only the first runs; the run says how many it skipped.
    """
    rig, s, qs = setup
    truth = _fresh(s)
    delta = np.zeros((len(rig.fixed_cameras), 6), np.float32)
    delta[0, :3] = [0.004, -0.003, 0.002]
    truth["fixed_deltas"] = jnp.asarray(delta)
    _reset(s, truth, qs)
    s.cfg = s.cfg.replace(cycles_per_level=(2,), repaint_passes=3, repaint_min_gain=0.99)
    painted = []
    real_init = s.init_colours_from_frames

    def init_colours(*a, **k):
        painted.append(len(cycles))
        return real_init(*a, **k)

    monkeypatch.setattr(s, "init_colours_from_frames", init_colours)
    cycles = []
    try:
        m = s.run(callback=lambda m: cycles.append(m.level))
    finally:
        monkeypatch.undo()      # before restore_appearance puts the session back
    assert cycles == [0, 0, 0, 0]            # the level, then one repaint pass
    assert painted == [2]                    # painted once, for that pass
    assert [j[0] for j in m.judgements] == ["level 1/1", "repaint 1"]
    assert m.repaints_skipped == 2
    assert m.holdout_l1 <= m.holdout_l1_start
    for bad in (-0.1, 1.0):
        with pytest.raises(C.RealsimError, match="repaint_min_gain"):
            C.CalibrationConfig(repaint_min_gain=bad)


def test_repaint_tolerance_accepts_within_it_of_the_best_and_never_above_the_start(
        setup, restore_appearance):
    """A tolerated candidate is within (1 + tolerance) of the lowest accepted held-out L1.

    Candidates further from the truth score higher (checked); the test then judges them
    against controlled references: tolerance 0 is the strict test, a tolerance just above
    or below the candidate's excess accepts or rejects it, the start's fitted L1 caps any
    tolerance, and a chain of tolerated candidates is measured from the best accepted one,
    not the last.
    """
    rig, s, qs = setup
    truth = _fresh(s)
    _reset_with_holdout(s, truth, qs)

    def moved(mm):
        delta = np.zeros((len(rig.fixed_cameras), 6), np.float32)
        delta[0, :3] = np.array([1.0, -1.0, 0.5]) * mm * 1e-3
        return dict(truth, fixed_deltas=jnp.asarray(delta))

    best, cand, worse = moved(1.0), moved(2.0), moved(3.0)
    h0, h1, h2 = (s.holdout_residual(p) for p in (best, cand, worse))
    assert h0 < h1 < h2
    excess = h1 / h0 - 1

    def judge(candidate, tolerance, start=1.0, accepted=best, l1=h0, l1_best=math.nan):
        s.accepted, s.params = dict(accepted), dict(candidate)
        s.metrics = C.Metrics(holdout_l1_start=start, holdout_l1=l1, holdout_l1_best=l1_best)
        return s.try_accept("candidate", tolerance=tolerance)

    def accepted_deltas():
        return np.asarray(s.accepted["fixed_deltas"])

    assert not judge(cand, 0.0)                                   # strict
    assert not judge(cand, 0.9 * excess)
    np.testing.assert_array_equal(accepted_deltas(), np.asarray(best["fixed_deltas"]))
    np.testing.assert_array_equal(np.asarray(s.params["fixed_deltas"]), accepted_deltas())
    assert judge(cand, 1.1 * excess, l1_best=h0)
    np.testing.assert_array_equal(accepted_deltas(), np.asarray(cand["fixed_deltas"]))
    m = s.metrics
    assert (m.holdout_l1, m.holdout_l1_best) == (h1, h0)   # the accepted one's; the best
    assert m.judgements == [("candidate", 0, h1, True, False)]
    assert not judge(cand, 1.0, start=0.999 * h1)                 # never above the start
    # the next candidate is within tolerance of the tolerated one but not of the best
    step = 1.01 * (h2 / h1 - 1)
    assert h2 > h0 * (1 + step)
    assert not judge(worse, step, accepted=cand, l1=h1, l1_best=h0)
    assert judge(worse, step, accepted=cand, l1=h1)               # no best on record
    for bad in (-0.01, 1.5, math.nan):
        with pytest.raises(C.RealsimError, match="repaint_tolerance"):
            C.CalibrationConfig(repaint_tolerance=bad)


def _reset_with_holdout(session, truth_params, qs):
    """As _reset, the last frame held out (painted judges need training frames to paint)."""
    _reset(session, truth_params, qs[:-1])
    (imgs,) = _render_targets(session, truth_params, qs[-1:])
    session.add_frame(imgs, qs[-1], holdout=True)


def test_painted_params_paints_at_the_given_poses_without_touching_the_session(
        setup, restore_appearance):
    rig, s, qs = setup
    truth = _fresh(s)
    _reset_with_holdout(s, truth, qs)
    moved = dict(truth, fixed_deltas=truth["fixed_deltas"] + 0.01)
    before = {k: np.asarray(v).copy() for k, v in s.params.items()}
    painted = s.painted_params(moved)
    for k, v in s.params.items():                       # the session is not touched
        np.testing.assert_array_equal(np.asarray(v), before[k])
    np.testing.assert_array_equal(np.asarray(painted["fixed_deltas"]),
                                  np.asarray(moved["fixed_deltas"]))
    changed = np.any(np.asarray(painted["color_logits"]) != before["color_logits"], axis=-1)
    assert changed.mean() > 0.3                          # most Gaussians got an image colour
    # init_colours_from_frames is painted_params at the current estimate
    s.params = dict(moved)
    s.init_colours_from_frames()
    np.testing.assert_array_equal(np.asarray(s.params["color_logits"]),
                                  np.asarray(painted["color_logits"]))


def test_painting_never_reads_the_held_out_frames(setup, restore_appearance):
    """The held-out test scores colours painted from the training frames only.

    The held-out frame sits among the first (painted) frames; its images are replaced by
    their negative: the paint must not change, while the same frame buffered for training
    does change it (so the frame is within reach of the painting).
    """
    rig, s, qs = setup
    truth = _fresh(s)
    moved = dict(truth, fixed_deltas=truth["fixed_deltas"] + 0.01)
    n = 4                                                   # < the 8 painted frames

    def paint(holdout, negative):
        _reset(s, truth, qs[:n - 1])
        (imgs,) = _render_targets(s, truth, qs[n - 1:n])
        if negative:
            imgs = {c: 255 - im for c, im in imgs.items()}
        s.add_frame(imgs, qs[n - 1], holdout=holdout)
        s.params = dict(moved)
        s.init_colours_from_frames()
        return np.asarray(s.params["color_logits"])

    held = paint(True, False)
    np.testing.assert_array_equal(held, paint(True, True))
    trained = paint(False, False)
    assert not np.array_equal(trained, paint(False, True))
    assert not np.array_equal(held, trained)


def test_spread_painting_reads_frames_spread_over_the_stamps(setup, restore_appearance):
    """`paint_frames: spread` paints from frames evenly spaced in stamp order.

    Four training frames whose buffer slots are not in stamp order (stamps 30, 10, 40, 20),
    two painted (`paint_frame_count`): "spread" reads the earliest and the latest stamp
    (slots 1 and 2), "first" the first two slots. A frame is read when its images replaced
    by their negative change the paint.
    """
    rig, s, qs = setup
    truth = _fresh(s)
    moved = dict(truth, fixed_deltas=truth["fixed_deltas"] + 0.01)
    images = _render_targets(s, truth, qs)
    stamps = [30, 10, 40, 20]

    def paint(choice, negative=None):
        _reset(s, truth, [])
        s.cfg = s.cfg.replace(paint_frames=choice, paint_frame_count=2)
        for k, (q, imgs) in enumerate(zip(qs, images)):
            if k == negative:
                imgs = {c: 255 - im for c, im in imgs.items()}
            s.add_frame(imgs, q, stamp_ns=stamps[k], holdout=False)
        s.params = dict(moved)
        s.init_colours_from_frames()
        return np.asarray(s.params["color_logits"])

    for choice, read in (("spread", {1, 2}), ("first", {0, 1})):
        base = paint(choice)
        for k in range(len(qs)):
            changed = not np.array_equal(base, paint(choice, negative=k))
            assert changed == (k in read), (choice, k)
    # with no more training frames than are painted, both read them all
    _reset(s, truth, qs)
    s.cfg = s.cfg.replace(paint_frames="spread")
    s.params = dict(moved)
    s.init_colours_from_frames(max_frames=len(qs))
    spread = np.asarray(s.params["color_logits"])
    s.cfg = s.cfg.replace(paint_frames="first")
    s.params = dict(moved)
    s.init_colours_from_frames(max_frames=len(qs))
    np.testing.assert_array_equal(spread, np.asarray(s.params["color_logits"]))


def test_painted_acceptance_judges_the_poses_not_the_fitted_colours(setup, restore_appearance):
    """A painted test accepts true poses whose colours went astray; the fitted one does not.

    A painted test never passes an estimate above the start's fitted held-out L1.
    """
    rig, s, qs = setup
    truth = _fresh(s)
    # an appearance of its own (earlier tests leave theirs, often a blurry painting): a
    # patchy texture the painting can register
    texture = np.random.default_rng(0).normal(0, 1.5, np.shape(truth["color_logits"]))
    truth["color_logits"] = jnp.asarray(texture, jnp.float32)
    s.params = {**s.params, "color_logits": truth["color_logits"]}
    # joint offsets: they move the links differently in every frame and camera, which a
    # painting from a few frames registers (one fixed camera's offset is mostly painted
    # back into its own views: too weak a signal at 3 frames of 80x45)
    offsets = np.zeros(len(rig.joint_names), np.float32)
    for j, v in (("shoulder", 0.04), ("elbow", -0.04), ("wrist_angle", 0.05)):
        for arm in ("left", "right"):
            offsets[rig.joint_names.index(f"follower_{arm}/{j}")] = v
    truth["joint_offsets"] = jnp.asarray(offsets)
    _reset_with_holdout(s, truth, qs)
    nominal = dict(s.params)                    # nominal poses, the true appearance
    # colours gone astray wherever the training frames see the Gaussian (the ones
    # seen nowhere keep their colour in a painting)
    true_logits = np.asarray(truth["color_logits"])
    seen = np.any(np.asarray(s.painted_params(truth, C.PAINTED_JUDGE_FRAMES)
                             ["color_logits"]) != true_logits, axis=-1)
    assert seen.mean() > 0.3
    inverted = np.where(seen[..., None], -true_logits, true_logits)    # 1 - colour
    astray = dict(truth, color_logits=jnp.asarray(inverted, jnp.float32))
    # the painted score ranks the poses and ignores the estimate's own colours
    p_truth, p_nominal = s.painted_holdout_residual(truth), s.painted_holdout_residual(
        nominal)
    assert p_truth < p_nominal
    assert s.painted_holdout_residual(astray) == pytest.approx(p_truth, rel=1e-6)
    fitted_nominal, fitted_astray = s.holdout_residual(nominal), s.holdout_residual(astray)
    assert fitted_astray > fitted_nominal       # the fitted test prefers the wrong poses

    def judge(painted, start):
        s.accepted, s.params = dict(nominal), dict(astray)
        s.metrics = C.Metrics(holdout_l1_start=start, holdout_l1=fitted_nominal)
        return s.try_accept("candidate", painted=painted)

    assert not judge(False, start=1.0)
    assert s.metrics.judgements == [("candidate", 0, fitted_astray, False, False)]
    assert judge(True, start=1.0)
    (label, _, score, ok, painted), = s.metrics.judgements
    assert ok and painted and score == pytest.approx(p_truth, rel=1e-6)
    assert s.metrics.holdout_l1 == fitted_astray      # the accepted one's fitted L1
    np.testing.assert_array_equal(np.asarray(s.accepted["joint_offsets"]), offsets)
    # ... but not above the start's fitted held-out L1
    assert not judge(True, start=fitted_astray * 0.99)
    np.testing.assert_array_equal(np.asarray(s.accepted["joint_offsets"]),
                                  np.asarray(nominal["joint_offsets"]))
    with pytest.raises(C.RealsimError, match="repaint_acceptance"):
        C.CalibrationConfig(repaint_acceptance="painting")


def test_stop_request_ends_a_cycle_without_stepping(setup):
    """A node shutting down sets stop_requested; the running cycle's later steps return."""
    _, s, _ = setup
    steps = s.metrics.steps
    s.stop_requested = True
    try:
        s.cycle(0, colour_steps=3)
    finally:
        s.stop_requested = False
    assert s.metrics.steps == steps





def test_surfel_shading_matches_float64_reference():
    """World- and camera-frame SH shading of surfel normals, against a numpy reference."""
    from scipy.spatial.transform import Rotation

    rng = np.random.default_rng(3)
    n = 64
    quats = Rotation.random(n, random_state=4).as_quat()              # xyzw
    means = rng.normal(0, 0.3, (n, 3))
    cam = np.eye(4)
    cam[:3, :3] = Rotation.from_rotvec([0.3, -1.2, 0.5]).as_matrix()
    cam[:3, 3] = [0.2, -0.5, 0.8]
    coef = rng.normal(0, 0.5, (2, 9))

    def basis(v):
        x, y, z = v
        return np.array([1, x, y, z, x * y, y * z, x * z, x * x - y * y, 3 * z * z - 1])

    ref = np.empty(n)
    for i in range(n):
        normal = Rotation.from_quat(quats[i]).as_matrix()[:, 2]
        if normal @ (cam[:3, 3] - means[i]) < 0:        # seen from behind: the other side
            normal = -normal
        ref[i] = coef[0] @ basis(normal) + coef[1] @ basis(cam[:3, :3].T @ normal)
    got = np.asarray(C.surfel_shading(jnp.asarray(coef, jnp.float32),
                                      jnp.asarray(quats, jnp.float32),
                                      jnp.asarray(means, jnp.float32),
                                      jnp.asarray(cam, jnp.float32)))
    np.testing.assert_allclose(got, ref, atol=2e-5)
    # the initial coefficients shade every surfel by exactly 1
    one = C.surfel_shading(C.shading_init(), jnp.asarray(quats, jnp.float32),
                           jnp.asarray(means, jnp.float32), jnp.asarray(cam, jnp.float32))
    np.testing.assert_array_equal(np.asarray(one), 1.0)


def test_learned_shading_explains_lighting_that_flat_colours_cannot(setup):
    """Learned shading fits lighting that per-surfel colours cannot.

    Targets are lit from above and by a light on each camera. With the poses at the truth,
    colour steps with `shading="sh2"` fit them far better than per-surfel colours alone
    (a link's colour changes as it turns; the table looks different from each camera).
    """
    rig, s, qs = setup
    truth = _fresh(s)
    truth["shading"] = jnp.asarray([[0.45, 0, 0, 0.25, 0, 0, 0, 0, 0],     # world: from above
                                    [0.15, 0, 0, -0.15, 0, 0, 0, 0, 0]],   # camera: head-on
                                   jnp.float32)
    images = _render_targets(s, truth, qs)
    idx = jnp.arange(N_FRAMES, dtype=jnp.int32)
    model = load_mjmodel(rig)
    gauss = C.rig_gaussians(model, N_GAUSS, seed=0, layout="random",   # the fixture's
                            exclude_planes=False)
    fits = {}
    for shading in ("none", "sh2"):
        cfg = s.cfg.replace(shading=shading, colour_steps=0, pose_steps=0, lr_colour=3e-2,
                            lr_shading=1e-2, cull_backfaces=False)
        t = C.CalibrationSession(rig, model, s.full_intrinsics, gauss, cfg,
                                 max_frames=N_FRAMES)
        for q, im in zip(qs, images):
            t.add_frame(im, q)
        before = float(C._photometric(t.static, t.params, t.bufs, idx, 0, 0.0))
        t.cycle(0, colour_steps=150)
        fits[shading] = (before, float(C._photometric(t.static, t.params, t.bufs, idx, 0, 0.0)))
        if shading == "none":           # not used, not moved
            np.testing.assert_array_equal(np.asarray(t.params["shading"]),
                                          np.asarray(C.shading_init()))
    # measured: 0.71x after the other tests of this module ran on the shared fixture,
    # < 0.5x alone; without shading the two would be equal
    assert fits["sh2"][1] < 0.8 * fits["none"][1], fits
    assert fits["none"][1] < fits["none"][0], fits


def test_prior_weight_last_is_used_at_the_last_of_several_levels():
    """The last level of a coarse-to-fine schedule gets `prior_weight_last`.

    A one-level schedule (the online engine) keeps `prior_weight` at its only level.
    """
    cfg = C.CalibrationConfig(levels=(2, 1), cycles_per_level=(20, 10), prior_weight=1e-3,
                              prior_weight_last=1e-4)
    assert [cfg.level_prior_weight(i) for i in range(2)] == [1e-3, 1e-4]
    assert cfg.replace(levels=(2,), cycles_per_level=(10,)).level_prior_weight(0) == 1e-3
    assert cfg.replace(prior_weight_last=None).level_prior_weight(1) == 1e-3
    with pytest.raises(C.RealsimError, match="filter_px2"):
        C.CalibrationConfig(filter_px2=0.0)


def test_pose_gradient_clip_ignores_the_colour_gradient(setup):
    """The step computes every gradient; only the pose groups' may decide the pose clip.

    Adam is invariant to one gradient's scale but not to a step scaled differently from
    the others: a colour gradient far above the clip norm in one step must not shrink that
    step's pose gradient (and so the pose update) compared with a step without it.
    """
    rig, s, qs = setup
    s.cfg = s.cfg.replace(optimise_joints=True, optimise_cameras=True)
    s._build_optimisers()
    params = _fresh(s)
    zero = jax.tree_util.tree_map(jnp.zeros_like, params)
    g = dict(zero, joint_offsets=jnp.full_like(params["joint_offsets"], 0.1),
             fixed_deltas=jnp.full_like(params["fixed_deltas"], -0.05))
    loud = dict(g, color_logits=jnp.full_like(params["color_logits"], 1e3))

    def second_update(second):
        state = s._pose_opt.init(params)
        _, state = s._pose_opt.update(g, state, params)
        up, _ = s._pose_opt.update(second, state, params)
        return up

    quiet_up, loud_up = second_update(g), second_update(loud)
    for k in ("joint_offsets", "fixed_deltas"):
        np.testing.assert_allclose(np.asarray(loud_up[k]), np.asarray(quiet_up[k]),
                                   rtol=1e-6, atol=1e-9)
    assert float(jnp.abs(loud_up["color_logits"]).max()) == 0.0
    # the clip itself still acts on a pose gradient above its norm: the update is the one
    # of that gradient scaled to the norm
    norm = float(jnp.sqrt(sum(jnp.sum(jnp.square(g[k])) for k in C.POSE_KEYS)))
    assert norm < C.POSE_CLIP_NORM
    big_up = second_update(jax.tree_util.tree_map(lambda x: x * 1e4, loud))
    at_norm = second_update(jax.tree_util.tree_map(lambda x: x * C.POSE_CLIP_NORM / norm, g))
    for k in ("joint_offsets", "fixed_deltas"):
        np.testing.assert_allclose(np.asarray(big_up[k]), np.asarray(at_norm[k]), rtol=1e-5)
        assert not np.allclose(np.asarray(big_up[k]), np.asarray(quiet_up[k]), rtol=1e-3)


def test_config_overrides_read_each_field_as_its_type():
    cfg = C.CalibrationConfig().with_overrides([
        ("wrist_weight", "0.3"), ("cycles_per_level", "30, 10"), ("levels", "2,1"),
        ("prior_weight_last", "none"), ("cull_backfaces", "off"), ("plane_edges", "soft"),
        ("pose_steps", "6")])
    assert cfg.wrist_weight == 0.3 and cfg.cycles_per_level == (30, 10)
    assert cfg.levels == (2, 1) and cfg.prior_weight_last is None
    assert cfg.cull_backfaces is False and cfg.plane_edges == "soft" and cfg.pose_steps == 6
    # a tuple of names, read from a comma-separated list with or without spaces
    cams = C.CalibrationConfig().with_overrides([("repaint_lod_bias_cameras", "cam_low, x")])
    assert cams.repaint_lod_bias_cameras == ("cam_low", "x")
    assert C.CalibrationConfig().with_overrides([]) == C.CalibrationConfig()
    for bad, msg in [(("pose_steps", "2.5"), "cannot read '2.5' as int"),
                     (("wrist_weight", "none"), "cannot read 'none' as float"),
                     (("cull_backfaces", "maybe"), "cannot read 'maybe' as bool"),
                     (("colour_step", "4"), "did you mean colour_steps?"),
                     (("repaint_passes", "-1"), "repaint_passes must be >= 0"),
                     (("mounted_world_joints", "-3"), "mounted_world_joints must be >= 0"),
                     (("plane_lod_bias", "nan"), "plane_lod_bias must be in"),
                     (("plane_lod_bias", "-9"), "plane_lod_bias must be in"),
                     (("repaint_plane_lod_bias", "nan"), "repaint_plane_lod_bias must be"),
                     (("repaint_plane_lod_bias", "8.5"), "repaint_plane_lod_bias must be"),
                     (("repaint_lod_bias_exclude", "cam_high"),
                      "repaint_lod_bias_exclude must be 'none' or 'main_painter'"),
                     (("paint_frames", "last"), "paint_frames must be 'first' or 'spread'"),
                     (("paint_frame_count", "0"), "paint_frame_count must be >= 1"),
                     (("levels", "8,4,2,1"), "cycles_per_level needs one entry per level")]:
        with pytest.raises(C.RealsimError, match=msg.replace("?", r"\?")):
            C.CalibrationConfig().with_overrides([bad])


def test_a_wrist_camera_does_not_paint_its_own_gripper_when_self_paint_is_off(setup):
    """`self_paint=False`: a wrist view does not fit the colours of its own gripper.

    It sends no colour/opacity gradient to the Gaussians that move with it, the same
    gradient to every other Gaussian, the same pixels and pose gradient; the median paint
    skips those Gaussians in its view.
    """
    rig, s, qs = setup
    _reset(s, _fresh(s), qs)
    model = load_mjmodel(rig)
    own = C.own_gaussians(rig, model, np.asarray(s.static.gauss.body), s.cameras)
    wrist, other = s.cameras.index("cam_left_wrist"), s.cameras.index("cam_right_wrist")
    left = set(C.subtree_bodies(model, rig.camera("cam_left_wrist").mount))
    body = np.asarray(s.static.gauss.body)
    assert not own[s.cameras.index("cam_high")].any()                 # fixed: nothing
    np.testing.assert_array_equal(own[wrist], np.isin(body, sorted(left)))
    assert own[wrist].sum() > 50 and not (own[wrist] & own[other]).any()
    off = s.static._replace(own=jnp.asarray(own, jnp.float32))
    idx = jnp.arange(2, dtype=jnp.int32)
    target = [jnp.full_like(x, 0.3) for x in C.render_batch(
        s.static, s.params, s.bufs.q[idx], s.params["corrections"][idx], 0)]

    def loss(params, static):          # the left wrist view only
        r = C.render_batch(static, params, s.bufs.q[idx], params["corrections"][idx], 0)
        return jnp.abs(r[wrist] - target[wrist]).sum()

    keys = ("color_logits", "opacity_logits", "joint_offsets", "mounted_deltas")
    g_on = jax.grad(loss)(s.params, s.static)
    g_off = jax.grad(loss)(s.params, off)
    assert float(loss(s.params, off)) == pytest.approx(float(loss(s.params, s.static)),
                                                       rel=1e-6)
    for k in keys[:2]:
        on, of = np.asarray(g_on[k]), np.asarray(g_off[k])
        assert np.abs(on[own[wrist]]).max() > 0                          # seen and painted
        assert np.abs(of[own[wrist]]).max() == 0.0                        # ... not any more
        np.testing.assert_allclose(of[~own[wrist]], on[~own[wrist]], rtol=1e-5, atol=1e-9)
    for k in keys[2:]:
        np.testing.assert_allclose(np.asarray(g_off[k]), np.asarray(g_on[k]), rtol=1e-5,
                                   atol=1e-9)
    # median paint from the left wrist view alone, all black: with self_paint off its own
    # gripper keeps its (light) colours
    images = tuple(jnp.zeros_like(x) for x in s.bufs.images[0])
    valid = s.bufs.valid
    s.bufs = s.bufs._replace(images=(images,), valid=jnp.zeros_like(valid).at[:, wrist].set(1))
    static, start = s.static, dict(s.params)
    try:
        painted = {}
        for name, st in (("on", static), ("off", off)):
            s.static, s.params = st, dict(start)
            s.init_colours_from_frames()
            painted[name] = np.asarray(jax.nn.sigmoid(s.params["color_logits"]))
    finally:
        s.static, s.params = static, start
        s.bufs = s.bufs._replace(valid=valid)
    c0 = np.asarray(jax.nn.sigmoid(start["color_logits"]))[own[wrist]]
    assert c0.max(axis=1).min() > 0.2
    assert (painted["on"][own[wrist]].max(axis=1) < 0.01).sum() >= 5     # in its view
    np.testing.assert_array_equal(painted["off"][own[wrist]], c0)


def test_mounted_world_coordinates_round_trip_and_hold_the_wrist_camera_at_qbar(setup):
    """`mounted_world_joints`: the coordinates the pose optimiser sees for wrist cameras.

    The chain is the three wrist joints; u -> params -> u is the identity; in u a wrist
    joint's offset does not move its wrist camera at the reference joints (it does
    elsewhere), a shoulder offset still does; a step in these coordinates evaluates the
    same objective as a plain one, and colour steps leave the poses bit for bit.
    """
    rig, s, qs = setup
    km = s.static.km
    model = load_mjmodel(rig)
    chain = C.mounted_chain_joints(rig, model, 3)
    names = [[rig.joint_names[j] for j in np.flatnonzero(r)] for r in chain]
    assert names == [[f"follower_{a}/{j}" for j in ("forearm_roll", "wrist_angle",
                                                   "wrist_rotate")]
                     for a in ("left", "right")]
    chain = jnp.asarray(chain)
    rng = np.random.default_rng(5)
    p = {k: jnp.asarray(rng.normal(size=np.shape(v)) * 0.02, jnp.float32)
         for k, v in s.nominal.items() if k != "corrections"}
    qbar = jnp.asarray(np.mean(qs, axis=0), jnp.float32)
    u = C._mounted_to_world(km, p, qbar, chain)
    np.testing.assert_allclose(C._mounted_from_world(km, u, qbar, chain)["mounted_deltas"],
                               p["mounted_deltas"], atol=2e-5)
    assert float(jnp.abs(u["mounted_deltas"] - p["mounted_deltas"]).max()) > 1e-3
    np.testing.assert_array_equal(u["joint_offsets"], p["joint_offsets"])

    def cams(params, q):
        z = jnp.zeros_like(params["joint_offsets"])
        return np.asarray(C.kinematics.forward(km, q, params["joint_offsets"], z,
                                               params["fixed_deltas"],
                                               params["mounted_deltas"]).cameras)

    wrist = [rig.camera_names.index(c.name) for c in rig.mounted_cameras]
    far = jnp.asarray(qs[0], jnp.float32)
    a = C._mounted_from_world(km, u, qbar, chain)
    # wrist_rotate turns about the axis the mount hangs from: its offset and the mount's
    # roll are the same camera pose at every joint value (the exact weak pair), so in u it
    # moves the camera nowhere; wrist_angle's does away from qbar
    for joint, at_qbar_moves, far_moves in (("wrist_angle", False, True),
                                            ("wrist_rotate", False, False),
                                            ("shoulder", True, True)):
        js = [rig.joint_names.index(f"follower_{arm}/{joint}") for arm in ("left", "right")]
        b = C._mounted_from_world(km, {**u, "joint_offsets": u["joint_offsets"].at[
            jnp.asarray(js)].add(0.03)}, qbar, chain)
        for q, moves in ((qbar, at_qbar_moves), (far, far_moves)):
            d = np.abs(cams(a, q)[wrist] - cams(b, q)[wrist]).max()
            assert (d > 1e-3) if moves else (d < 2e-5), (joint, d)

    # one step each way from the same state: same objective value, same colour step
    _reset(s, _fresh(s), qs)
    s.qbar = qbar
    s.params = {**s.params, **p}
    idx = jnp.arange(2, dtype=jnp.int32)
    outs = {}
    for n in (0, 3):
        s.cfg = s.cfg.replace(mounted_world_joints=n)
        s._build_optimisers()
        fn = s._step_fn(0)
        nom = {**s.nominal, "qbar": s.qbar}
        outs[n] = [fn(s.params, s._pose_state, s._colour_state, s.bufs, idx, nom,
                      jnp.asarray(pose), jnp.float32(1.0)) for pose in (False, True)]
    s.cfg = s.cfg.replace(mounted_world_joints=0)
    s._build_optimisers()
    for pose in (0, 1):
        assert float(outs[3][pose][3]) == pytest.approx(float(outs[0][pose][3]), rel=1e-5)
    colour_plain, colour_world = outs[0][0][0], outs[3][0][0]
    for k in ("joint_offsets", "fixed_deltas", "mounted_deltas"):
        np.testing.assert_array_equal(colour_world[k], s.params[k])
    np.testing.assert_allclose(colour_world["color_logits"], colour_plain["color_logits"],
                               rtol=1e-5, atol=1e-6)
    # a pose step moves the mounts differently in world coordinates
    assert float(jnp.abs(outs[3][1][0]["mounted_deltas"]
                         - outs[0][1][0]["mounted_deltas"]).max()) > 1e-5


def test_recovers_a_wrist_mount_offset_in_world_coordinates(setup):
    """A wrist camera's mount, recovered by pose steps taken in the world coordinates.

    The left wrist joints carry a known offset (so the coordinates differ from the mount
    deltas; with zero offsets they coincide); joints are not optimised.
    """
    rig, s, qs = setup
    truth = _fresh(s)
    ci = [c.name for c in rig.mounted_cameras].index("cam_left_wrist")
    delta = np.zeros((len(rig.mounted_cameras), 6), np.float32)
    delta[ci] = [0.004, -0.003, 0.002, 0.012, -0.008, 0.006]     # 5.4 mm, 0.9 deg
    off = np.zeros(len(rig.joint_names), np.float32)
    for name, v in (("wrist_angle", 0.03), ("forearm_roll", -0.02), ("wrist_rotate", 0.02)):
        off[rig.joint_names.index(f"follower_left/{name}")] = v
    truth["mounted_deltas"] = jnp.asarray(delta)
    truth["joint_offsets"] = jnp.asarray(off)
    s.cfg = s.cfg.replace(optimise_joints=False, optimise_cameras=True,
                          mounted_world_joints=3)
    s._build_optimisers()
    _reset(s, truth, qs)
    s.params = {**s.params, "joint_offsets": jnp.asarray(off)}
    s.accepted = dict(s.params)
    try:
        s.start()
        assert float(jnp.abs(s.qbar - jnp.asarray(np.mean(qs, axis=0))).max()) < 1e-6
        u = C._mounted_to_world(s.static.km, s.params, s.qbar,
                                jnp.asarray(C.mounted_chain_joints(rig, load_mjmodel(rig), 3)))
        assert float(jnp.abs(u["mounted_deltas"] - s.params["mounted_deltas"]).max()) > 0.01
        s.run()
    finally:
        s.cfg = s.cfg.replace(mounted_world_joints=0)
        s._build_optimisers()
    est = np.asarray(s.accepted["mounted_deltas"][ci])
    assert np.linalg.norm(est[3:] - delta[ci, 3:]) < 0.3 * np.linalg.norm(delta[ci, 3:]), est
    # the translation of a wrist camera is the weak part of this small problem: the plain
    # mount deltas end at the same 3.0 of 5.4 mm (measured; 0.0016, -0.0030, 0.0001 m)
    assert np.linalg.norm(est[:3] - delta[ci, :3]) < 0.65 * np.linalg.norm(delta[ci, :3]), est
    np.testing.assert_array_equal(s.accepted["joint_offsets"], off)


def test_precompiled_function_is_traced_in_the_callers_thread():
    """`_Precompiled.submit` traces and lowers in the calling thread.

    Only XLA's compile runs on the executor (JAX's tracing of one custom_vjp in two
    threads at once raced: "Store occupied"). The call then runs the ahead-of-time
    executable, traced once.
    """
    import concurrent.futures
    import threading

    traced_in = []

    @jax.jit
    def f(x):
        traced_in.append(threading.current_thread().name)     # runs while tracing
        return 2.0 * x

    pc = C._Precompiled(f)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bg") as ex:
        pc.submit(ex, jnp.ones(3))
        assert traced_in == [threading.current_thread().name]
        out = pc(jnp.ones(3))
    np.testing.assert_array_equal(np.asarray(out), 2.0 * np.ones(3))
    assert pc.compiled_calls == 1 and len(traced_in) == 1


def test_precompiled_functions_give_the_same_run_and_are_used(setup):
    """Background compilation (cfg.precompile) changes when functions compile, not results.

    Two levels, so the second level's step compiles while the first runs. Same seed and
    frames with and without: the accepted estimate, the losses and the held-out scores
    agree bit for bit, and each level's steps ran on the ahead-of-time executable.
    """
    rig, s0, qs = setup
    cfg = s0.cfg.replace(levels=(2, 1), cycles_per_level=(2, 2), pose_steps=2,
                         colour_steps=1, batch_frames=2)
    gauss = C.rig_gaussians(load_mjmodel(rig), N_GAUSS, seed=0, layout="random",
                            exclude_planes=False)
    truth = _fresh(s0)
    delta = np.zeros((len(rig.fixed_cameras), 6), np.float32)
    delta[0] = [0.004, -0.003, 0.002, 0.003, 0.0, -0.002]
    truth["fixed_deltas"] = jnp.asarray(delta)
    targets = _render_targets(s0, truth, qs)
    runs = []
    for precompile in (False, True):
        s = C.CalibrationSession(rig, load_mjmodel(rig), s0.full_intrinsics, gauss,
                                 cfg.replace(precompile=precompile), max_frames=N_FRAMES)
        for q, imgs in zip(qs, targets):
            s.add_frame(imgs, q, holdout=False)
        seen = []    # loss and pose parameters after every cycle
        m = s.run(callback=lambda m, s=s, seen=seen: seen.append(
            (m.loss, np.asarray(s.params["fixed_deltas"]).copy(),
             np.asarray(s.params["joint_offsets"]).copy())))
        runs.append((s, seen, m))
    (off, l_off, m_off), (on, l_on, m_on) = runs
    assert m_on.steps == m_off.steps > 0 and len(l_on) == len(l_off) == 4
    for (loss_on, fixed_on, joints_on), (loss_off, fixed_off, joints_off) in zip(l_on, l_off):
        assert loss_on == loss_off
        np.testing.assert_array_equal(fixed_on, fixed_off)
        np.testing.assert_array_equal(joints_on, joints_off)
    assert np.abs(l_on[-1][1]).max() > 1e-3          # the poses moved: not a trivial match
    assert m_on.holdout_l1 == m_off.holdout_l1 and m_on.history == m_off.history
    assert m_on.holdout_l1_start == m_off.holdout_l1_start
    for k in off.accepted:
        np.testing.assert_array_equal(np.asarray(on.accepted[k]), np.asarray(off.accepted[k]))
    assert [on._step_fn(li).compiled_calls > 0 for li in (0, 1)] == [True, True]
    assert [off._step_fn(li).compiled_calls for li in (0, 1)] == [0, 0]
    # start() scores the start at the finest level on its precompiled scorer too
    assert on._eval_fn(1).compiled_calls > 0 and off._eval_fn(1).compiled_calls == 0
    # a changed scene (a grown pair list) drops the executables: later calls use jit
    on._set_static(on.static._replace(max_pairs=tuple(2 * p for p in on.static.max_pairs)))
    on.cycle(1, colour_steps=1)
    assert on._step_fn(1).compiled_calls == 0 and on.metrics.steps == m_off.steps + 3
