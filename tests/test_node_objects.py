"""The node publishes the objects of the calibration it serves (~/objects, ~/objects/<name>/mesh).

One node process resumes from a calibration.yaml listing two objects: a box whose OBJ
is in the output folder and one whose mesh file is missing.
"""

from __future__ import annotations

import numpy as np
import pytest
from ros_util import needs_ros, start_node, stop_process

pytestmark = [needs_ros, pytest.mark.ros]

OBJ_ROUNDING_M = 1e-7  # OBJ files store 8 decimals (trimesh's export default)


@pytest.fixture(scope="module")
def rcl():
    import rclpy

    rclpy.init()
    yield
    rclpy.shutdown()


def _write_calibration_with_objects(out):
    """The rig's nominal plus objects `box` (meshes/box.obj) and `ghost` (no mesh file)."""
    from dataclasses import replace

    import trimesh

    from realsim_core.calibration_io import ObjectCalibration, write_calibration
    from realsim_core.online import nominal_calibration
    from realsim_core.rig import load_rig

    box = trimesh.creation.box(extents=(0.05, 0.08, 0.12))
    (out / "meshes").mkdir(parents=True)
    box.export(out / "meshes" / "box.obj")
    pose = trimesh.transformations.rotation_matrix(0.6, [0.2, 0.4, 1.0])
    pose[:3, 3] = [0.12, -0.25, 0.06]  # m, object frame in world
    nominal = nominal_calibration(load_rig("builtin:aloha2", check_model=False))
    objects = (ObjectCalibration("box", out / "meshes" / "box.obj", pose),
               ObjectCalibration("ghost", out / "meshes" / "ghost.obj", np.eye(4)))
    write_calibration(out / "calibration.yaml", replace(nominal, objects=objects, metrics={}))
    return box, pose


def test_node_publishes_resumed_objects_and_survives_a_missing_mesh(rcl, tmp_path):
    from node_probe import Probe, count_lines
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from shape_msgs.msg import Mesh
    from std_srvs.srv import Trigger
    from visualization_msgs.msg import Marker, MarkerArray

    out = tmp_path / "out"
    box, pose = _write_calibration_with_objects(out)
    want = box.vertices @ pose[:3, :3].T + pose[:3, 3]  # [8, 3] world frame, float64
    want_points = want[box.faces.reshape(-1)]  # [36, 3]

    proc = start_node("-p", f"output_dir:={out}")
    probe = Probe("objects_probe")
    latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                         reliability=ReliabilityPolicy.RELIABLE)
    arrays: list = []
    meshes: list = []
    # late joiners: subscribe after the node has published (transient local delivers)
    probe.node.create_subscription(MarkerArray, "/realsim/objects", arrays.append, latched)
    probe.node.create_subscription(Mesh, "/realsim/objects/box/mesh", meshes.append, latched)
    try:
        assert probe.spin_until(lambda: bool(arrays) and bool(meshes) and bool(probe.tf)
                                or proc.poll() is not None), "no objects / TF from the node"
        assert proc.poll() is None, proc.stderr.read()

        clear, *markers = arrays[-1].markers
        assert clear.action == Marker.DELETEALL
        (m,) = markers  # ghost has no mesh: left out, box still published
        assert (m.type, m.action, m.ns) == (Marker.TRIANGLE_LIST, Marker.ADD, "box")
        assert m.header.frame_id == "world"
        assert len(m.points) == 12 * 3
        got = np.array([[p.x, p.y, p.z] for p in m.points])
        np.testing.assert_allclose(got, want_points, atol=OBJ_ROUNDING_M)

        mesh = meshes[-1]
        assert len(mesh.triangles) == 12 and len(mesh.vertices) == 8
        np.testing.assert_allclose([[p.x, p.y, p.z] for p in mesh.vertices], box.vertices,
                                   atol=OBJ_ROUNDING_M)  # object frame
        np.testing.assert_array_equal([list(t.vertex_indices) for t in mesh.triangles],
                                      box.faces)
        assert {t.child_frame_id for t in probe.tf[-1].transforms}  # TF went out too

        # reset: the nominal has no objects, so the set is cleared (DELETEALL only)
        n = len(arrays)
        assert probe.call(Trigger, "/realsim/reset", Trigger.Request()).success
        assert probe.spin_until(lambda: len(arrays) > n)
        assert [mk.action for mk in arrays[-1].markers] == [Marker.DELETEALL]
        assert proc.poll() is None
    finally:
        probe.destroy()
        rc, stdout, err = stop_process(proc)
    assert rc == 0, err
    assert "Traceback" not in err + stdout
    logs = err + stdout
    assert count_lines(logs, "ghost.obj") == 1, logs  # one clear line for the missing mesh
    assert count_lines(logs, "object ghost: mesh file not found") == 1, logs
