"""rosbag2 I/O: BagWriter round trips, sqlite3 input, damaged and missing input."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from rosbags.rosbag2 import Writer
from rosbags.rosbag2.enums import StoragePlugin
from rosbags.typesys import Stores, get_typestore

from realsim_core.bag import BagWriter, iter_raw, read_bag
from realsim_core.errors import RealsimError
from realsim_core.types import CameraIntrinsics

T0 = 1_700_000_000_000_000_000  # ns
DT = 33_000_000  # ns between frames
H, W = 24, 32
K = CameraIntrinsics(W, H, 40.0, 41.0, 15.5, 11.5)
NAMES = ["waist", "shoulder", "elbow"]
TS = get_typestore(Stores.ROS2_HUMBLE)


def _rgb(i: int) -> np.ndarray:
    """Deterministic test image [H, W, 3] that differs per frame and per channel."""
    y, x = np.mgrid[0:H, 0:W]
    return np.stack([(x * 7 + i) % 256, (y * 11 + 2 * i) % 256, (x + y + 3 * i) % 256],
                    axis=2).astype(np.uint8)


def _write_sample_bag(path, frames: int = 5) -> None:
    with BagWriter(path) as w:
        w.write_camera_info("/cam_high/camera_info", T0, K, "cam_high_optical")
        for i in range(frames):
            t = T0 + i * DT
            w.write_image("/cam_high/image", t, _rgb(i), "cam_high_optical")
            w.write_compressed_image("/cam_low/image/compressed", t + 1, _rgb(i), "png", "low")
            w.write_compressed_image("/cam_jpg/compressed", t + 2, _rgb(0) // 4 * 4, "jpeg")
            mask = np.zeros((H, W), bool)
            mask[i : i + 4, 2:9] = True
            w.write_mask("/cam_high/object_mask", t, mask)
            w.write_joint_state("/follower_left/joint_states", t + 5, NAMES,
                                [0.1 * i, -0.2 * i, 0.3], velocities=[1.0, 2.0, 3.0])


@pytest.fixture(scope="module")
def sample_bag(tmp_path_factory):
    path = tmp_path_factory.mktemp("bags") / "sample"
    _write_sample_bag(path)
    return path


def test_round_trip_images_infos_joints_masks(sample_bag):
    rec = read_bag(sample_bag)
    assert rec.warnings == []
    assert sorted(rec.images) == ["/cam_high/image", "/cam_jpg/compressed",
                                  "/cam_low/image/compressed"]
    raw = rec.images["/cam_high/image"]
    assert [s.stamp_ns for s in raw] == [T0 + i * DT for i in range(5)]
    for i, s in enumerate(raw):
        assert s.rgb.dtype == np.uint8 and s.rgb.shape == (H, W, 3)
        np.testing.assert_array_equal(s.rgb, _rgb(i))
        assert s.frame_id == "cam_high_optical"
    # PNG is lossless, including the RGB channel order through OpenCV's BGR.
    png = rec.images["/cam_low/image/compressed"]
    assert [s.stamp_ns for s in png] == [T0 + i * DT + 1 for i in range(5)]
    np.testing.assert_array_equal(png[3].rgb, _rgb(3))
    assert png[0].frame_id == "low"
    # JPEG is lossy: mean error of a quality-95 encode stays within a few grey levels.
    jpg = rec.images["/cam_jpg/compressed"][0].rgb.astype(float)
    assert np.abs(jpg - (_rgb(0) // 4 * 4)).mean() < 4.0
    assert rec.camera_infos == {"/cam_high/camera_info": [(T0, K)]}
    js = rec.joint_states["/follower_left/joint_states"]
    assert len(js) == 5
    assert js[2].stamp_ns == T0 + 2 * DT + 5
    assert js[2].names == tuple(NAMES)
    np.testing.assert_allclose(js[2].position, [0.2, -0.4, 0.3])
    np.testing.assert_allclose(js[2].velocity, [1.0, 2.0, 3.0])
    assert js[2].effort.size == 0
    masks = rec.masks["/cam_high/object_mask"]
    assert "/cam_high/object_mask" not in rec.images
    assert masks[1].rgb.shape == (H, W) and masks[1].rgb.dtype == np.uint8
    assert int((masks[1].rgb == 255).sum()) == 4 * 7
    assert masks[1].rgb[1, 2] == 255 and masks[1].rgb[0, 2] == 0
    assert rec.start_ns == T0 and rec.end_ns == T0 + 4 * DT + 5
    assert rec.topic_types["/cam_low/image/compressed"] == "sensor_msgs/msg/CompressedImage"


def test_topic_filter_and_missing_topic_warning(sample_bag):
    rec = read_bag(sample_bag, topics=["/follower_left/joint_states", "/nope"])
    assert list(rec.joint_states) == ["/follower_left/joint_states"]
    assert rec.images == {} and rec.masks == {} and rec.camera_infos == {}
    assert len(rec.warnings) == 1 and "/nope" in rec.warnings[0]


def test_iter_raw_time_ordered_cdr(sample_bag):
    items = list(iter_raw(sample_bag))
    assert len(items) == 1 + 5 * 5
    stamps = [t for _, _, t, _ in items]
    assert stamps == sorted(stamps)
    topic, msgtype, t, data = items[0]
    assert (topic, msgtype, t) == ("/cam_high/camera_info", "sensor_msgs/msg/CameraInfo", T0)
    msg = TS.deserialize_cdr(data, msgtype)
    assert list(msg.k) == [40.0, 0.0, 15.5, 0.0, 41.0, 11.5, 0.0, 0.0, 1.0]
    assert msg.distortion_model == "plumb_bob" and list(msg.d) == [0.0] * 5
    assert list(msg.r) == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    only = list(iter_raw(sample_bag, topics=["/follower_left/joint_states"]))
    assert {x[1] for x in only} == {"sensor_msgs/msg/JointState"} and len(only) == 5


def test_write_raw_and_unknown_type(tmp_path):
    path = tmp_path / "raw"
    msg = TS.types["std_msgs/msg/String"](data="hello")
    with BagWriter(path) as w:
        cdr = TS.serialize_cdr(msg, "std_msgs/msg/String")
        w.write_raw("/chatter", "std_msgs/msg/String", 42, cdr)
        w.write_raw("/custom", "my_pkg/msg/Thing", 43, b"\x00\x01\x00\x00\x07\x00\x00\x00",
                    msgdef="int32 value")
        with pytest.raises(RealsimError, match="unknown"):
            w.write_raw("/x", "other_pkg/msg/Unknown", 44, b"")
    items = list(iter_raw(path))
    assert [(tp, ty, t) for tp, ty, t, _ in items] == [
        ("/chatter", "std_msgs/msg/String", 42), ("/custom", "my_pkg/msg/Thing", 43)]
    assert TS.deserialize_cdr(items[0][3], "std_msgs/msg/String").data == "hello"
    assert read_bag(path).images == {}  # unknown types are not decoded, and do not crash


def test_writer_refuses_existing_path_and_bad_arrays(tmp_path):
    with pytest.raises(RealsimError, match="already exists"):
        BagWriter(tmp_path)
    with BagWriter(tmp_path / "b") as w:
        with pytest.raises(RealsimError, match=r"uint8 \[H, W, 3\]"):
            w.write_image("/img", 1, np.zeros((4, 4, 3), np.float32))
        with pytest.raises(RealsimError, match="3 names but 2 positions"):
            w.write_joint_state("/js", 1, NAMES, [0.0, 1.0])
        w.write_image("/img", 1, np.zeros((4, 4, 3), np.uint8))
        with pytest.raises(RealsimError, match="already holds sensor_msgs/msg/Image"):
            w.write_joint_state("/img", 2, NAMES, [0.0, 1.0, 2.0])


def test_sqlite3_bag_reads_the_same(tmp_path):
    path = tmp_path / "sq"
    img_t, info_t, js_t = "sensor_msgs/msg/Image", "sensor_msgs/msg/CameraInfo", \
        "sensor_msgs/msg/JointState"
    T = TS.types
    with Writer(path, version=8, storage_plugin=StoragePlugin.SQLITE3) as w:
        c_img = w.add_connection("/cam_high/image", img_t, typestore=TS)
        c_info = w.add_connection("/cam_high/camera_info", info_t, typestore=TS)
        c_js = w.add_connection("/follower_left/joint_states", js_t, typestore=TS)
        for i in range(3):
            t = T0 + i * DT
            hdr = T["std_msgs/msg/Header"](
                stamp=T["builtin_interfaces/msg/Time"](sec=t // 10**9, nanosec=t % 10**9),
                frame_id="f")
            bgr = np.ascontiguousarray(_rgb(i)[:, :, ::-1])
            img = T[img_t](header=hdr, height=H, width=W, encoding="bgr8", is_bigendian=0,
                           step=W * 3, data=bgr.reshape(-1))
            w.write(c_img, t, TS.serialize_cdr(img, img_t))
            js = T[js_t](header=hdr, name=NAMES, position=np.array([i, 2.0 * i, 0.5]),
                         velocity=np.zeros(0), effort=np.zeros(0))
            w.write(c_js, t, TS.serialize_cdr(js, js_t))
        info = T[info_t](
            header=hdr, height=H, width=W, distortion_model="plumb_bob", d=np.zeros(5),
            k=np.array([40.0, 0, 15.5, 0, 41.0, 11.5, 0, 0, 1]), r=np.eye(3).reshape(-1),
            p=np.zeros(12), binning_x=0, binning_y=0,
            roi=T["sensor_msgs/msg/RegionOfInterest"](x_offset=0, y_offset=0, height=0,
                                                      width=0, do_rectify=False))
        w.write(c_info, T0, TS.serialize_cdr(info, info_t))
    assert list(path.glob("*.db3"))
    rec = read_bag(path)
    assert rec.warnings == []
    assert [s.stamp_ns for s in rec.images["/cam_high/image"]] == [T0, T0 + DT, T0 + 2 * DT]
    np.testing.assert_array_equal(rec.images["/cam_high/image"][2].rgb, _rgb(2))
    assert rec.camera_infos["/cam_high/camera_info"][0][1] == K
    np.testing.assert_allclose(rec.joint_states["/follower_left/joint_states"][1].position,
                               [1.0, 2.0, 0.5])
    assert [x[2] for x in iter_raw(path)] == sorted(x[2] for x in iter_raw(path))


def _big_bag(path, frames: int) -> None:
    """~1 MiB MCAP chunks hold ~130 of these 64x48 images: several chunks."""
    with BagWriter(path) as w:
        for i in range(frames):
            w.write_image("/cam/image", T0 + i * DT, np.full((48, 64, 3), i % 256, np.uint8))


def test_truncated_mcap_recovers_complete_chunks(tmp_path):
    path = tmp_path / "trunc"
    _big_bag(path, 300)
    mcap = next(path.glob("*.mcap"))
    data = mcap.read_bytes()
    mcap.write_bytes(data[: int(len(data) * 0.6)])
    rec = read_bag(path)
    imgs = rec.images["/cam/image"]
    # What survives is a prefix: complete chunks before the cut, nothing invented.
    assert 0 < len(imgs) < 300
    assert [s.stamp_ns for s in imgs] == [T0 + i * DT for i in range(len(imgs))]
    assert int(imgs[-1].rgb[0, 0, 0]) == (len(imgs) - 1) % 256
    assert len(rec.warnings) == 1
    assert "truncated" in rec.warnings[0] and f"recovered {len(imgs)} messages" in rec.warnings[0]
    assert len(list(iter_raw(path))) == len(imgs)


def test_mcap_without_summary_recovers_everything(tmp_path):
    path = tmp_path / "nosummary"
    _big_bag(path, 20)
    mcap = next(path.glob("*.mcap"))
    data = mcap.read_bytes()
    mcap.write_bytes(data[:-30])  # footer gone, data section intact
    rec = read_bag(path)
    assert len(rec.images["/cam/image"]) == 20
    assert "recovered 20 messages" in rec.warnings[0]


def test_folder_without_metadata_reads_mcap_directly(tmp_path):
    path = tmp_path / "nometa"
    _big_bag(path, 4)
    (path / "metadata.yaml").unlink()
    rec = read_bag(path)
    assert len(rec.images["/cam/image"]) == 4
    assert "no metadata.yaml" in rec.warnings[0]
    # A single .mcap file path is accepted too.
    assert len(read_bag(next(path.glob("*.mcap"))).images["/cam/image"]) == 4


def test_unrecoverable_mcap_header(tmp_path):
    path = tmp_path / "header"
    _big_bag(path, 2)
    mcap = next(path.glob("*.mcap"))
    mcap.write_bytes(mcap.read_bytes()[:5])
    with pytest.raises(RealsimError) as err:
        read_bag(path)
    msg = str(err.value)
    assert str(path) in msg and "\n" not in msg


def test_missing_and_non_bag_paths(tmp_path):
    with pytest.raises(RealsimError, match="does not exist"):
        read_bag(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RealsimError, match="not a rosbag2 bag"):
        read_bag(tmp_path / "empty")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(RealsimError, match="not a rosbag2 bag"):
        read_bag(tmp_path / "notes.txt")
    with pytest.raises(RealsimError, match="does not exist"):
        iter_raw(tmp_path / "missing")  # raised by the call, before iterating


@pytest.mark.parametrize(
    "text, expect",
    [
        ("rosbag2_bagfile_information: [unclosed\n", "YAML"),
        ("just a string\n", "metadata"),
        ("rosbag2_bagfile_information:\n  version: 8\n", "missing"),
    ],
)
def test_corrupt_metadata(tmp_path, sample_bag, text, expect):
    path = tmp_path / "meta"
    shutil.copytree(sample_bag, path)
    (path / "metadata.yaml").write_text(text)
    with pytest.raises(RealsimError) as err:
        read_bag(path)
    msg = str(err.value)
    assert str(path) in msg and expect in msg and "\n" not in msg


def test_unsupported_encoding_is_skipped_and_counted(tmp_path):
    path = tmp_path / "enc"
    T = TS.types
    with BagWriter(path) as w:
        w.write_image("/cam/image", T0, _rgb(0))
        for i in range(3):
            hdr = T["std_msgs/msg/Header"](
                stamp=T["builtin_interfaces/msg/Time"](sec=1, nanosec=i + 1), frame_id="")
            msg = T["sensor_msgs/msg/Image"](header=hdr, height=2, width=2, encoding="yuv422",
                                             is_bigendian=0, step=4, data=np.zeros(8, np.uint8))
            w.write_raw("/cam/image", "sensor_msgs/msg/Image", T0 + 1 + i,
                        TS.serialize_cdr(msg, "sensor_msgs/msg/Image"))
    rec = read_bag(path)
    assert len(rec.images["/cam/image"]) == 1
    assert len(rec.warnings) == 1
    assert "skipped 3 message(s) on /cam/image" in rec.warnings[0]
    assert "yuv422" in rec.warnings[0]


def test_zero_header_stamp_falls_back_to_bag_time(tmp_path):
    path = tmp_path / "zero"
    T = TS.types
    hdr = T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=0, nanosec=0),
                                   frame_id="")
    js = T["sensor_msgs/msg/JointState"](header=hdr, name=["a"], position=np.array([1.5]),
                                         velocity=np.zeros(0), effort=np.zeros(0))
    with BagWriter(path) as w:
        w.write_raw("/js", "sensor_msgs/msg/JointState", 777,
                    TS.serialize_cdr(js, "sensor_msgs/msg/JointState"))
    rec = read_bag(path)
    assert rec.joint_states["/js"][0].stamp_ns == 777
    assert "zero header stamp" in rec.warnings[0]
