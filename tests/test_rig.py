"""Rig file loading and validation (builtin ALOHA 2 and gym-aloha's MJCF).

The `gym_aloha_rig` fixture is also imported by test_kinematics.py.
"""

import importlib.util
from pathlib import Path

import mujoco
import numpy as np
import pytest
import yaml

from realsim_core.errors import RealsimError
from realsim_core.rig import (
    DEFAULT_RIG_PATH,
    MJCF_TO_OPTICAL,
    load_mjmodel,
    load_rig,
    rig_to_dict,
    write_rig,
)


def _gym_aloha_assets() -> Path | None:
    spec = importlib.util.find_spec("gym_aloha")  # located, not imported (installed --no-deps)
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / "assets"
    return p if (p / "bimanual_viperx_transfer_cube.xml").is_file() else None


@pytest.fixture(scope="session", name="gym_aloha_rig")
def gym_aloha_rig_fixture(tmp_path_factory) -> Path:
    """A rig file for gym-aloha's bimanual ViperX MJCF (real STL meshes), cameras on its bodies."""
    assets = _gym_aloha_assets()
    if assets is None:
        pytest.skip("gym-aloha is not installed (pip install --no-deps gym-aloha)")
    arm_joints = ["waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate"]
    arms = {}
    for side in ("left", "right"):
        p = f"vx300s_{side}"
        joints = {j: f"{p}/{j}" for j in arm_joints}
        fingers = [f"{p}/left_finger", f"{p}/right_finger"]
        joints["gripper"] = {"mjcf": fingers, "scale": [1.0, -1.0]}
        arms[f"follower_{side}"] = {"joints": joints,
                                    "tcp": {"body": f"{p}/gripper_link", "offset": [0.1, 0, 0]}}
    look_down = {"translation": [0.0, 0.5, 1.0], "rotation_xyzw": [1.0, 0.0, 0.0, 0.0]}
    wrist = {"translation": [-0.05, 0.0, 0.07], "rotation_xyzw": [0.0, 0.9063, 0.0, 0.4226]}
    rig = {
        "model": str(assets / "bimanual_viperx_transfer_cube.xml"),
        "arms": arms,
        "cameras": {
            "cam_high": {"mount": "world", "nominal": look_down},
            "cam_left_wrist": {"mount": "vx300s_left/gripper_link", "nominal": wrist},
            "cam_right_wrist": {"mount": "vx300s_right/gripper_link", "nominal": wrist},
        },
    }
    path = tmp_path_factory.mktemp("gym_aloha") / "rig.yaml"
    path.write_text(yaml.safe_dump(rig, sort_keys=False))
    return path


ARM_JOINTS = (
    "waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate", "gripper",
)


def test_builtin_rig_layout():
    rig = load_rig("builtin:aloha2")
    assert rig.model == "builtin:aloha2"
    assert [a.name for a in rig.arms] == ["follower_left", "follower_right"]
    assert all(a.ros_joint_names == ARM_JOINTS for a in rig.arms)
    assert len(rig.joint_names) == 14
    assert [c.name for c in rig.fixed_cameras] == ["cam_high", "cam_low"]
    assert [c.name for c in rig.mounted_cameras] == ["cam_left_wrist", "cam_right_wrist"]
    cam = rig.camera("cam_high")
    assert cam.image_topic == "/cam_high/camera/color/image_rect_raw"
    assert cam.info_topic == "/cam_high/camera/color/camera_info"
    assert cam.optical_frame == "cam_high_color_optical_frame"
    assert (cam.intrinsics.width, cam.intrinsics.height) == (848, 480)


def test_builtin_nominals_match_mjcf_cameras():
    """The rig file's optical frames are the MJCF cameras @ diag(1, -1, -1)."""
    rig = load_rig()
    m = load_mjmodel(rig)
    for c in rig.cameras:
        i = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, c.name)
        mat = np.zeros(9)
        mujoco.mju_quat2Mat(mat, m.cam_quat[i])
        T = np.eye(4)
        T[:3, :3], T[:3, 3] = mat.reshape(3, 3), m.cam_pos[i]
        np.testing.assert_allclose(c.nominal, T @ MJCF_TO_OPTICAL, atol=1e-6)
    # cam_high looks down: optical z has a large negative world z component
    assert rig.camera("cam_high").nominal[2, 2] < -0.8


def test_roundtrip(tmp_path):
    rig = load_rig()
    write_rig(rig, tmp_path / "rig.yaml")
    back = load_rig(tmp_path / "rig.yaml")
    for a, b in zip(rig.cameras, back.cameras):
        np.testing.assert_allclose(a.nominal, b.nominal, atol=1e-8)
    strip = lambda r: {**rig_to_dict(r), "cameras": {  # noqa: E731
        k: {**v, "nominal": None} for k, v in rig_to_dict(r)["cameras"].items()}}
    assert strip(back) == strip(rig)


def test_gym_aloha_rig_loads(gym_aloha_rig):
    rig = load_rig(gym_aloha_rig)
    assert rig.joint_names[0] == "follower_left/waist"
    assert [c.mount for c in rig.mounted_cameras] == ["vx300s_left/gripper_link",
                                                     "vx300s_right/gripper_link"]


def _write(tmp_path, data, name="rig.yaml"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return p


def _builtin_dict():
    return yaml.safe_load(DEFAULT_RIG_PATH.read_text())


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda d: d["arms"]["follower_left"]["joints"].update(waist="left/wiast"),
         "arms.follower_left.joints.waist"),
        (lambda d: d["arms"]["follower_left"]["tcp"].update(body="nope"),
         "arms.follower_left.tcp.body"),
        (lambda d: d["cameras"]["cam_left_wrist"].update(mount="left/nothing"),
         "cameras.cam_left_wrist.mount"),
        (lambda d: d["cameras"]["cam_high"].pop("nominal"), "cameras.cam_high.nominal"),
        (lambda d: d["cameras"]["cam_high"]["nominal"].update(translation=[0, 1]),
         "cameras.cam_high.nominal.translation"),
        (lambda d: d["cameras"]["cam_high"]["nominal"].update(rotation_xyzw="up"),
         "cameras.cam_high.nominal.rotation_xyzw"),
        (lambda d: d["cameras"]["cam_high"]["intrinsics"].update(width="848"),
         "cameras.cam_high.intrinsics.width"),
        (lambda d: d.pop("arms"), "arms"),
        (lambda d: d.update(modle="x"), "modle"),
        (lambda d: d.update(model="missing.xml"), "model"),
        (lambda d: d.update(model="builtin:nope"), "model"),
        (lambda d: d["arms"]["follower_right"]["joints"].update(waist="left/waist"),
         "arms.follower_right.joints.waist"),
    ],
)
def test_bad_rig_names_the_key(tmp_path, mutate, key):
    d = _builtin_dict()
    mutate(d)
    with pytest.raises(RealsimError) as err:
        load_rig(_write(tmp_path, d))
    msg = str(err.value)
    assert f"{key}:" in msg and "\n" not in msg


def test_malformed_yaml_and_missing_file(tmp_path):
    with pytest.raises(RealsimError, match="malformed YAML"):
        load_rig(_write(tmp_path, "model: [unclosed\n"))
    with pytest.raises(RealsimError, match="not found"):
        load_rig(tmp_path / "nope.yaml")
    with pytest.raises(RealsimError, match="top level"):
        load_rig(_write(tmp_path, "- a list\n"))


def test_relative_model_path(tmp_path, gym_aloha_rig):
    """A model path is resolved relative to the rig file."""
    import shutil

    d = yaml.safe_load(gym_aloha_rig.read_text())
    src = DEFAULT_RIG_PATH.parent / "aloha2.xml"
    shutil.copy(src, tmp_path / "copy.xml")
    b = _builtin_dict()
    b["model"] = "copy.xml"
    rig = load_rig(_write(tmp_path, b))
    assert rig.mjcf_path == (tmp_path / "copy.xml").resolve()
    assert d["model"].endswith(".xml")
