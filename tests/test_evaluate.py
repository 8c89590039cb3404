"""`realsim evaluate`: truth vs truth is zero, nominal vs truth is the injected error."""

import json

import numpy as np
import pytest
import yaml

from realsim_core.calibration_io import (
    Calibration,
    ObjectCalibration,
    read_calibration,
    read_ground_truth,
    write_calibration,
)
from realsim_core.cli import main
from realsim_core.errors import RealsimError
from realsim_core.evaluate import (
    chamfer_floor_mm2,
    chamfer_mm2,
    evaluate,
    evaluate_files,
    surface_chamfer_mm2,
)
from realsim_core.synth import SynthConfig, synthesize

MM, DEG = 6.0, 0.8


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "rec"
    synthesize(out, SynthConfig(seed=2, frames=5, resolution=(32, 24), objects=2,
                                joint_offset_std=0.02, camera_offset_mm=MM, camera_offset_deg=DEG))
    return out


def _nominal_file(rec, tmp_path):
    gt = read_ground_truth(rec / "ground_truth.yaml")
    p = tmp_path / "nominal.yaml"
    write_calibration(p, gt.nominal)
    return p, gt


def test_truth_vs_truth_is_zero(rec):
    gt_path = rec / "ground_truth.yaml"
    r = evaluate_files(gt_path, gt_path)  # ground_truth.yaml is a valid calibration file
    assert all(e.translation_mm == pytest.approx(0, abs=1e-6) for e in r.cameras.values())
    assert all(e.rotation_deg == pytest.approx(0, abs=1e-3) for e in r.cameras.values())
    assert max(r.joint_offsets.values()) == 0.0
    assert r.tcp_mm == pytest.approx(0, abs=1e-9) and r.tcp_frames == 5
    assert len(r.chamfer_mm2) == 2
    assert all(v == pytest.approx(0, abs=1e-6) for v in r.chamfer_mm2.values())
    assert all(v == pytest.approx(0, abs=1e-9) for v in r.chamfer_surface_mm2.values())
    assert all(v > 0.01 for v in r.chamfer_floor_mm2.values())  # identical samples only


def test_nominal_vs_truth_is_injected(rec, tmp_path):
    p, gt = _nominal_file(rec, tmp_path)
    r = evaluate_files(p, rec / "ground_truth.yaml")
    for e in r.cameras.values():
        assert e.translation_mm == pytest.approx(MM, abs=1e-5)
        assert e.rotation_deg == pytest.approx(DEG, abs=1e-4)
    for k, v in gt.truth.joint_offsets.items():
        assert r.joint_offsets[k] == pytest.approx(abs(v))
    assert r.tcp_mm > 1.0  # 0.02 rad offsets move the TCP by several mm
    assert all(v is None for v in r.chamfer_mm2.values())  # no objects estimated
    # perfect joint offsets but nominal cameras: TCP error vanishes
    calib = Calibration(gt.nominal.cameras, gt.truth.joint_offsets)
    assert evaluate(calib, gt).tcp_mm == pytest.approx(0, abs=1e-9)


def test_chamfer_known_answers(rec, tmp_path):
    a = np.zeros((1, 3))
    assert chamfer_mm2(a, a + [0.001, 0, 0]) == pytest.approx(2.0)  # 1 mm each way
    gt = read_ground_truth(rec / "ground_truth.yaml")
    shifted = []
    for o in gt.truth.objects:
        T = o.pose.copy()
        T[2, 3] += 0.002  # lift by 2 mm
        shifted.append(ObjectCalibration(o.name, o.mesh, T))
    r = evaluate(Calibration(gt.truth.cameras, gt.truth.joint_offsets, tuple(shifted)), gt)
    for v in r.chamfer_mm2.values():
        assert 0.5 < v <= 8.0 + 0.5  # <= 2 * (2 mm)^2, > 0
    for v in r.chamfer_surface_mm2.values():
        assert 0.5 < v <= 8.0 + 1e-6


def test_chamfer_floor_and_surface_distance():
    import trimesh

    sphere = trimesh.creation.icosphere(subdivisions=4, radius=0.025)
    # nearest-neighbour distance in a 2-D Poisson sample of density rho: E[d^2] = 1/(pi rho);
    # both ways: 2/(pi rho), ~0.50 mm^2 for 10,000 points on this sphere
    rho = 10_000 / (sphere.area * 1e6)
    assert chamfer_floor_mm2(sphere) == pytest.approx(2.0 / (np.pi * rho), rel=0.05)
    # one surface, two triangulations: samples differ (floor), the surface distance does not
    box = trimesh.creation.box(extents=(0.05, 0.035, 0.04))
    fine = box.subdivide().subdivide()
    assert chamfer_mm2(*(trimesh.sample.sample_surface(m, 10_000, seed=0)[0]
                         for m in (box, fine))) > 0.3
    assert surface_chamfer_mm2(box, fine) == pytest.approx(0.0, abs=1e-8)
    # concentric spheres 1 mm apart: every sample is ~1 mm from the other surface
    outer = trimesh.Trimesh(sphere.vertices * (0.026 / 0.025), sphere.faces, process=False)
    assert surface_chamfer_mm2(sphere, outer) == pytest.approx(2.0, rel=0.01)


def test_cli_json_and_errors(rec, tmp_path, capsys):
    p, _ = _nominal_file(rec, tmp_path)
    assert main(["evaluate", str(p), str(rec / "ground_truth.yaml"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["cameras"]["cam_high"]["translation_mm"] == pytest.approx(MM, abs=1e-5)
    assert d["tcp_mm"] > 0
    assert main(["evaluate", str(p), str(rec / "ground_truth.yaml")]) == 0
    assert "TCP error" in capsys.readouterr().out
    assert main(["evaluate", str(tmp_path / "missing.yaml"), str(rec / "ground_truth.yaml")]) == 1
    err = capsys.readouterr().err
    assert "not found" in err and err.count("\n") == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"cameras": {"cam_high": {"translation": [0, 0]}}}))
    with pytest.raises(RealsimError, match=r"cameras\.cam_high\.translation"):
        read_calibration(bad)
    bad.write_text(yaml.safe_dump({"joint_offsets_std": {"follower_left/waist": -1.0}}))
    with pytest.raises(RealsimError, match=r"joint_offsets_std\.follower_left/waist"):
        read_calibration(bad)
    assert main(["evaluate", str(p), str(p)]) == 1  # a calibration is not a ground truth
    assert "nominal" in capsys.readouterr().err
