"""rosbag2 I/O with `rosbags` (pure Python): write MCAP bags, read MCAP and sqlite3 bags.

Writing: `BagWriter` creates a rosbag2 folder (MCAP storage, metadata version 8, which
Humble through Kilted read) with standard `sensor_msgs` messages. The header stamp of
every message and its bag receive time are both the given `stamp_ns`.

Reading:
- `read_bag` decodes images, masks, camera infos and joint states into plain arrays
  (`Recording`); samples carry their *header* stamps (the sensor time), sorted per topic.
- `iter_raw` yields raw CDR bytes in bag-time order, for replay without conversion.

Damaged input (decisions):
- missing path, a folder that is neither a rosbag2 folder nor holds `.mcap` files, a
  corrupt `metadata.yaml`, an unreadable storage file -> `RealsimError`, one line naming
  the path and the problem;
- a folder with `.mcap` files but no `metadata.yaml` (recorder killed before it wrote
  one) is read from the `.mcap` files directly, with a warning;
- a truncated MCAP file (no footer/summary: recorder killed, copy cut short) is
  *recovered*: `rosbags` itself rejects such a file ("File end magic is invalid"), so
  `_RecoveringMcapReader` scans the data section for complete top-level records and
  reads every complete message before the damage (a partly written chunk is lost
  whole). `Recording.warnings` says so. If even that fails, `RealsimError`. Recovery uses
  `rosbags`' `McapReader` internals (tested against rosbags 0.11.9, see constraints.txt);
- an error while iterating messages (e.g. a chunk with a bad checksum) stops `read_bag`
  with what was read so far plus a warning; `iter_raw` raises `RealsimError` there;
- messages that cannot be decoded (unsupported encoding, bad CDR, inconsistent sizes)
  are skipped and counted per topic in one warning each.
"""

from __future__ import annotations

import heapq
import logging
import struct
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import cv2
import numpy as np
from rosbags.interfaces import Connection
from rosbags.rosbag2 import Writer
from rosbags.rosbag2.enums import StoragePlugin
from rosbags.rosbag2.reader import DirectoryReader
from rosbags.rosbag2.storage_mcap import McapReader
from rosbags.rosbag2.storage_sqlite3 import Sqlite3Reader
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

from realsim_core.errors import RealsimError
from realsim_core.images import decode_compressed, decode_image, decode_mask_u8
from realsim_core.types import CameraIntrinsics, ImageSample, JointStateSample

_LOG = logging.getLogger(__name__)

IMAGE = "sensor_msgs/msg/Image"
COMPRESSED_IMAGE = "sensor_msgs/msg/CompressedImage"
CAMERA_INFO = "sensor_msgs/msg/CameraInfo"
JOINT_STATE = "sensor_msgs/msg/JointState"
MASK_SUFFIX = "object_mask"
_IMAGE_TYPES = (IMAGE, COMPRESSED_IMAGE)
_DECODED_TYPES = (IMAGE, COMPRESSED_IMAGE, CAMERA_INFO, JOINT_STATE)

# Message definitions and hashes of Kilted (the ROS wheels in use); the sensor_msgs types
# written here are identical from Humble on.
_TYPESTORE = get_typestore(Stores.ROS2_KILTED)
_BAG_VERSION = 8
_NS = 1_000_000_000


def _one_line(err: BaseException | str, limit: int = 200) -> str:
    """The error text on one line, cut to `limit` characters."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _stamp_fields(stamp_ns: int) -> tuple[int, int]:
    if isinstance(stamp_ns, bool) or not isinstance(stamp_ns, (int, np.integer)):
        raise RealsimError(f"stamp must be an integer number of nanoseconds, got {stamp_ns!r}")
    stamp_ns = int(stamp_ns)
    if stamp_ns < 0:
        raise RealsimError(f"stamp must be >= 0 ns, got {stamp_ns}")
    return stamp_ns // _NS, stamp_ns % _NS


# --------------------------------------------------------------------------- writing


class BagWriter:
    """Write a new rosbag2 folder (MCAP storage).

    Use as a context manager; on exit the bag is closed and `metadata.yaml` written (also
    when the block raised, so what was written stays readable).

    Args:
        path: bag folder to create; `RealsimError` if it already exists.

    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.exists():
            raise RealsimError(f"cannot write bag {self.path}: it already exists")
        self._writer: Writer | None = None
        self._connections: dict[str, Connection] = {}
        self._typestore = _TYPESTORE

    # lifecycle ------------------------------------------------------------------
    def open(self) -> BagWriter:
        """Create the folder and open the storage file."""
        if self.path.exists():
            raise RealsimError(f"cannot write bag {self.path}: it already exists")
        self._writer = Writer(self.path, version=_BAG_VERSION, storage_plugin=StoragePlugin.MCAP)
        try:
            self._writer.open()
        except Exception as err:  # rosbags raises WriterError / OSError
            self._writer = None
            raise RealsimError(f"cannot write bag {self.path}: {_one_line(err)}") from err
        return self

    def close(self) -> None:
        """Finish the bag: write the summary and `metadata.yaml`."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def __enter__(self) -> BagWriter:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # helpers ------------------------------------------------------------------------
    def _connection(self, topic: str, msgtype: str) -> Connection:
        if self._writer is None:
            raise RealsimError(f"bag {self.path} is not open for writing (use 'with BagWriter')")
        conn = self._connections.get(topic)
        if conn is None:
            if msgtype not in self._typestore.fielddefs:
                raise RealsimError(
                    f"cannot write {topic!r}: message type {msgtype!r} is unknown "
                    "(pass msgdef= to write_raw)"
                )
            conn = self._writer.add_connection(topic, msgtype, typestore=self._typestore)
            self._connections[topic] = conn
        elif conn.msgtype != msgtype:
            raise RealsimError(
                f"cannot write {msgtype} on {topic!r} in {self.path}: topic already holds "
                f"{conn.msgtype}"
            )
        return conn

    def _write_msg(self, topic: str, stamp_ns: int, msg: object) -> None:
        msgtype = msg.__msgtype__  # type: ignore[attr-defined]
        conn = self._connection(topic, msgtype)
        data = self._typestore.serialize_cdr(msg, msgtype)
        self._writer.write(conn, int(stamp_ns), data)  # type: ignore[union-attr]

    def _header(self, stamp_ns: int, frame_id: str) -> object:
        sec, nanosec = _stamp_fields(stamp_ns)
        t = self._typestore.types
        return t["std_msgs/msg/Header"](
            stamp=t["builtin_interfaces/msg/Time"](sec=sec, nanosec=nanosec), frame_id=frame_id
        )

    # public writers -------------------------------------------------------------------
    def write_image(self, topic: str, stamp_ns: int, rgb: np.ndarray, frame_id: str = "") -> None:
        """Write `sensor_msgs/Image`: uint8 [H, W, 3] as rgb8, uint8/bool [H, W] as mono8."""
        arr = np.asarray(rgb)
        if arr.dtype == bool and arr.ndim == 2:
            arr = arr.astype(np.uint8) * np.uint8(255)
        if arr.dtype != np.uint8 or not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] == 3)):
            raise RealsimError(
                f"write_image {topic!r}: expected uint8 [H, W, 3] or [H, W], got "
                f"{arr.dtype} {list(arr.shape)}"
            )
        h, w = arr.shape[:2]
        channels = 1 if arr.ndim == 2 else 3
        msg = self._typestore.types[IMAGE](
            header=self._header(stamp_ns, frame_id),
            height=h,
            width=w,
            encoding="mono8" if channels == 1 else "rgb8",
            is_bigendian=0,
            step=w * channels,
            data=np.ascontiguousarray(arr).reshape(-1),
        )
        self._write_msg(topic, stamp_ns, msg)

    def write_mask(self, topic: str, stamp_ns: int, mask: np.ndarray, frame_id: str = "") -> None:
        """Write a mono8 mask: bool [H, W] (True -> 255) or uint8 [H, W] labels."""
        arr = np.asarray(mask)
        if arr.ndim != 2 or arr.dtype not in (np.bool_, np.uint8):
            raise RealsimError(
                f"write_mask {topic!r}: expected bool or uint8 [H, W], got "
                f"{arr.dtype} {list(arr.shape)}"
            )
        self.write_image(topic, stamp_ns, arr, frame_id)

    def write_compressed_image(
        self,
        topic: str,
        stamp_ns: int,
        rgb: np.ndarray,
        fmt: str = "jpeg",
        frame_id: str = "",
        quality: int = 95,
    ) -> None:
        """Write `sensor_msgs/CompressedImage` from uint8 [H, W, 3] RGB.

        The format field follows image_transport: "rgb8; jpeg compressed bgr8" (or png).
        """
        arr = np.asarray(rgb)
        if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
            raise RealsimError(
                f"write_compressed_image {topic!r}: expected uint8 [H, W, 3], got "
                f"{arr.dtype} {list(arr.shape)}"
            )
        if fmt not in ("jpeg", "png"):
            raise RealsimError(
                f"write_compressed_image {topic!r}: fmt must be jpeg or png, not {fmt!r}"
            )
        params = [cv2.IMWRITE_JPEG_QUALITY, int(quality)] if fmt == "jpeg" else []
        ok, buf = cv2.imencode(".jpg" if fmt == "jpeg" else ".png", arr[:, :, ::-1], params)
        if not ok:
            raise RealsimError(f"write_compressed_image {topic!r}: OpenCV could not encode {fmt}")
        msg = self._typestore.types[COMPRESSED_IMAGE](
            header=self._header(stamp_ns, frame_id),
            format=f"rgb8; {fmt} compressed bgr8",
            data=np.asarray(buf, dtype=np.uint8).reshape(-1),
        )
        self._write_msg(topic, stamp_ns, msg)

    def write_camera_info(
        self, topic: str, stamp_ns: int, intrinsics: CameraIntrinsics, frame_id: str = ""
    ) -> None:
        """Write `sensor_msgs/CameraInfo`: K, P from intrinsics, R identity, D zeros."""
        k = intrinsics
        msg = self._typestore.types[CAMERA_INFO](
            header=self._header(stamp_ns, frame_id),
            height=int(k.height),
            width=int(k.width),
            distortion_model="plumb_bob",
            d=np.zeros(5),
            k=np.array([k.fx, 0.0, k.cx, 0.0, k.fy, k.cy, 0.0, 0.0, 1.0]),
            r=np.eye(3).reshape(-1),
            p=np.array([k.fx, 0.0, k.cx, 0.0, 0.0, k.fy, k.cy, 0.0, 0.0, 0.0, 1.0, 0.0]),
            binning_x=0,
            binning_y=0,
            roi=self._typestore.types["sensor_msgs/msg/RegionOfInterest"](
                x_offset=0, y_offset=0, height=0, width=0, do_rectify=False
            ),
        )
        self._write_msg(topic, stamp_ns, msg)

    def write_joint_state(
        self,
        topic: str,
        stamp_ns: int,
        names: Sequence[str],
        positions: Sequence[float] | np.ndarray,
        velocities: Sequence[float] | np.ndarray | None = None,
        efforts: Sequence[float] | np.ndarray | None = None,
    ) -> None:
        """Write `sensor_msgs/JointState`; positions [J] rad (m for fingers)."""
        names = [str(n) for n in names]
        arrays = {}
        for label, values in (("positions", positions), ("velocities", velocities),
                              ("efforts", efforts)):
            arr = np.zeros(0) if values is None else np.asarray(values, dtype=np.float64).ravel()
            if values is not None and arr.size != len(names):
                raise RealsimError(
                    f"write_joint_state {topic!r}: {len(names)} names but {arr.size} {label}"
                )
            arrays[label] = arr
        msg = self._typestore.types[JOINT_STATE](
            header=self._header(stamp_ns, ""),
            name=names,
            position=arrays["positions"],
            velocity=arrays["velocities"],
            effort=arrays["efforts"],
        )
        self._write_msg(topic, stamp_ns, msg)

    def write_raw(
        self,
        topic: str,
        msgtype: str,
        stamp_ns: int,
        cdr_bytes: bytes,
        msgdef: str | None = None,
    ) -> None:
        """Write already serialised CDR bytes (e.g. from a recorder subscription).

        Args:
            topic: topic name.
            msgtype: "pkg/msg/Type".
            stamp_ns: bag receive time (ns); the header inside `cdr_bytes` is kept as is.
            cdr_bytes: the serialised message (CDR, with encapsulation header).
            msgdef: the .msg text, needed only for types this module's typestore lacks.

        """
        _stamp_fields(stamp_ns)
        if msgdef is not None and msgtype not in self._typestore.fielddefs:
            if self._typestore is _TYPESTORE:
                self._typestore = get_typestore(Stores.ROS2_KILTED)
            try:
                self._typestore.register(get_types_from_msg(msgdef, msgtype))
            except Exception as err:
                raise RealsimError(
                    f"write_raw {topic!r}: bad message definition for {msgtype}: {_one_line(err)}"
                ) from err
        conn = self._connection(topic, msgtype)
        self._writer.write(conn, int(stamp_ns), bytes(cdr_bytes))  # type: ignore[union-attr]


# --------------------------------------------------------------------------- reading


class _RecoveringMcapReader(McapReader):
    """`McapReader` that falls back to the complete records of a truncated file."""

    recovered: str | None = None

    def _open(self) -> None:
        try:
            super()._open()
            return
        except Exception as err:  # ReaderError, OSError (file < 37 bytes), struct.error
            first = _one_line(err)
            if self.data_start <= 0:  # the header itself is bad: nothing to recover
                raise RealsimError(f"{self.path} is not a readable MCAP file ({first})") from err
        self.schemas.clear()
        self.channels.clear()
        self.chunks.clear()
        self.connections.clear()
        self.statistics = None
        try:
            self.data_end = self._complete_data_end()
            self.meta_scan()
        except Exception as err:
            raise RealsimError(
                f"MCAP file {self.path} is damaged ({first}) and could not be recovered: "
                f"{_one_line(err)}"
            ) from err
        stats = self.statistics
        assert stats is not None
        self.connections = [
            x._replace(msgcount=stats.channel_message_counts.get(x.id, 0))
            for x in self.connections
        ]
        count = stats.message_count
        self.metadata = self.metadata._replace(
            duration=stats.end_time - stats.start_time + 1 if count else 0,
            start_time=stats.start_time if count else 2**63 - 1,
            end_time=stats.end_time + 1 if count else 0,
            message_count=count,
        )
        size = self.path.stat().st_size
        self.recovered = (
            f"{self.path.name} is truncated or damaged ({first}); recovered {count} messages "
            f"from the first {self.data_end} of {size} bytes"
        )

    def _complete_data_end(self) -> int:
        """Offset just past the last complete top-level record of the data section."""
        bio = self.bio
        assert bio is not None
        size = bio.seek(0, 2)
        pos = self.data_start
        while pos + 9 <= size:
            _ = bio.seek(pos)
            head = bio.read(9)
            op_, length = head[0], struct.unpack("<Q", head[1:9])[0]
            end = pos + 9 + length
            # 0x0F DataEnd / 0x02 Footer close the data section; 0x00 is not a record.
            if op_ in (0x00, 0x02, 0x0F) or end > size:
                break
            pos = end
        return pos

    def messages(self, connections, start=None, stop=None):  # noqa: D102 (as base class)
        if self.recovered is None:
            yield from super().messages(connections, start, stop)
            return
        # No chunk index after recovery: scan, then order by time (recovery keeps all in memory).
        yield from sorted(self.messages_scan(connections, start, stop), key=lambda m: m[1])


class _DirReader(DirectoryReader):
    """rosbag2 folder reader with truncated-MCAP recovery and time-ordered merging."""

    STORAGE_PLUGINS = {"mcap": _RecoveringMcapReader, "sqlite3": Sqlite3Reader}

    def messages(self, connections, start=None, stop=None):  # noqa: D102 (as base class)
        decompress = None
        if self.metadata.compression_mode == "message":
            from rosbags.rosbag2.reader import zstd

            decompress = zstd.decompress
        sources = []
        for storage in self.storages:
            connmap = {
                x.id: conn
                for x in storage.connections
                if (
                    conn := next(
                        (
                            y
                            for y in connections
                            if y.topic == x.topic
                            and y.msgtype == x.msgtype
                            and (not x.digest or not y.digest or y.digest == x.digest)
                        ),
                        None,
                    )
                )
                is not None
            }
            conns = [x for x in storage.connections if x.id in connmap]
            if conns:
                sources.append(_mapped(storage.messages(conns, start, stop), connmap, decompress))
        yield from heapq.merge(*sources, key=lambda m: m[1])


def _mapped(messages, connmap, decompress):
    for conn, timestamp, data in messages:
        yield connmap[conn.id], timestamp, decompress(data) if decompress else data


class _LooseMcapReader:
    """Folder of `.mcap` files without `metadata.yaml` (recording never finished)."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self.storages: list[_RecoveringMcapReader] = []
        self.connections: list[Connection] = []

    def open(self) -> None:
        for f in self.files:
            storage = _RecoveringMcapReader(f)
            storage.open()
            self.storages.append(storage)
            self.connections.extend(storage.connections)

    def close(self) -> None:
        for s in self.storages:
            s.close()

    def messages(self, connections, start=None, stop=None):  # noqa: D102
        wanted = {id(c) for c in connections}
        sources = []
        for storage in self.storages:
            conns = [c for c in storage.connections if id(c) in wanted]
            if conns:
                sources.append(storage.messages(conns, start, stop))
        yield from heapq.merge(*sources, key=lambda m: m[1])


class _OpenBag:
    """Open a bag path, normalise errors to RealsimError, collect warnings."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.warnings: list[str] = []
        self._stack = ExitStack()
        self.reader: _DirReader | _LooseMcapReader | Sqlite3Reader | _RecoveringMcapReader

    def __enter__(self) -> _OpenBag:
        path = self.path
        if not path.exists():
            raise RealsimError(f"bag {path} does not exist")
        if path.is_dir():
            if (path / "metadata.yaml").exists():
                self.reader = _DirReader(path)
            else:
                files = sorted(path.glob("*.mcap"))
                if not files:
                    raise RealsimError(
                        f"{path} is not a rosbag2 bag: no metadata.yaml and no .mcap file in it"
                    )
                self.reader = _LooseMcapReader(files)
                self.warnings.append(
                    f"{path} has no metadata.yaml (recording interrupted?); read "
                    f"{len(files)} .mcap file(s) directly"
                )
        elif path.suffix == ".mcap":
            self.reader = _RecoveringMcapReader(path)
        elif path.suffix == ".db3":
            self.reader = Sqlite3Reader(path)
        else:
            raise RealsimError(
                f"{path} is not a rosbag2 bag (expected a bag folder, a .mcap or a .db3 file)"
            )
        try:
            self.reader.open()
        except RealsimError:
            raise
        except Exception as err:
            raise RealsimError(f"cannot read bag {path}: {_one_line(err)}") from err
        self._stack.callback(self.reader.close)
        storages = getattr(self.reader, "storages", [self.reader])
        for storage in storages:
            note = getattr(storage, "recovered", None)
            if note:
                self.warnings.append(f"bag {path}: {note}")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._stack.close()
        except Exception as err:  # closing a damaged file must not mask the real error
            _LOG.debug("closing %s failed: %s", self.path, err)

    def select(self, topics: Iterable[str] | None) -> list[Connection]:
        conns = list(self.reader.connections)
        if topics is None:
            return conns
        wanted = [topics] if isinstance(topics, str) else list(topics)
        present = {c.topic for c in conns}
        for t in wanted:
            if t not in present:
                self.warnings.append(f"bag {self.path}: topic {t} is not in the bag")
        return [c for c in conns if c.topic in set(wanted)]

    def messages(self, conns: list[Connection]) -> Iterator[tuple[Connection, int, bytes]]:
        if not conns:
            return iter(())
        return self.reader.messages(conns)


def bag_topics(path: str | Path, topics: Iterable[str] | None = None) -> dict[str, str]:
    """{topic: "pkg/msg/Type"} of a bag, from its index (no message is read)."""
    with _OpenBag(path) as bag:
        return {c.topic: c.msgtype for c in bag.select(topics)}


def iter_raw(
    path: str | Path, topics: Iterable[str] | None = None
) -> Iterator[tuple[str, str, int, bytes]]:
    """Yield `(topic, msgtype, bag_time_ns, cdr_bytes)` in bag-time order.

    `msgtype` is "pkg/msg/Type". The bag is opened by this call, so a missing or
    unreadable bag raises `RealsimError` here, not at the first `next()`; damage found
    while iterating raises `RealsimError` then. Recovery warnings of a truncated bag go to
    the logger. The bag is closed when the iterator is exhausted or garbage-collected.
    """
    bag = _OpenBag(path).__enter__()
    try:
        for w in bag.warnings:
            _LOG.warning("%s", w)
        conns = bag.select(topics)
    except BaseException:
        bag.__exit__(None, None, None)
        raise
    return _iter_raw(bag, conns)


def _iter_raw(bag: _OpenBag, conns: list[Connection]) -> Iterator[tuple[str, str, int, bytes]]:
    try:
        it = bag.messages(conns)
        last_t = None
        while True:
            try:
                conn, t, data = next(it)
            except StopIteration:
                return
            except Exception as err:
                raise RealsimError(
                    f"bag {bag.path} is damaged after t={last_t} ns: {_one_line(err)}"
                ) from err
            last_t = t
            yield conn.topic, conn.msgtype, int(t), bytes(data)
    finally:
        bag.__exit__(None, None, None)


@dataclass(frozen=True)
class Recording:
    """Everything `read_bag` decoded, per topic, each list sorted by header stamp (ns).

    images: RGB uint8 [H, W, 3] samples (Image and CompressedImage topics, masks excluded).
    camera_infos: (stamp_ns, CameraIntrinsics) per CameraInfo message.
    joint_states: JointStateSample per JointState message.
    masks: topics ending in "object_mask"; `rgb` holds uint8 [H, W] (mono8 values kept,
        other encodings -> 0/255).
    start_ns, end_ns: bag receive time of the first / last message read (0, 0 if none).
    warnings: one line each: recovery, skipped messages (counted), missing topics.
    topic_types: topic -> "pkg/msg/Type" of every topic that was read.
    """

    images: dict[str, list[ImageSample]] = field(default_factory=dict)
    camera_infos: dict[str, list[tuple[int, CameraIntrinsics]]] = field(default_factory=dict)
    joint_states: dict[str, list[JointStateSample]] = field(default_factory=dict)
    masks: dict[str, list[ImageSample]] = field(default_factory=dict)
    start_ns: int = 0
    end_ns: int = 0
    warnings: list[str] = field(default_factory=list)
    topic_types: dict[str, str] = field(default_factory=dict)


def _header_stamp(msg: object, bag_time: int) -> tuple[int, bool]:
    stamp = msg.header.stamp  # type: ignore[attr-defined]
    ns = int(stamp.sec) * _NS + int(stamp.nanosec)
    return (ns, False) if ns > 0 else (int(bag_time), True)


def _intrinsics(msg: object) -> CameraIntrinsics:
    k = np.asarray(msg.k, dtype=np.float64)  # type: ignore[attr-defined]
    p = np.asarray(msg.p, dtype=np.float64)  # type: ignore[attr-defined]
    if k.size == 9 and k[0] > 0 and k[4] > 0:
        fx, fy, cx, cy = k[0], k[4], k[2], k[5]
    elif p.size == 12 and p[0] > 0 and p[5] > 0:
        fx, fy, cx, cy = p[0], p[5], p[2], p[6]
    else:
        raise RealsimError("camera_info has neither a valid K nor a valid P matrix")
    w, h = int(msg.width), int(msg.height)  # type: ignore[attr-defined]
    if w <= 0 or h <= 0:
        raise RealsimError(f"camera_info has an invalid size {w}x{h}")
    bx, by = max(int(msg.binning_x), 1), max(int(msg.binning_y), 1)  # type: ignore[attr-defined]
    if bx > 1 or by > 1:  # K is for the full-resolution sensor
        fx, cx, fy, cy = fx / bx, (cx + 0.5) / bx - 0.5, fy / by, (cy + 0.5) / by - 0.5
        w, h = w // bx, h // by
    return CameraIntrinsics(w, h, float(fx), float(fy), float(cx), float(cy))


def read_bag(path: str | Path, topics: Iterable[str] | None = None) -> Recording:
    """Read a rosbag2 bag (folder, MCAP or sqlite3) into a `Recording`.

    Args:
        path: bag folder (or a single .mcap / .db3 file).
        topics: topic names to read; None reads every topic of a supported type
            (Image, CompressedImage, CameraInfo, JointState). Others are ignored.

    Raises:
        RealsimError: the bag cannot be opened (missing, not a bag, corrupt metadata,
            unrecoverable storage file).

    """
    images: dict[str, list[ImageSample]] = defaultdict(list)
    masks: dict[str, list[ImageSample]] = defaultdict(list)
    infos: dict[str, list[tuple[int, CameraIntrinsics]]] = defaultdict(list)
    joints: dict[str, list[JointStateSample]] = defaultdict(list)
    skipped: dict[str, Counter[str]] = defaultdict(Counter)
    zero_stamps: Counter[str] = Counter()
    topic_types: dict[str, str] = {}
    start_ns, end_ns = None, None

    with _OpenBag(path) as bag:
        conns = [c for c in bag.select(topics) if c.msgtype in _DECODED_TYPES]
        for c in conns:
            topic_types[c.topic] = c.msgtype
        it = bag.messages(conns)
        while True:
            try:
                conn, bag_time, data = next(it)
            except StopIteration:
                break
            except Exception as err:
                bag.warnings.append(
                    f"bag {bag.path}: stopped reading after t={end_ns} ns, data damaged: "
                    f"{_one_line(err)}"
                )
                break
            start_ns = bag_time if start_ns is None else min(start_ns, bag_time)
            end_ns = bag_time if end_ns is None else max(end_ns, bag_time)
            topic, msgtype = conn.topic, conn.msgtype
            try:
                msg = _TYPESTORE.deserialize_cdr(data, msgtype)
                stamp, fallback = _header_stamp(msg, bag_time)
                if fallback:
                    zero_stamps[topic] += 1
                if msgtype in _IMAGE_TYPES:
                    is_mask = topic.rstrip("/").endswith(MASK_SUFFIX)
                    if msgtype == IMAGE:
                        args = (msg.encoding, msg.height, msg.width, msg.step, msg.data,
                                msg.is_bigendian)
                        pixels = decode_mask_u8(*args) if is_mask else decode_image(*args)
                    else:
                        pixels = decode_compressed(msg.format, msg.data)
                        if is_mask:
                            pixels = pixels.max(axis=2)
                    sample = ImageSample(stamp, pixels, msg.header.frame_id)
                    (masks if is_mask else images)[topic].append(sample)
                elif msgtype == CAMERA_INFO:
                    infos[topic].append((stamp, _intrinsics(msg)))
                else:
                    names = tuple(str(n) for n in msg.name)
                    position = np.asarray(msg.position, dtype=np.float64).copy()
                    if position.size != len(names):
                        raise RealsimError(
                            f"{len(names)} names but {position.size} positions"
                        )
                    joints[topic].append(JointStateSample(
                        stamp, names, position,
                        np.asarray(msg.velocity, dtype=np.float64).copy(),
                        np.asarray(msg.effort, dtype=np.float64).copy(),
                    ))
            except Exception as err:  # one bad message must not end the read
                skipped[topic][_one_line(err)] += 1

    warnings = list(bag.warnings)
    for topic, reasons in skipped.items():
        total = sum(reasons.values())
        reason, n = reasons.most_common(1)[0]
        more = f" (and {len(reasons) - 1} other reasons)" if len(reasons) > 1 else ""
        warnings.append(
            f"bag {bag.path}: skipped {total} message(s) on {topic}: {reason} [{n}x]{more}"
        )
    for topic, n in zero_stamps.items():
        warnings.append(
            f"bag {bag.path}: {n} message(s) on {topic} have a zero header stamp; "
            "used the bag receive time"
        )

    def _sorted(d: dict) -> dict:
        return {k: sorted(v, key=lambda s: s[0] if isinstance(s, tuple) else s.stamp_ns)
                for k, v in d.items()}

    return Recording(
        images=_sorted(images),
        camera_infos=_sorted(infos),
        joint_states=_sorted(joints),
        masks=_sorted(masks),
        start_ns=int(start_ns or 0),
        end_ns=int(end_ns or 0),
        warnings=warnings,
        topic_types=topic_types,
    )
