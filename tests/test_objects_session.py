"""Objects in rig recordings: residual masks vs MuJoCo segmentation, `calibrate --objects`."""

import json
import subprocess
import sys

import mujoco
import numpy as np

from realsim_core import objects as O
from realsim_core.bench import match_mask_ious
from realsim_core.calibration_io import read_calibration


def test_residual_masks_match_segmentation():
    """Masks from the residual to the object-free render vs MuJoCo segmentation (IoU).

    The known scene is rendered by MuJoCo at the true calibration here, which isolates the
    mask logic (threshold, morphology, table-plane clustering) from the appearance model;
    the `objects-rig` benchmark measures the full path with the session's splat render.
    """
    import mujoco as mj

    from realsim_core.kinematics import reference_forward
    from realsim_core.rig import intrinsics_from_fovy, load_mjmodel, load_rig
    from realsim_core.synth import (
        SynthConfig,
        build_render_model,
        camera_fovy_deg,
        render_frames,
        simulate,
    )

    w, h = 212, 120
    rig = load_rig(None)
    model = load_mjmodel(rig)
    sim = simulate(rig, model, SynthConfig(seed=0, frames=3, resolution=(w, h), objects=3))
    sim0 = simulate(rig, model, SynthConfig(seed=0, frames=3, resolution=(w, h), objects=0))
    q = sim.q_true[sim.image_index]
    rm = build_render_model(rig, sim.objects, w, h)
    imgs = render_frames(rig, rm, q, sim.camera_truth, w, h)
    seg = render_frames(rig, rm, q, sim.camera_truth, w, h, segmentation=True)
    known = render_frames(rig, build_render_model(rig, (), w, h), q, sim0.camera_truth, w, h)
    views, renders, truth = [], [], [[] for _ in sim.objects]
    bodies = [mj.mj_name2id(rm, mj.mjtObj.mjOBJ_BODY, f"realsim/{o.name}") for o in sim.objects]
    for k in range(len(q)):
        poses = reference_forward(rig, model, q[k], sim.camera_truth)
        for c, cam in enumerate(rig.cameras):
            intr = intrinsics_from_fovy(w, h, camera_fovy_deg(cam.intrinsics))
            views.append(O.View(imgs[cam.name][k], poses.cameras[c], intr, c))
            renders.append(known[cam.name][k] / 255.0)
            for i, b in enumerate(bodies):
                geoms = np.flatnonzero(rm.geom_bodyid == b)
                truth[i].append(np.isin(seg[cam.name][k], geoms))
    masks = O.derive_masks(views, renders)
    objs = O.split_objects(views, masks, O.MaskConfig(min_views=2))
    ious = match_mask_ious(objs, truth)
    assert len(objs) == len(sim.objects), len(objs)
    assert min(ious) > 0.55 and np.mean(ious) > 0.7, ious  # measured 0.65, 0.74, 0.89
    # a threshold above every residual finds nothing
    none = O.derive_masks(views, renders, O.MaskConfig(threshold=2.0))
    assert not any(m.any() for m in none)


def _realsim(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "realsim_core", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_calibrate_objects_end_to_end(tmp_path):
    """`realsim calibrate --objects` with the bag's /cam_*/object_mask instance labels.

    Two objects: the cameras are shared between them (`shared_cameras`, a second fit).
    """
    rec = tmp_path / "rec"
    res = _realsim("synth", str(rec), "--frames", "3", "--resolution", "106x60", "--objects",
                   "2", "--seed", "1", "--object-masks")
    assert res.returncode == 0, res.stderr
    out = tmp_path / "cal"
    res = _realsim("calibrate", str(rec), "--out", str(out), "--levels", "1", "--steps", "0.05",
                   "--gaussians", "1500", "--max-frames", "3", "--objects",
                   "--object-steps", "30", "--set", "object.crop_px=32")
    assert res.returncode == 0, res.stderr
    # progress in a log (stderr is a pipe): the calibration's lines, then each object fit's
    # line at its first step
    lines = res.stderr.splitlines()
    fits = [ln.split("  ")[0] for ln in lines if ln.startswith("calibrate: objects: ")]
    for fit in ("object_0", "object_1", "object_0 (shared cameras)",
                "object_1 (shared cameras)"):
        assert f"calibrate: objects: {fit} 1/30 steps" in fits, res.stderr
    first_fit = next(i for i, ln in enumerate(lines) if ln.startswith("calibrate: objects: "))
    assert any(ln.startswith("calibrate: ") and " steps/s " in ln
               for ln in lines[:first_fit]), res.stderr
    cal = read_calibration(out / "calibration.yaml")
    assert len(cal.objects) == 2, res.stderr
    assert "cameras fixed at the objects' median deltas" in res.stderr
    assert res.stderr.count("fitted again with the shared cameras") == 2, res.stderr
    o = cal.objects[0]
    assert o.mesh.is_file() and o.mesh.parent.name == "meshes"
    for suffix in (".stl", ".xml", "_textured.obj"):
        assert (o.mesh.parent / f"{o.name}{suffix}").is_file()
    model = mujoco.MjModel.from_xml_path(str(out / "meshes" / "scene.xml"))
    assert mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, f"realsim/{o.name}") >= 0
    m = json.loads((out / "metrics.json").read_text())
    # the object settings used are recorded, --set ones included
    assert m["object_config"]["crop_px"] == 32 and m["object_config"]["steps"] == 30
    cd = m["evaluation"]["chamfer_mm2"]["object_0"]
    assert cd is not None and np.isfinite(cd)
    assert "Chamfer" in res.stdout
