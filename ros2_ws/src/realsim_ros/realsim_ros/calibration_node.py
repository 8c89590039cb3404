"""The realsim calibration node (thin: parameters, conversions, publishing; logic in realsim_core).

Inputs (sensor-data QoS): the cameras' Image or CompressedImage, their camera_info, the
arms' joint_states, optional object masks. Callbacks only decode and append into a
`realsim_core.online.OnlineCalibrator`; its worker thread assembles frame sets, keeps
keyframes and steps the estimator (the engine, or `NominalEstimator` until it exists).

Outputs (contracts.md): `/tf_static` (mount -> optical frame, transient local),
`~/joint_offsets`, `~/<arm>/joint_states` (measured + offsets, same stamps, at input
rate), `~/objects` (MarkerArray, world frame) and `~/objects/<name>/mesh` (Mesh, object
frame), both transient local: the objects of the calibration served (the node does not
reconstruct objects), `/diagnostics`; services `~/save`, `~/reset` (Trigger), `~/freeze` (SetBool).
It resumes from `<output_dir>/calibration.yaml` and saves there on shutdown when the
estimate changed.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import rclpy
import yaml
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    ParameterType,
    SetParametersResult,
)
from rclpy.clock import Clock, ClockType
from rclpy.exceptions import InvalidParameterValueException, ParameterException
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, CompressedImage, Image, JointState
from shape_msgs.msg import Mesh
from std_srvs.srv import SetBool, Trigger
from tf2_msgs.msg import TFMessage
from visualization_msgs.msg import MarkerArray

from realsim_core.errors import RealsimError
from realsim_core.online import (
    CalibrationStore,
    OnlineCalibrator,
    SyncOptions,
    nominal_calibration,
)
from realsim_core.rig import load_rig
from realsim_core.sync import ACCEPTED, DUPLICATE, RESET
from realsim_ros import conversions as conv
from realsim_ros import defaults

try:
    from rclpy.event_handler import SubscriptionEventCallbacks, UnsupportedEventTypeError
except ImportError:  # Humble
    from rclpy.qos_event import SubscriptionEventCallbacks, UnsupportedEventTypeError

NODE_NAME = "realsim"
WARN_PERIOD_S = 60.0  # a repeated problem of one kind is logged at most this often
ASPECT_TOLERANCE = 0.01  # image vs camera_info aspect ratio mismatch still rescaled
INFO_GRACE_S = 0.5  # wait this long (steady s) for camera_info before using the rig's


@dataclass
class _TopicCounter:
    """Messages received on one input topic, with the last receive time (monotonic s)."""

    topic: str
    optional: bool = False
    count: int = 0
    last_rx: float = field(default=-math.inf)
    last_stamp_ns: int = -1
    lost: int = 0  # messages the transport reported lost (DDS sample-lost events)
    gaps: int = 0  # messages missing by the stamps (see `stamp`)
    _periods: list = field(default_factory=list)
    _pending: list = field(default_factory=list)
    _prev_ns: int = -1

    def tick(self) -> None:
        self.count += 1
        self.last_rx = time.monotonic()

    def stamp(self, ns: int) -> None:
        """Track header stamps; estimate missed messages from gaps (ns).

        Each interval over 1.5 periods (`stream_period`, from the last 32 intervals)
        counts round(interval / period) - 1 missing messages, at most 10 s of them (a
        pause is not a million drops; a cap of 100 messages undercounted 4-5 s blackouts
        of a 30 Hz camera under overload). The first intervals wait for the first
        estimate and are counted then, so the start of an overloaded stream is not left
        out.
        """
        dt = ns - self._prev_ns if self._prev_ns >= 0 else 0
        self._prev_ns = ns
        if dt <= 0:
            return
        periods = self._periods
        periods.append(dt)
        if len(periods) > 32:
            del periods[0]
        self._pending.append(dt)
        if len(periods) < 8:
            return
        period = stream_period(periods)
        for d in self._pending:
            if d > 1.5 * period:
                self.gaps += min(round(d / period) - 1, max(100, round(MAX_GAP_NS / period)))
        self._pending.clear()


MAX_GAP_NS = 10_000_000_000  # _TopicCounter.stamp: one stamp gap counts at most 10 s of drops


def stream_period(intervals) -> float:
    """The period of a periodic stream from its stamp intervals, with messages missing.

    Every interval is a multiple of the period, so the median is no estimate once most
    messages are lost. Start from the second-smallest interval (one jittered short one
    does not halve it) and try it, half of it, a third, a quarter: refine each candidate
    on the intervals of up to 4 periods, and keep the first that explains 90 % of the
    intervals up to 10 periods as multiples (within 0.3 of a period).
    """
    ds = sorted(intervals)
    base = ds[1] if len(ds) > 8 else ds[0]
    for k in (1, 2, 3, 4):
        p = base / k
        p = float(np.median([d / max(1, round(d / p)) for d in ds if d < 4.5 * p]))
        near = [abs(d / p - round(d / p)) < 0.3 for d in ds if d < 10.5 * p]
        if sum(near) >= 0.9 * len(near):
            return p
    return float(ds[0])


# parameter name -> (type, min, max, read_only, default, description)
_NUMERIC = {
    "diagnostics_rate_hz": (float, 0.1, 50.0, True, 1.0, "Rate of /diagnostics (Hz)."),
    "publish_rate_hz": (float, 0.1, 50.0, False, 5.0,
                        "Rate at which ~/joint_offsets is republished and TF changes are "
                        "checked (Hz)."),
    "silent_after_s": (float, 0.01, 3600.0, False, 3.0,
                       "An input with no message for this long is reported as silent (s)."),
    "sync.image_tolerance_ms": (float, 0.1, 1000.0, False, 15.0,
                                "Max spread of image stamps within one frame set (ms)."),
    "sync.joint_tolerance_ms": (float, 0.1, 5000.0, False, 50.0,
                                "How far a frame set may be from the nearest joint state "
                                "when it cannot be bracketed (ms)."),
    "sync.max_latency_ms": (float, 1.0, 10000.0, False, 500.0,
                            "How long a closed frame set waits for a later joint state (ms)."),
    "sync.min_cameras": (int, 1, 64, True, 1,
                         "Fewest images in a (partial) frame set that is still used."),
    "sync.max_pending": (int, 1, 1024, True, 16,
                         "Open frame sets kept (memory bound; the oldest is dropped)."),
    "sync.joint_capacity": (int, 2, 100000, True, 1000,
                            "Joint state samples buffered per arm."),
    "keyframes.capacity": (int, 1, 10000, True, 32,
                           "Most keyframes kept for calibration (memory bound)."),
    "keyframes.min_joint_distance": (float, 1e-6, 100.0, True, 0.05,
                                     "Joint-space distance for a new keyframe (rad)."),
    "keyframes.min_view_distance": (float, 0.0, 1.0, True, 0.0,
                                    "View change for a new keyframe (grey levels in [0, 1]; "
                                    "0 = views ignored)."),
    "worker.queue_capacity": (int, 1, 1024, True, 8,
                              "Frame sets waiting for the worker (memory bound; oldest "
                              "dropped and counted)."),
}


class CalibrationNode(Node):
    """Declares parameters, converts inputs, and publishes the current estimate."""

    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self._lock = threading.Lock()
        self._warned: dict[str, float] = {}
        self._declare_parameters()
        bad = [r for p in self.get_parameters([*_NUMERIC, "image_transport"])
               if (r := self._check_parameter(p.name, p.value)) is not None]
        if bad:
            raise RealsimError("; ".join(bad))
        self.add_on_set_parameters_callback(self._on_set_parameters)

        self.cameras = list(self.get_parameter("cameras").value)
        self.arms = list(self.get_parameter("arms").value)
        self.rig = load_rig(self.get_parameter("rig_file").value)
        self._rig_intrinsics = {}
        for cam in self.cameras:
            spec = self.rig.camera(cam)  # RealsimError naming the camera if unknown
            self._rig_intrinsics[cam] = spec.intrinsics
        rig_arms = {a.name: a for a in self.rig.arms}
        unknown = [a for a in self.arms if a not in rig_arms]
        if unknown:
            raise RealsimError(f"arms {unknown} are not in the rig file (rig has "
                               f"{sorted(rig_arms)})")
        self._arm_joints = {a: rig_arms[a].ros_joint_names for a in self.arms}
        self._known_joint_names = {
            a: set(self._arm_joints[a]) | set(defaults.JOINT_NAMES) for a in self.arms
        }

        # calibration state: nominal, resumed file, estimator
        self.nominal = nominal_calibration(self.rig)
        self.store = CalibrationStore(self.get_parameter("output_dir").value)
        start = None
        if self.get_parameter("resume").value:
            start, line = self.store.load(self.nominal)
            if self.store.corrupt:
                self.get_logger().error(line)
            elif start is not None and start.metrics.get("saved_from") == "nominal":
                self.get_logger().info(f"{self.store.path} holds the nominal; starting from "
                                       "the rig file's nominal")
                start = None
            elif line:
                self.get_logger().info(line)
        self.source = "resumed" if start is not None else "nominal"
        factory = self._estimator_factory()
        p = self.get_parameter
        options = SyncOptions(
            image_tolerance_ms=p("sync.image_tolerance_ms").value,
            joint_tolerance_ms=p("sync.joint_tolerance_ms").value,
            max_latency_ms=p("sync.max_latency_ms").value,
            min_cameras=min(p("sync.min_cameras").value, len(self.cameras)),
            max_pending=p("sync.max_pending").value,
            joint_capacity=p("sync.joint_capacity").value,
            keyframe_capacity=p("keyframes.capacity").value,
            keyframe_min_joint_distance=p("keyframes.min_joint_distance").value,
            keyframe_min_view_distance=p("keyframes.min_view_distance").value,
            queue_capacity=p("worker.queue_capacity").value,
        )
        self.calibrator = OnlineCalibrator(
            self.cameras, self._arm_joints, self.nominal, start, factory, options
        )
        self._saved_version = self.calibrator.version
        self._offsets = dict(self.calibrator.current.joint_offsets)
        self._offsets_version = self.calibrator.version
        self._tf_version = -1
        self._info: dict[str, object] = {}  # camera -> CameraIntrinsics from camera_info
        self._used_intrinsics: dict[str, object] = {}
        self._rejected: dict[str, int] = {}
        self._first_image: dict[str, float] = {}  # camera -> first image (monotonic s)
        self._last_drift = ""

        # inputs
        self._counters: dict[str, _TopicCounter] = {}
        self._subs = []
        transport = self.get_parameter("image_transport").value
        for cam in self.cameras:
            image_topic = self.get_parameter(f"{cam}.image_topic").value
            if transport == "compressed":
                self._subscribe(f"{cam}/image", CompressedImage,
                                image_topic.rstrip("/") + "/compressed",
                                lambda m, c=cam: self._on_image(c, m, compressed=True),
                                track_gaps=True)
            else:
                self._subscribe(f"{cam}/image", Image, image_topic,
                                lambda m, c=cam: self._on_image(c, m, compressed=False),
                                track_gaps=True)
            self._subscribe(f"{cam}/camera_info", CameraInfo,
                            self.get_parameter(f"{cam}.info_topic").value,
                            lambda m, c=cam: self._on_camera_info(c, m))
            mask_topic = self.get_parameter(f"{cam}.mask_topic").value
            if mask_topic:
                self._subscribe(f"{cam}/mask", Image, mask_topic,
                                lambda m, c=cam: self._on_mask(c, m), optional=True)
        self._joint_pubs = {}
        for arm in self.arms:
            self._joint_pubs[arm] = self.create_publisher(
                JointState, f"~/{arm}/joint_states", 10)  # reliable: matches any reader
            self._subscribe(f"{arm}/joint_states", JointState,
                            self.get_parameter(f"{arm}.joint_states_topic").value,
                            lambda m, a=arm: self._on_joint_state(a, m), depth=100)

        # outputs
        latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                             reliability=ReliabilityPolicy.RELIABLE)
        self._tf_pub = self.create_publisher(TFMessage, "/tf_static", latched)
        self._latched = latched
        self._objects_pub = self.create_publisher(MarkerArray, "~/objects", latched)
        self._mesh_pubs: dict[str, object] = {}  # object name -> ~/objects/<name>/mesh
        self._meshes: dict[tuple, tuple | None] = {}  # _mesh_key -> (V, F, Mesh) or None
        self._markers_key = None  # objects of the cached MarkerArray
        self._markers = None
        self._offsets_pub = self.create_publisher(JointState, "~/joint_offsets", 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_service(Trigger, "~/save", self._srv_save)
        self.create_service(Trigger, "~/reset", self._srv_reset)
        self.create_service(SetBool, "~/freeze", self._srv_freeze)
        # steady timers: they run before /clock arrives and through sim-time jumps
        self._steady = Clock(clock_type=ClockType.STEADY_TIME)
        rate = self.get_parameter("diagnostics_rate_hz").value
        self._diag_timer = self.create_timer(1.0 / rate, self._publish_diagnostics,
                                             clock=self._steady)
        self._pub_timer = None
        self._make_publish_timer(self.get_parameter("publish_rate_hz").value)
        self._started = time.monotonic()
        self.calibrator.start()
        self._publish_outputs()
        self.get_logger().info(
            f"listening to {len(self._counters)} topics; state: "
            f"{self.calibrator.estimator.state}; start: {self.source}; diagnostics at "
            f"{rate:g} Hz (rig: {self.get_parameter('rig_file').value})"
        )

    # ------------------------------------------------------------------ parameters
    def _declare_parameters(self) -> None:
        def desc(text: str, read_only: bool = False, **kw) -> ParameterDescriptor:
            return ParameterDescriptor(description=text, read_only=read_only, **kw)

        self.declare_parameter(
            "rig_file", defaults.RIG_FILE,
            desc("Rig file (YAML, contracts.md) or 'builtin:aloha2'.", read_only=True),
        )
        self.declare_parameter(
            "output_dir", defaults.OUTPUT_DIR,
            desc("Where calibration.yaml and meshes are written (~ expanded).", read_only=True),
        )
        self.declare_parameter(
            "resume", True,
            desc("Start from <output_dir>/calibration.yaml when it is present and valid.",
                 read_only=True),
        )
        self.declare_parameter(
            "estimator", "",
            desc("Calibration engine as 'module:factory', factory(rig, start) -> Estimator "
                 "(realsim_core.online); empty = nominal only (engine not available).",
                 read_only=True),
        )
        self.declare_parameter(
            "estimator_options", "",
            desc("Keyword options for the estimator factory, as a YAML/JSON mapping, e.g. "
                 "'{levels: [1], n_gaussians: 4000, accept_every: 2}' (see "
                 "realsim_core.online_engine.OPTIONS); empty = the factory's defaults.",
                 read_only=True),
        )
        self.declare_parameter(
            "cameras", list(defaults.CAMERAS),
            desc("Camera names (must be in the rig file); each has <name>.image_topic, "
                 "<name>.info_topic and <name>.mask_topic.", read_only=True),
        )
        self.declare_parameter(
            "arms", list(defaults.ARMS),
            desc("Arm names (must be in the rig file); each has <name>.joint_states_topic.",
                 read_only=True),
        )
        self.declare_parameter(
            "image_transport", "raw",
            desc("'raw' (sensor_msgs/Image) or 'compressed' (<image_topic>/compressed).",
                 read_only=True),
        )
        for cam in self.get_parameter("cameras").value:
            self.declare_parameter(
                f"{cam}.image_topic", defaults.image_topic(cam),
                desc(f"Image topic of {cam}.", read_only=True),
            )
            self.declare_parameter(
                f"{cam}.info_topic", defaults.info_topic(cam),
                desc(f"camera_info topic of {cam}.", read_only=True),
            )
            self.declare_parameter(
                f"{cam}.mask_topic", f"/{cam}/object_mask",
                desc(f"Optional object mask topic of {cam} (mono8); empty = none.",
                     read_only=True),
            )
        for arm in self.get_parameter("arms").value:
            self.declare_parameter(
                f"{arm}.joint_states_topic", f"/{arm}/joint_states",
                desc(f"sensor_msgs/JointState topic of {arm}.", read_only=True),
            )
        for name, (typ, lo, hi, ro, default, text) in _NUMERIC.items():
            if typ is float:
                rng = {"floating_point_range": [FloatingPointRange(
                    from_value=float(lo), to_value=float(hi), step=0.0)],
                    "type": ParameterType.PARAMETER_DOUBLE}
            else:
                rng = {"integer_range": [IntegerRange(from_value=lo, to_value=hi, step=1)],
                       "type": ParameterType.PARAMETER_INTEGER}
            self.declare_parameter(name, default, desc(text, read_only=ro, **rng))

    @staticmethod
    def _check_parameter(name: str, value) -> str | None:
        """Why `value` is not acceptable for `name` (None if it is)."""
        if name == "image_transport" and value not in ("raw", "compressed"):
            return f"image_transport must be 'raw' or 'compressed', got {value!r}"
        spec = _NUMERIC.get(name)
        if spec is None:
            return None
        typ, lo, hi = spec[:3]
        if typ is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, typ) or isinstance(value, bool):
            return f"{name} must be a {typ.__name__}, got {value!r}"
        if not (lo <= value <= hi) or (typ is float and not math.isfinite(value)):
            return f"{name} must be in [{lo:g}, {hi:g}], got {value!r}"
        return None

    def _on_set_parameters(self, params) -> SetParametersResult:
        for p in params:
            why = self._check_parameter(p.name, p.value)
            if why is not None:
                return SetParametersResult(successful=False, reason=why)
        for p in params:
            if p.name == "publish_rate_hz":
                self._make_publish_timer(float(p.value))
            elif p.name == "sync.image_tolerance_ms":
                self.calibrator.set_tolerances(image_ms=float(p.value))
            elif p.name == "sync.joint_tolerance_ms":
                self.calibrator.set_tolerances(joint_ms=float(p.value))
            elif p.name == "sync.max_latency_ms":
                self.calibrator.set_tolerances(max_latency_ms=float(p.value))
        return SetParametersResult(successful=True)

    def _make_publish_timer(self, rate: float) -> None:
        if not hasattr(self, "_steady"):
            return  # during construction; created once the outputs exist
        if self._pub_timer is not None:
            self.destroy_timer(self._pub_timer)
        self._pub_timer = self.create_timer(1.0 / rate, self._publish_outputs,
                                            clock=self._steady)

    def _estimator_factory(self):
        spec = self.get_parameter("estimator").value
        if not spec:
            return None
        try:
            module, _, attr = spec.partition(":")
            make = getattr(importlib.import_module(module), attr or "make_estimator")
        except (ImportError, AttributeError) as exc:
            self.get_logger().error(
                f"estimator {spec!r} not available ({exc}); publishing the nominal calibration")
            return None
        options = self.get_parameter("estimator_options").value
        try:
            kwargs = yaml.safe_load(options) if options.strip() else {}
        except yaml.YAMLError as exc:
            raise RealsimError(f"estimator_options is not YAML: "
                               f"{' '.join(str(exc).split())}") from None
        if kwargs is None:
            kwargs = {}
        if not isinstance(kwargs, dict):
            raise RealsimError(f"estimator_options must be a mapping, got {options!r}")
        rig = self.rig

        def factory(start):
            try:
                return make(rig, start, **kwargs)
            except TypeError as exc:  # the factory does not take these options
                raise RealsimError(f"estimator {spec!r}: {exc}") from None

        return factory

    # ------------------------------------------------------------------ logging
    def _warn(self, key: str, text: str, error: bool = False) -> None:
        """Log `text` once per WARN_PERIOD_S for each problem `key`."""
        now = time.monotonic()
        last = self._warned.get(key)
        if last is not None and now - last < WARN_PERIOD_S:
            return
        self._warned[key] = now
        (self.get_logger().error if error else self.get_logger().warning)(text)

    def _reject(self, key: str, text: str) -> None:
        self._rejected[key] = self._rejected.get(key, 0) + 1
        self._warn(key, text)

    # ------------------------------------------------------------------ inputs
    def _subscribe(self, key, msg_type, topic, handler, optional: bool = False,
                   track_gaps: bool = False, depth: int | None = None) -> None:
        """Subscribe with sensor-data QoS; `track_gaps` for periodic streams (images).

        With `track_gaps`, messages missed are estimated from stamp gaps. `depth` overrides
        the profile's queue depth (5): small, fast streams (joint states at 50+ Hz) need a
        longer queue so a callback busy decoding an image does not drop them.
        """
        counter = _TopicCounter(topic, optional)
        self._counters[key] = counter

        def callback(msg, counter=counter) -> None:
            counter.tick()
            counter.last_stamp_ns = conv.stamp_to_ns(msg.header.stamp)
            if track_gaps:
                counter.stamp(counter.last_stamp_ns)
            try:
                handler(msg)
            except Exception as exc:  # never let one bad message take the node down
                self._reject(f"{key}/error", f"{key}: message dropped: "
                             f"{type(exc).__name__}: {exc}")

        def lost(info, counter=counter) -> None:
            counter.lost = int(info.total_count)

        qos = qos_profile_sensor_data
        if depth is not None:
            qos = QoSProfile(depth=depth, reliability=qos.reliability,
                             durability=qos.durability, history=qos.history)
        try:
            events = SubscriptionEventCallbacks(message_lost=lost)
            sub = self.create_subscription(msg_type, topic, callback, qos,
                                           event_callbacks=events)
        except UnsupportedEventTypeError:  # the RMW cannot report lost samples
            sub = self.create_subscription(msg_type, topic, callback, qos)
        self._subs.append(sub)

    def counts(self) -> dict[str, int]:
        """Messages received so far, by input key (e.g. `cam_high/image`)."""
        return {k: c.count for k, c in self._counters.items()}

    def _on_image(self, cam: str, msg, compressed: bool) -> None:
        try:
            sample = conv.compressed_to_sample(msg) if compressed else conv.image_to_sample(msg)
        except RealsimError as exc:
            self._reject(f"{cam}/image/undecodable", f"{cam}: image dropped: {exc}")
            return
        h, w = sample.rgb.shape[:2]
        intr = self._intrinsics_for(cam, w, h)
        if intr is None:
            return
        status = self.calibrator.add_image(cam, sample)
        if status == "clock_resets":
            self._warn("clock_jump", f"{self.calibrator.assembler.last_message}; sync "
                       "restarted (repeats counted in /diagnostics sync/clock_resets)")
        elif status != ACCEPTED:  # one line per kind; counts in /diagnostics sync/*
            self._warn(f"image/{status}", f"{cam}: image at {sample.stamp_ns} ns: "
                       f"{status.replace('_', ' ')} (counted in /diagnostics sync/{status})")

    def _intrinsics_for(self, cam: str, w: int, h: int):
        """Intrinsics for a w x h image of `cam` (None: the image must be dropped)."""
        info = self._info.get(cam)
        if info is None:
            # camera_info usually comes with (or just after) the first image: give it a moment
            first = self._first_image.setdefault(cam, time.monotonic())
            waited = time.monotonic() - first > INFO_GRACE_S
            base = self._rig_intrinsics[cam]
            fits = base is not None and abs(w / h - base.width / base.height) <= (
                ASPECT_TOLERANCE * w / h)
            if not waited and not fits:
                self._rejected[f"{cam}/image/waiting_for_camera_info"] = (
                    self._rejected.get(f"{cam}/image/waiting_for_camera_info", 0) + 1)
                return None
            if base is None:
                self._reject(f"{cam}/image/no_intrinsics",
                             f"{cam}: no camera_info and no intrinsics in the rig file; "
                             "images dropped until camera_info arrives")
                return None
            if waited:
                self._warn(f"{cam}/no_camera_info",
                           f"{cam}: no camera_info on "
                           f"{self.get_parameter(f'{cam}.info_topic').value}; using the rig "
                           f"file's intrinsics ({base.width}x{base.height})")
            source = "rig"
        else:
            base, source, waited = info, "camera_info", False
        if (base.width, base.height) != (w, h):
            if abs(w / h - base.width / base.height) > ASPECT_TOLERANCE * (w / h):
                self._reject(f"{cam}/image/size_mismatch",
                             f"{cam}: image {w}x{h} does not match the {source} size "
                             f"{base.width}x{base.height} (aspect differs); images dropped")
                return None
            if source == "camera_info" or waited:  # not while camera_info is due any moment
                self._warn(f"{cam}/rescaled",
                           f"{cam}: image {w}x{h} != {source} {base.width}x{base.height}; "
                           "intrinsics rescaled to the image")
            base = base.scaled(w, h)
        if self._used_intrinsics.get(cam) != base:
            self._used_intrinsics[cam] = base
            self.calibrator.set_intrinsics(cam, base)
        return base

    def _on_camera_info(self, cam: str, msg) -> None:
        try:
            intr = conv.camera_info_to_intrinsics(msg)
        except RealsimError as exc:
            self._reject(f"{cam}/camera_info/invalid", f"{cam}: camera_info ignored: {exc}")
            return
        if self._info.get(cam) != intr:
            if cam in self._info:
                self._warn(f"{cam}/camera_info_changed",
                           f"{cam}: camera_info changed to {intr.width}x{intr.height} "
                           f"fx={intr.fx:g}")
            self._info[cam] = intr

    def _on_mask(self, cam: str, msg) -> None:
        try:
            mask = conv.mask_to_array(msg)
        except RealsimError as exc:
            self._reject(f"{cam}/mask/undecodable", f"{cam}: mask dropped: {exc}")
            return
        self.calibrator.add_mask(cam, conv.stamp_to_ns(msg.header.stamp), mask)

    def _on_joint_state(self, arm: str, msg) -> None:
        unknown = [n for n in msg.name if n not in self._known_joint_names[arm]]
        if unknown:
            self._warn(f"{arm}/unknown_joints",
                       f"{arm}: joint_states name unknown joints {unknown} (ignored)")
        status = self.calibrator.add_joint_state(arm, conv.joint_state_to_sample(msg))
        if status == RESET:
            self._warn("clock_jump", f"{self.calibrator.assembler.last_message}; sync "
                       "restarted (repeats counted in /diagnostics sync/clock_resets)")
        elif status == DUPLICATE:
            self._warn("joint_duplicate", f"{arm}: duplicate joint_states stamp ignored "
                       "(counted in /diagnostics sync/joint_duplicate)")
        elif status != ACCEPTED:
            self._rejected[f"{arm}/{status}"] = self._rejected.get(f"{arm}/{status}", 0) + 1
            self._warn(f"{arm}/{status}",
                       f"{arm}: joint_states not used for sync: "
                       f"{self.calibrator.assembler.buffers[arm].last_message}")
        version = self.calibrator.version
        if version != self._offsets_version:
            self._offsets = dict(self.calibrator.current.joint_offsets)
            self._offsets_version = version
        out = conv.corrected_joint_state(msg, arm, self._offsets)
        if out is None:
            self._rejected[f"{arm}/not_republished"] = (
                self._rejected.get(f"{arm}/not_republished", 0) + 1)
            return
        self._joint_pubs[arm].publish(out)

    # ------------------------------------------------------------------ outputs
    def _publish_outputs(self) -> None:
        cal = self.calibrator.current
        version = self.calibrator.version
        stamp = self.get_clock().now().to_msg()
        changed = version != self._tf_version
        if changed:
            self._tf_pub.publish(TFMessage(transforms=conv.calibration_to_transforms(cal, stamp)))
            self._tf_version = version
        self._offsets_pub.publish(conv.offsets_to_joint_state(cal.joint_offsets, stamp))
        if changed:
            try:
                self._publish_objects(cal.objects, stamp)
            except Exception as exc:  # objects are extra: never stop TF/offsets for them
                self._warn("objects/error", f"objects not published: "
                           f"{type(exc).__name__}: {exc}")

    @staticmethod
    def _mesh_key(path) -> tuple:
        """(path, mtime, size): a rewritten file is read again, an unchanged one is not."""
        try:
            st = os.stat(path)
            return str(path), st.st_mtime_ns, st.st_size
        except OSError:
            return str(path), None, None

    def _mesh(self, obj, key: tuple):
        """(vertices, faces, Mesh msg) of `obj`, or None (warned once per file version)."""
        if key not in self._meshes:
            try:
                v, f = conv.load_mesh(obj.mesh)
                self._meshes[key] = (v, f, conv.mesh_msg(v, f))
            except RealsimError as exc:
                self._meshes[key] = None
                self.get_logger().warning(
                    f"object {obj.name}: {exc}; not published on ~/objects (the other "
                    "objects and outputs are)")
        return self._meshes[key]

    @staticmethod
    def mesh_topic(name: str) -> str:
        """`~/objects/<name>/mesh`, the name made a valid topic token (a-z, 0-9, _)."""
        token = re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", name)).strip("_") or "object"
        if token[0].isdigit():
            token = f"object_{token}"
        return f"~/objects/{token}/mesh"

    def _publish_objects(self, objects, stamp) -> None:
        """~/objects (all objects, world frame) and ~/objects/<name>/mesh (object frame).

        Called whenever the published calibration changes; meshes and markers are built
        again only when the objects (names, files, poses) changed.
        """
        keys, shown, seen = {}, [], set()
        for obj in objects:
            if obj.name in seen:
                self._warn(f"objects/{obj.name}/duplicate",
                           f"object name {obj.name!r} appears twice; the second is ignored")
                continue
            seen.add(obj.name)
            key = self._mesh_key(obj.mesh)
            if self._mesh(obj, key) is not None:
                keys[obj.name] = key
                shown.append(obj)
        self._meshes = {k: self._meshes[k] for k in {self._mesh_key(o.mesh) for o in objects}
                        if k in self._meshes}  # forget files no longer used
        markers_key = tuple((o.name, keys[o.name], np.asarray(o.pose).tobytes())
                            for o in shown)
        if markers_key != self._markers_key:
            meshes = {o.name: self._meshes[keys[o.name]][:2] for o in shown}
            self._markers = conv.object_markers(shown, self.rig.world_frame, stamp, meshes)
            self._markers_key = markers_key
        for m in self._markers.markers:
            m.header.stamp = stamp
        self._objects_pub.publish(self._markers)

        for name in [n for n in self._mesh_pubs if n not in keys]:  # objects gone
            self.destroy_publisher(self._mesh_pubs.pop(name))
        for obj in shown:
            pub = self._mesh_pubs.get(obj.name)
            if pub is None:
                topic = self.mesh_topic(obj.name)
                pub = self._mesh_pubs[obj.name] = self.create_publisher(
                    Mesh, topic, self._latched)
                if topic != f"~/objects/{obj.name}/mesh":
                    self.get_logger().info(f"object {obj.name!r}: mesh on {topic}")
            pub.publish(self._meshes[keys[obj.name]][2])

    def state(self) -> str:
        """What /diagnostics says the calibration is doing."""
        s = self.calibrator.estimator.state
        return f"{s}, frozen" if self.calibrator.frozen else s

    def _publish_diagnostics(self) -> None:
        now = time.monotonic()
        silent_after = self.get_parameter("silent_after_s").value
        items = [(k, c) for k, c in self._counters.items()]
        silent = [k for k, c in items
                  if not c.optional and (c.count == 0 or now - c.last_rx > silent_after)]
        required = [k for k, c in items if not c.optional]
        status = DiagnosticStatus()
        status.name = f"{self.get_name()}: inputs"
        status.hardware_id = "aloha2"
        if not silent:
            status.level, status.message = DiagnosticStatus.OK, "receiving all inputs"
        elif len(silent) == len(required):
            status.level, status.message = DiagnosticStatus.WARN, "waiting for data"
        else:
            status.level = DiagnosticStatus.WARN
            status.message = f"silent: {', '.join(sorted(silent))}"
        kv = [KeyValue(key="state", value=self.state())]
        kv += [KeyValue(key=f"received/{k}", value=str(c.count)) for k, c in items]
        kv += [KeyValue(key=f"last_stamp_ns/{k}", value=str(c.last_stamp_ns))
               for k, c in items if c.count]
        # both estimates see the same missing messages: report the larger, not the sum
        kv += [KeyValue(key=f"lost/{k}", value=str(max(c.lost, c.gaps)))
               for k, c in items if c.lost or c.gaps]
        kv += [KeyValue(key=f"rejected/{k}", value=str(n))
               for k, n in sorted(self._rejected.items())]
        kv.append(KeyValue(key="uptime_s", value=f"{now - self._started:.1f}"))
        status.values = kv

        calib = DiagnosticStatus()
        calib.name = f"{self.get_name()}: calibration"
        calib.hardware_id = "aloha2"
        est = self.calibrator.estimator
        snap = self.calibrator.snapshot()
        drift = getattr(est, "drift", "")
        if drift != self._last_drift:
            self._last_drift = drift
            if drift:
                self.get_logger().warning(f"drift: {drift}")
        if self.calibrator.worker_error:
            calib.level = DiagnosticStatus.WARN
            calib.message = self.calibrator.worker_error
        elif drift:
            calib.level = DiagnosticStatus.WARN
            calib.message = f"{self.state()}; drift: {drift}"
        elif not est.is_calibration and self.source == "nominal":
            calib.level, calib.message = DiagnosticStatus.WARN, self.state()
        else:
            calib.level, calib.message = DiagnosticStatus.OK, self.state()
        ckv = [
            KeyValue(key="state", value=self.state()),
            KeyValue(key="start", value=self.source),
            KeyValue(key="frozen", value=str(self.calibrator.frozen).lower()),
            KeyValue(key="drift", value=drift or "none"),
            KeyValue(key="estimate_version", value=str(self.calibrator.version)),
            KeyValue(key="frames_assembled", value=str(snap.get("sync/assembled", 0))),
            KeyValue(key="keyframes", value=str(snap.get("keyframes/kept", 0))),
        ]
        ckv += [KeyValue(key=k, value=str(v)) for k, v in sorted(snap.items())]
        ckv += [KeyValue(key=f"metrics/{k}", value=f"{v:g}")
                for k, v in sorted(est.metrics().items())]
        calib.values = ckv
        msg = DiagnosticArray()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.status = [status, calib]
        self._diag_pub.publish(msg)

    # ------------------------------------------------------------------ services
    def save(self) -> str:
        """Write the current estimate to `<output_dir>/calibration.yaml`; returns a summary."""
        cal = self.calibrator.current
        version = self.calibrator.version
        kind = "calibration" if (self.calibrator.estimator.is_calibration
                                 or self.source == "resumed") else "nominal calibration"
        from dataclasses import replace

        metrics = {**cal.metrics, "saved_from": cal.metrics.get("source", "nominal"),
                   "frames": int(self.calibrator.snapshot().get("sync/assembled", 0))}
        path = self.store.save(replace(cal, metrics=metrics))
        self._saved_version = version
        return f"saved {kind} to {path}"

    def _srv_save(self, _req, resp):
        try:
            resp.message = self.save()
            resp.success = True
        except (OSError, RealsimError) as exc:
            resp.success, resp.message = False, f"save failed: {exc}"
        self.get_logger().info(resp.message)
        return resp

    def _srv_reset(self, _req, resp):
        self.calibrator.reset()
        self.source = "nominal"
        self._publish_outputs()
        resp.success, resp.message = True, "reset to the nominal calibration"
        self.get_logger().info(resp.message)
        return resp

    def _srv_freeze(self, req, resp):
        self.calibrator.set_frozen(req.data)
        resp.success = True
        resp.message = "frozen: estimate no longer updated" if req.data else "updating"
        self.get_logger().info(resp.message)
        return resp

    def shutdown(self) -> None:
        """Stop the worker and save when the estimate changed since start / last save."""
        self.calibrator.stop()
        if self.calibrator.version != self._saved_version:
            try:
                line = self.save()
                print(f"[realsim] {line} (shutdown)", file=sys.stderr)
            except (OSError, RealsimError) as exc:
                print(f"[realsim] save on shutdown failed: {exc}", file=sys.stderr)


def main(args=None) -> None:
    """Entry point of `calibration_node` / `ros2 run realsim_ros calibration_node`.

    Ctrl-C / SIGINT stops the node through rclpy's own handler (it shuts the context down,
    and `spin` returns). Python's default handler would also raise KeyboardInterrupt at
    whatever bytecode runs next; when that is a garbage-collected `Future.__del__`, the
    exception is printed as a traceback and swallowed. So Python's handler is made a no-op,
    installed before `rclpy.init` so that rclpy's handler chains to it. A callback that was
    running when the signal shut the context down can still fail on it (publishing into a
    shut-down context raises RCLError out of `spin`): after a shutdown that is the stop,
    not an error.
    """
    main_thread = threading.current_thread() is threading.main_thread()
    old_sigint = signal.signal(signal.SIGINT, lambda *_: None) if main_thread else None
    node = None
    rc = 0
    try:
        rclpy.init(args=args)
        node = CalibrationNode()
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except (RealsimError, ParameterException, InvalidParameterValueException) as exc:
        print(f"realsim node: error: {' '.join(str(exc).split())}", file=sys.stderr)
        rc = 1
    except Exception:
        if node is None or rclpy.ok():      # not a callback cut short by the shutdown
            raise
    finally:
        if node is not None:
            node.shutdown()
            node.destroy_node()
        if rclpy.ok():
            rclpy.shutdown()
        if old_sigint is not None:
            signal.signal(signal.SIGINT, old_sigint)
    if rc:
        sys.exit(rc)


if __name__ == "__main__":
    main()
