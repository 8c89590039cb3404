"""`realsim calibrate` end to end on a tiny MuJoCo-rendered recording (outputs, not accuracy).

Accuracy on real-size recordings is measured by the calib-std benchmark (README).
"""

import json
import subprocess
import sys

import pytest
import yaml

from realsim_core.calibration_io import read_calibration


def _realsim(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "realsim_core", *args], capture_output=True,
                          text=True, timeout=timeout)


def _tiny_recording(tmp_path, frames: int, seed: int):
    """A `realsim synth` recording of `frames` frames at 64x36, no objects."""
    rec = tmp_path / "rec"
    res = _realsim("synth", str(rec), "--frames", str(frames), "--resolution", "64x36",
                   "--objects", "0", "--seed", str(seed))
    assert res.returncode == 0, res.stderr
    return rec


def test_calibrate_writes_contract_outputs(tmp_path):
    rec = _tiny_recording(tmp_path, frames=5, seed=3)
    out = tmp_path / "cal"
    res = _realsim("calibrate", str(rec), "--out", str(out), "--levels", "1", "--steps", "0.1",
                   "--gaussians", "1500", "--max-frames", "5", "--no-progress",
                   "--wrist-weight", "0.5", "--set", "pose_steps=3",
                   "--set", "cull_backfaces=false")
    assert res.returncode == 0, res.stderr
    assert "TCP error" in res.stdout                      # evaluate table printed
    assert "calibrate: " not in res.stderr                # --no-progress: no progress lines
    cal = read_calibration(out / "calibration.yaml")     # parses with the contract reader
    assert set(cal.cameras) == {"cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist"}
    assert len(cal.joint_offsets) == 14
    raw = yaml.safe_load((out / "calibration.yaml").read_text())
    std = raw["cameras"]["cam_high"]["std"]
    assert std["translation_mm"] > 0 and std["rotation_deg"] > 0
    # every joint offset has its std beside it, and the reader keeps it
    assert set(raw["joint_offsets_std"]) == set(raw["joint_offsets"])
    assert cal.joint_offsets_std == raw["joint_offsets_std"]
    assert all(0 < v < 0.05 for v in cal.joint_offsets_std.values())   # below the prior
    m = json.loads((out / "metrics.json").read_text())
    assert m["holdout_l1"] <= m["holdout_l1_start"]       # never worse than the start
    assert m["evaluation"]["tcp_mm"] is not None
    assert m["levels"] == [1] and m["flat_levels"] == 0   # the last level is never flat
    # every setting used is recorded, --set ones included
    assert m["config"]["wrist_weight"] == 0.5 and m["config"]["cull_backfaces"] is False
    assert m["config"]["pose_steps"] == 3
    assert m["config"]["levels"] == [1] and m["config"]["fixed_weight"] == 1.0
    assert m["config"]["plane_edges"] == "repaint"        # the offline default
    # the offline default: the planes one mip level sharper in the repaint passes for
    # every camera but the one that paints most of them (cam_high sees the table top)
    assert m["config"]["repaint_plane_lod_bias"] == -1.0
    assert m["config"]["repaint_lod_bias_exclude"] == "main_painter"
    assert m["config"]["paint_frames"] == "spread"        # the offline default
    share = m["plane_paint_share"]
    assert set(share) == set(cal.cameras) and abs(sum(share.values()) - 1.0) < 1e-9
    assert max(share, key=share.get) == "cam_high"
    assert m["repaint_bias_cameras"] == ["cam_low", "cam_left_wrist", "cam_right_wrist"]
    # the appearance-free check of every camera, start and calibrated (px, capped at 8)
    for key in ("edge_distance_px_start", "edge_distance_px"):
        assert set(m[key]) == set(cal.cameras)
        vals = [v for v in m[key].values() if v is not None]
        assert vals and all(0.0 <= v <= 8.0 for v in vals)
    assert m["edge_distance_px"]["cam_high"] is not None     # the fixed views see the robot
    assert (f"cam_high {m['edge_distance_px_start']['cam_high']:.3f} -> "
            f"{m['edge_distance_px']['cam_high']:.3f}") in res.stdout
    # every acceptance test on the terminal and in metrics.json: the level, then each
    # repaint pass run, with the verdict the run acted on; a pass that gained less than
    # repaint_min_gain (the offline default 0.5 %) is the last
    judged = m["judgements"]
    ran = len(judged) - 1
    assert m["config"]["repaint_min_gain"] == 0.005
    assert ran + m["repaints_skipped"] == m["config"]["repaint_passes"] and ran >= 1
    assert [j["estimate"] for j in judged] == (
        ["level 1/1"] + [f"repaint {k + 1}" for k in range(ran)])
    l1 = [m["holdout_l1_start"]]             # the accepted held-out L1 after each test
    for j in judged:
        l1.append(j["holdout_l1"] if j["accepted"] else l1[-1])
    for k in range(1, ran):                  # every pass but the last gained enough
        assert (l1[k] - l1[k + 1]) / l1[k] >= 0.005
    if m["repaints_skipped"]:
        assert (l1[ran] - l1[ran + 1]) / l1[ran] < 0.005
        assert "repaint pass(es) skipped" in res.stdout
    assert sum(j["accepted"] for j in judged) == m["accepted"]
    assert sum(not j["accepted"] for j in judged) == m["rejected"]
    accepted_l1 = [j["holdout_l1"] for j in judged if j["accepted"]]
    assert m["holdout_l1"] == (accepted_l1[-1] if accepted_l1 else m["holdout_l1_start"])
    # the offline default tolerates a repaint pass within 0.5 % of the best accepted L1
    assert m["config"]["repaint_tolerance"] == 0.005
    assert m["holdout_l1_best"] <= m["holdout_l1"] <= 1.005 * m["holdout_l1_best"]
    assert f"repaint 1 {judged[1]['holdout_l1']:.4f}" in res.stdout
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 1 + 4  # loss curve + one row per camera
    assert "Geometry check" in html and html.count("<tr><td>cam_") >= 4
    assert "Acceptance tests" in html and html.count("<tr><td>repaint ") == len(judged) - 1
    assert ("repaint pass(es) not run" in html) == (m["repaints_skipped"] > 0)
    assert "within 0.5 % of the lowest one accepted so far (repaint_tolerance)" in html


def test_calibrate_says_which_repaint_passes_it_skipped(tmp_path):
    """At repaint_min_gain 0.9 no pass gains enough: of two passes only the first runs."""
    rec = _tiny_recording(tmp_path, frames=4, seed=4)
    out = tmp_path / "cal"
    res = _realsim("calibrate", str(rec), "--out", str(out), "--levels", "1", "--steps", "0.1",
                   "--gaussians", "1000", "--max-frames", "4",
                   "--repaint-passes", "2", "--set", "repaint_min_gain=0.9")
    assert res.returncode == 0, res.stderr
    # stderr is a pipe, not a terminal: plain progress lines, no bar redrawn in place
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("calibrate: ")]
    assert lines and "\r" not in res.stderr
    assert " steps/s  loss " in lines[0] and "held-out L1 " in lines[0]
    m = json.loads((out / "metrics.json").read_text())
    assert m["config"]["repaint_min_gain"] == 0.9 and m["repaints_skipped"] == 1
    assert [j["estimate"] for j in m["judgements"]] == ["level 1/1", "repaint 1"]
    assert ("; 1 repaint pass(es) skipped: the last one lowered the held-out L1 too little "
            "(< 90 %)") in res.stdout
    html = (out / "report.html").read_text()
    assert "1 repaint pass(es) not run" in html and "less than 90 %" in html


def test_calibrate_bad_input_is_one_line(tmp_path):
    res = _realsim("calibrate", str(tmp_path / "missing"), "--out", str(tmp_path / "o"))
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"realsim calibrate: error: bag not found: {tmp_path / 'missing'}"]
    res = _realsim("calibrate", str(tmp_path), "--out", str(tmp_path / "o"), "--levels", "x")
    assert res.returncode == 1
    assert "--levels must be comma-separated integers" in res.stderr
    res = _realsim("calibrate", str(tmp_path), "--out", str(tmp_path / "o"), "--flat-levels",
                   "-1")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "realsim calibrate: error: --flat-levels must be >= 0"]
    res = _realsim("calibrate", str(tmp_path), "--out", str(tmp_path / "o"), "--wrist-weight",
                   "-1")
    assert res.stderr.strip().splitlines() == [
        "realsim calibrate: error: --wrist-weight must be a number >= 0"]
    for bad, line in [
            ("wrist_wieght=1", "unknown calibration setting 'wrist_wieght' (did you mean "
                               "wrist_weight?)"),
            ("wrist_weight", "--set wants NAME=VALUE, got 'wrist_weight'"),
            ("wrist_weight=heavy", "calibration setting wrist_weight: cannot read 'heavy' "
                                   "as float"),
            ("plane_edges=round", "plane_edges must be 'soft', 'textured', 'hard' or "
                                  "'repaint', got 'round'"),
            ("object.stepz=3", "unknown object setting 'stepz' (did you mean steps?)"),
            ("object.steps=many", "object setting steps: cannot read 'many' as int"),
            ("object.", "--set wants NAME=VALUE, got 'object.'"),
            ("object.steps=3", "--set object.* applies to --objects, which is not given")]:
        res = _realsim("calibrate", str(tmp_path), "--out", str(tmp_path / "o"), "--set", bad)
        assert res.returncode == 1
        assert res.stderr.strip().splitlines() == [f"realsim calibrate: error: {line}"]
    # settings are checked against the offline schedule (two levels), not the engine's
    # three: the documented `--set cycles_per_level=30,10` passes and fails at the bag
    res = _realsim("calibrate", str(tmp_path / "nobag"), "--out", str(tmp_path / "o"),
                   "--set", "cycles_per_level=30,10")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"realsim calibrate: error: bag not found: {tmp_path / 'nobag'}"]
    res = _realsim("calibrate", str(tmp_path / "nobag"), "--out", str(tmp_path / "o"),
                   "--levels", "4,2,1", "--set", "cycles_per_level=30,10")
    assert res.stderr.strip().splitlines() == [
        "realsim calibrate: error: cycles_per_level needs one entry per level: levels "
        "(4, 2, 1), cycles_per_level (30, 10)"]


def test_progress_is_a_bar_on_a_terminal_and_a_line_every_interval_elsewhere():
    """Progress on stderr: a bar on a terminal, plain lines elsewhere.

    A log file gets a line at the first step, then at most one per interval, naming the
    acceptance tests made since the last line; a terminal gets the bar redrawn in place.
    """
    import io
    from types import SimpleNamespace

    from realsim_core.offline import _Progress

    now = [100.0]
    m = SimpleNamespace(steps=0, steps_per_s=0.0, loss=0.5, holdout_l1=0.25, judgements=[])
    log = io.StringIO()
    p = _Progress(True, 200, stream=log, tty=False, interval_s=30.0, clock=lambda: now[0])
    for t, steps in ((101.0, 4), (120.0, 40), (131.5, 60), (140.0, 70), (162.0, 90)):
        now[0], m.steps, m.steps_per_s = t, steps, steps / (t - 100.0)
        if steps == 60:     # the level judged between the lines at 101 s and 131.5 s
            m.judgements.append(("level 2/2", 56, 0.0312, True, False))
        if steps == 90:
            m.judgements.append(("repaint 1", 88, 0.0315, False, False))
        p(m)
    p.close()
    lines = log.getvalue().splitlines()
    assert lines == [
        "calibrate: 4/200 steps  4.00 steps/s  loss 0.5000  held-out L1 0.2500  1s",
        "calibrate: 60/200 steps  1.90 steps/s  loss 0.5000  held-out L1 0.2500  32s"
        "  (held-out test: level 2/2 0.0312 accepted)",
        "calibrate: 90/200 steps  1.45 steps/s  loss 0.5000  held-out L1 0.2500  62s"
        "  (held-out test: repaint 1 0.0315 rejected)",
    ]
    tty = io.StringIO()
    p = _Progress(True, 200, stream=tty, tty=True, clock=lambda: now[0])
    p(m)
    p.close()
    assert tty.getvalue().startswith("\r[#############-----------------] 90/200 steps")
    assert tty.getvalue().endswith("\n") and tty.getvalue().count("\n") == 1
    off = io.StringIO()
    p = _Progress(False, 200, stream=off, tty=False, clock=lambda: now[0])
    p(m)
    p.close()
    assert off.getvalue() == ""


def test_object_fit_progress_is_a_line_per_fit_and_every_interval():
    """`--objects` progress: each fit's first step, then at most one line per interval."""
    import io

    from realsim_core.offline import _FitProgress

    now = [50.0]
    log = io.StringIO()
    p = _FitProgress(True, stream=log, interval_s=30.0, clock=lambda: now[0])
    for t, fit, step, loss in ((52.0, "object_0", 1, 0.5), (70.0, "object_0", 26, 0.25),
                               (83.0, "object_0", 51, 0.125), (90.0, "object_1", 1, 0.75),
                               (100.0, "object_1", 26, 0.5)):
        now[0] = t
        p(fit, step, 600, loss)
    assert log.getvalue().splitlines() == [
        "calibrate: objects: object_0 1/600 steps  loss 0.5000  2s",
        "calibrate: objects: object_0 51/600 steps  loss 0.1250  33s",
        "calibrate: objects: object_1 1/600 steps  loss 0.7500  40s",
    ]
    off = io.StringIO()
    _FitProgress(False, stream=off)("object_0", 1, 600, 0.5)
    assert off.getvalue() == ""


def test_judgement_line_names_rejected_estimates():
    from realsim_core.commands.calibrate import judgement_line

    judged = [{"estimate": "level 2/2", "step": 400, "holdout_l1": 0.05081, "accepted": True},
              {"estimate": "repaint 1", "step": 600, "holdout_l1": 0.05067, "accepted": True},
              {"estimate": "repaint 2", "step": 800, "holdout_l1": 0.05088, "accepted": False}]
    line = judgement_line(judged, camera_reverts=1)
    assert line.startswith("held-out test (lower is better): level 2/2 0.0508 accepted, "
                           "repaint 1 0.0507 accepted, repaint 2 0.0509 rejected; ")
    assert "1 rejected estimate(s) discarded" in line and "camera guard kept 1" in line
    assert "rejected" not in judgement_line(judged[:2]) and "guard" not in judgement_line(judged)
    assert "skipped" not in line
    skipped = judgement_line(judged, repaints_skipped=1, min_gain=0.005)
    assert skipped.endswith("; 1 repaint pass(es) skipped: the last one lowered the "
                            "held-out L1 too little (< 0.5 %)")
    judged[2]["painted"] = True
    assert ", repaint 2 0.0509 (painted) rejected;" in judgement_line(judged)


def _watch_repaint_entry(s, probe):
    """Wrap a session's `cycle` and the repaint passes' entry (`_enter_repaint_scene`).

    Each cycle appends (judgements so far: 0 at the level, k in repaint pass k,
    probe(level)) to `seen`; the entry records the held-out L1 of the accepted estimate
    and of the start before and after it in `scores` (and when it ran, in `calls`).
    """
    seen, scores = [], {"calls": []}
    real_cycle, real_enter = s.cycle, s._enter_repaint_scene

    def cycle(level=None, colour_steps=None):
        seen.append((len(s.metrics.judgements), probe(level)))
        return real_cycle(level, colour_steps)

    def enter():
        scores["calls"].append(len(s.metrics.judgements))
        scores["before"] = s.holdout_residual(s.accepted)
        scores["start_before"] = s.metrics.holdout_l1_start
        scores["accepted"] = s.accepted
        real_enter()
        scores["rescored"] = s.metrics.holdout_l1
        scores["start_rescored"] = s.metrics.holdout_l1_start

    s.cycle, s._enter_repaint_scene = cycle, enter
    return seen, scores


def _assert_rescored_alike(s, scores):
    """The repaint passes' scene was entered once, before the first pass, and scored.

    Both the accepted estimate and the start were scored again with it: every acceptance
    test after it, and "never worse than the start", compare estimates rendered alike.
    """
    import math

    assert scores["calls"] == [1]
    assert scores["rescored"] != scores["before"]
    assert scores["rescored"] == s.holdout_residual(scores["accepted"])
    assert scores["start_rescored"] != scores["start_before"]
    assert scores["start_rescored"] == s.holdout_residual(s._start_params)
    assert math.isfinite(s.metrics.holdout_l1)
    assert s.metrics.holdout_l1 <= s.metrics.holdout_l1_start


def test_repaint_plane_edges_soften_the_table_outline_in_the_repaint_passes_only(tmp_path):
    """`plane_edges: repaint`: hard outlines at the levels, soft ones in the repaint passes.

    The accepted estimate is scored again with the soft outlines before the first repaint
    pass, so that its acceptance test compares two estimates rendered alike.
    """
    import numpy as np

    from realsim_core import calibration as C
    from realsim_core.offline import OfflineOptions, load_session

    rec = _tiny_recording(tmp_path, frames=4, seed=5)
    s, _, _ = load_session(rec, OfflineOptions(
        levels=(1,), flat_levels=0, steps_scale=0.1, n_gaussians=1000, max_frames=4,
        progress=False, repaint_passes=1, plane_edges="repaint",
        settings=(("cull_backfaces", "false"), ("precompile", "false"))))
    assert s.cfg.plane_edges == "repaint" and s.static.planes is not None
    natural = np.asarray(s.static.planes.clipped)
    assert not natural.all()          # the table top's outline can be soft on this rig
    seen, scores = _watch_repaint_entry(
        s, lambda level: np.asarray(C._planes_at_level(s.static, level).clipped).copy())
    s.run()
    assert sorted({j for j, _ in seen}) == [0, 1]     # the level, then one repaint pass
    for j, clipped in seen:
        if j == 0:
            assert clipped.all()                      # the level: every outline hard
        else:
            np.testing.assert_array_equal(clipped, natural)   # the pass: as found
    assert s.static.plane_edges == "soft" and s.cfg.plane_edges == "repaint"
    _assert_rescored_alike(s, scores)
    (_, _, h_level, _, _), (_, _, h_pass, ok, _) = s.metrics.judgements[-2:]
    assert ok == (h_pass <= scores["rescored"])


@pytest.mark.parametrize("cameras, exclude", [("", "none"), ("cam_low,cam_right_wrist", "none"),
                                              ("", "main_painter"),
                                              ("cam_high,cam_low", "main_painter")])
def test_repaint_plane_lod_bias_shifts_the_mip_level_in_the_repaint_passes_only(
        tmp_path, cameras, exclude):
    """`repaint_plane_lod_bias`: the planes' mip levels shift in the repaint passes only.

    The levels draw the planes at `plane_lod_bias`, the repaint passes at the sum (for
    `repaint_lod_bias_cameras`, or every camera; less the camera that paints most of the
    planes with `repaint_lod_bias_exclude: main_painter`), with the hard outlines kept
    (`plane_edges: hard`); the accepted estimate and the start are scored again with the
    shifted levels before the first pass.
    """
    from realsim_core.offline import OfflineOptions, load_session

    rec = _tiny_recording(tmp_path, frames=4, seed=5)
    s, _, _ = load_session(rec, OfflineOptions(
        levels=(1,), flat_levels=0, steps_scale=0.1, n_gaussians=1000, max_frames=4,
        progress=False, repaint_passes=2, repaint_min_gain=0.0, plane_edges="hard",
        repaint_lod_bias_exclude=exclude,
        settings=(("cull_backfaces", "false"), ("precompile", "false"),
                  ("plane_lod_bias", "0.25"), ("repaint_plane_lod_bias", "-1"),
                  ("repaint_lod_bias_cameras", cameras))))
    assert s.static.planes is not None and s.static.plane_lod_bias == 0.25
    chosen = cameras.split(",") if cameras else list(s.cameras)
    if exclude == "main_painter":
        chosen.remove("cam_high")     # it paints most of the table (the test below)
    in_passes = (-0.75 if len(chosen) == len(s.cameras)
                 else tuple(-0.75 if c in chosen else 0.25 for c in s.cameras))
    seen, scores = _watch_repaint_entry(
        s, lambda level: (s.static.plane_lod_bias, s.static.plane_edges))
    s.run()
    assert s.metrics.repaint_bias_cameras == tuple(c for c in s.cameras if c in chosen)
    assert sorted({j for j, _ in seen}) == [0, 1, 2]  # the level, two repaint passes
    for j, (bias, edges) in seen:
        assert edges == "hard"                        # outlines as configured throughout
        assert bias == (0.25 if j == 0 else in_passes)
    _assert_rescored_alike(s, scores)


@pytest.mark.parametrize("painters", ["all", "fixed"])
def test_plane_paint_share_counts_each_cameras_texel_pixels(tmp_path, painters):
    """`metrics.plane_paint_share`: each camera's share of the planes' paint.

    Checked against a float64 count of the texel centres each view sees (in front, in
    the image, not behind another plane); with `plane_painters: fixed` the wrists paint
    nothing.
    """
    import numpy as np

    from realsim_core.offline import OfflineOptions, load_session
    from realsim_core.planes import occluded_by_planes, texel_centres

    rec = _tiny_recording(tmp_path, frames=3, seed=5)
    s, _, _ = load_session(rec, OfflineOptions(
        levels=(1,), flat_levels=0, n_gaussians=1000, max_frames=3, progress=False,
        settings=(("precompile", "false"), ("plane_painters", painters))))
    s.metrics.plane_paint_share = {}
    s.init_colours_from_frames()
    share = s.metrics.plane_paint_share
    st = s.static
    idx, _, cams, level = s._init_views(8)
    counts = np.zeros(len(s.cameras))
    for pi in range(len(st.planes.names)):
        pts = texel_centres(st.planes, pi, st.plane_res).reshape(-1, 3)
        lifted = (pts + 2e-3 * st.planes.normal[pi]).astype(np.float32)
        for c, name in enumerate(s.cameras):
            if painters == "fixed" and "wrist" in name:
                continue
            it = st.intrinsics[level][c]
            for bi in range(len(idx)):
                T = cams[bi, c]
                pc = (pts - T[:3, 3]) @ T[:3, :3]
                z = np.where(pc[:, 2] > 0.02, pc[:, 2], np.inf)
                u = np.round(it.fx * pc[:, 0] / z + it.cx)
                v = np.round(it.fy * pc[:, 1] / z + it.cy)
                inside = ((pc[:, 2] > 0.02) & (u >= 0) & (u < it.width) & (v >= 0)
                          & (v < it.height))
                counts[c] += np.sum(inside & ~occluded_by_planes(
                    st.planes, lifted, T[:3, 3].astype(np.float32)))
    assert counts.sum() > 0
    assert list(share) == list(s.cameras)
    np.testing.assert_allclose([share[c] for c in s.cameras], counts / counts.sum(),
                               rtol=0, atol=1e-12)
    assert max(share, key=share.get) == "cam_high"
    if painters == "fixed":
        assert share["cam_left_wrist"] == share["cam_right_wrist"] == 0.0


def test_cli_defaults_are_the_library_defaults():
    """`realsim calibrate` with no options runs what `OfflineOptions()` describes.

    (The bench states its own Gaussian budget; a library caller that leaves it out gets
    the CLI's.)
    """
    from realsim_core.cli import build_parser
    from realsim_core.offline import OfflineOptions

    a = build_parser().parse_args(["calibrate", "rec", "--out", "cal"])
    d = OfflineOptions()
    got = dict(max_frames=a.max_frames, n_gaussians=a.gaussians, time_budget_s=a.time_budget,
               steps_scale=a.steps, levels=tuple(int(x) for x in a.levels.split(",")),
               flat_levels=a.flat_levels, plane_edges=a.plane_edges,
               repaint_passes=a.repaint_passes, textured_start=a.textured_start,
               wrist_weight=a.wrist_weight, seed=a.seed, objects=a.objects)
    assert got == {k: getattr(d, k) for k in got}


def test_painting_pads_the_plane_texels_no_camera_sees(tmp_path):
    """`plane_fill`: what the painting does with the texels no camera sees.

    The floor under the table gets the nearest seen texel's colour ("nearest") or keeps
    its own ("keep"); the seen texels are painted the same either way.
    """
    import numpy as np

    from realsim_core.offline import OfflineOptions, load_session

    rec = _tiny_recording(tmp_path, frames=2, seed=5)
    s, _, _ = load_session(rec, OfflineOptions(
        levels=(1,), flat_levels=0, n_gaussians=1000, max_frames=2, progress=False,
        settings=(("precompile", "false"), ("plane_fill", "keep"))))
    start = np.asarray(s.params["plane_logits"])
    keep = np.asarray(s.painted_params(s.params)["plane_logits"])
    s.cfg = s.cfg.replace(plane_fill="nearest")
    filled = np.asarray(s.painted_params(s.params)["plane_logits"])
    floor = s.static.planes.names.index("floor")
    unseen = np.all(keep[floor] == start[floor], axis=-1)
    assert 0 < unseen.sum() < unseen.size                 # the floor under the table
    np.testing.assert_array_equal(filled[floor][~unseen], keep[floor][~unseen])
    assert not np.any(np.all(filled[floor][unseen] == start[floor][unseen], axis=-1))
    seen_colours = {tuple(c) for c in keep[floor][~unseen]}
    assert all(tuple(c) in seen_colours for c in filled[floor][unseen])
