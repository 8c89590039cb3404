"""Decode ROS image payloads to numpy arrays (msg-type agnostic: plain fields in, arrays out).

Used by the bag reader (fields of messages deserialised by `rosbags`) and by the ROS node
(fields of rclpy messages), so nothing here knows about message classes.

Conventions:
- colour output is uint8 [H, W, 3] in RGB order, C-contiguous and writable (always a copy);
- 16-bit inputs (`mono16`, `16UC1`) are scaled to 8 bit with a fixed full-range map
  (v * 255 / 65535, rounded), never per-image min/max, so brightness is comparable across
  frames (photometric losses depend on that);
- masks are bool [H, W]; a pixel is "object" where the source value is non-zero.
"""

from __future__ import annotations

import cv2
import numpy as np

from realsim_core.errors import RealsimError

# encoding -> (channels, bytes per channel, channel order of the payload)
_ENCODINGS: dict[str, tuple[int, int, str]] = {
    "rgb8": (3, 1, "rgb"),
    "bgr8": (3, 1, "bgr"),
    "rgba8": (4, 1, "rgba"),
    "bgra8": (4, 1, "bgra"),
    "mono8": (1, 1, "mono"),
    "8uc1": (1, 1, "mono"),
    "8uc3": (3, 1, "bgr"),  # OpenCV convention for untyped 3-channel images
    "8uc4": (4, 1, "bgra"),
    "mono16": (1, 2, "mono"),
    "16uc1": (1, 2, "mono"),
}

SUPPORTED_ENCODINGS: tuple[str, ...] = (
    "rgb8", "bgr8", "rgba8", "bgra8", "mono8", "mono16", "8UC1", "8UC3", "8UC4", "16UC1",
)


def _as_bytes_array(data: object) -> np.ndarray:
    """Flat uint8 view of `data` (bytes, bytearray, memoryview, array.array, ndarray, list)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(data, dtype=np.uint8)  # type: ignore[arg-type]
    except TypeError:
        return np.asarray(data, dtype=np.uint8).reshape(-1)


def _rows(
    buf: np.ndarray, encoding: str, height: int, width: int, step: int, row_bytes: int
) -> np.ndarray:
    """[H, row_bytes] uint8 view of the pixel bytes, skipping `step` row padding."""
    if height <= 0 or width <= 0:
        raise RealsimError(f"image {encoding!r} has an invalid size {width}x{height}")
    if step < row_bytes:
        raise RealsimError(
            f"image {encoding!r} {width}x{height}: step {step} is smaller than one row "
            f"({row_bytes} bytes)"
        )
    # The last row may omit its padding; everything before it must be complete.
    needed = (height - 1) * step + row_bytes
    if buf.size < needed:
        raise RealsimError(
            f"image {encoding!r} {width}x{height} step {step}: {buf.size} data bytes, "
            f"expected {height * step}"
        )
    if buf.size < height * step:
        buf = np.concatenate([buf, np.zeros(height * step - buf.size, np.uint8)])
    return buf[: height * step].reshape(height, step)[:, :row_bytes]


def _scale16(values: np.ndarray) -> np.ndarray:
    """uint16 -> uint8 with the fixed full-range map round(v * 255 / 65535)."""
    return ((values.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)


def _decode_channels(
    encoding: str, height: int, width: int, step: int, data: object, is_bigendian: int
) -> tuple[np.ndarray, str]:
    """Pixels as [H, W, C] (uint8 or uint16) and their channel order."""
    key = encoding.strip().lower()
    if key not in _ENCODINGS:
        raise RealsimError(
            f"unsupported image encoding {encoding!r} (supported: "
            f"{', '.join(SUPPORTED_ENCODINGS)})"
        )
    channels, depth, order = _ENCODINGS[key]
    height, width, step = int(height), int(width), int(step)
    rows = _rows(_as_bytes_array(data), encoding, height, width, step, width * channels * depth)
    if depth == 2:
        dtype = np.dtype(">u2" if is_bigendian else "<u2")
        pixels = np.ascontiguousarray(rows).view(dtype).astype(np.uint16)
    else:
        pixels = rows
    return pixels.reshape(height, width, channels), order


def decode_image(
    encoding: str, height: int, width: int, step: int, data: object, is_bigendian: int = 0
) -> np.ndarray:
    """Decode a `sensor_msgs/Image` payload to RGB.

    Args:
        encoding: ROS encoding string: rgb8, bgr8, rgba8, bgra8, mono8/8UC1, mono16/16UC1
            (scaled to 8 bit), 8UC3 (as bgr8), 8UC4 (as bgra8).
        height: image rows (pixels).
        width: image columns (pixels).
        step: bytes per row including padding (>= width * bytes per pixel).
        data: the pixel bytes (bytes, array.array, memoryview or uint8 ndarray).
        is_bigendian: 1 when 16-bit values are big-endian.

    Returns:
        uint8 [height, width, 3], RGB.

    Raises:
        RealsimError: unknown encoding, or sizes that do not match the data.

    """
    pixels, order = _decode_channels(encoding, height, width, step, data, is_bigendian)
    if pixels.dtype == np.uint16:
        pixels = _scale16(pixels)
    if order == "mono":
        return np.repeat(pixels, 3, axis=2)
    if order in ("bgr", "bgra"):
        return np.ascontiguousarray(pixels[:, :, 2::-1])
    return pixels[:, :, :3].copy()


def decode_mask(
    encoding: str, height: int, width: int, step: int, data: object, is_bigendian: int = 0
) -> np.ndarray:
    """Decode a mask image (`sensor_msgs/Image`, usually mono8) to bool [H, W].

    A pixel is True where any channel (alpha excluded) is non-zero. Same arguments and
    errors as `decode_image`.
    """
    pixels, order = _decode_channels(encoding, height, width, step, data, is_bigendian)
    if order in ("rgba", "bgra"):
        pixels = pixels[:, :, :3]
    return np.ascontiguousarray(pixels.any(axis=2))


def decode_mask_u8(
    encoding: str, height: int, width: int, step: int, data: object, is_bigendian: int = 0
) -> np.ndarray:
    """Decode a mask image to uint8 [H, W], keeping mono8 values as they are (labels).

    mono8/8UC1 payloads are returned unchanged (a segmenter may publish instance labels);
    every other encoding is reduced with `decode_mask` and mapped to 0 / 255.
    """
    if encoding.strip().lower() in ("mono8", "8uc1"):
        pixels, _ = _decode_channels(encoding, height, width, step, data, is_bigendian)
        return np.ascontiguousarray(pixels[:, :, 0]).copy()
    mask = decode_mask(encoding, height, width, step, data, is_bigendian)
    return mask.astype(np.uint8) * np.uint8(255)


def decode_compressed(fmt: str, data: object) -> np.ndarray:
    """Decode a `sensor_msgs/CompressedImage` payload (JPEG or PNG) to RGB.

    Args:
        fmt: the message's `format` field: "jpeg", "png", or image_transport's
            "<orig>; <jpeg|png> compressed <enc>" (e.g. "rgb8; jpeg compressed bgr8").
            The `<enc>` after "compressed" says the channel order inside the file; files
            are assumed BGR (the usual case) unless it names an rgb encoding.
        data: the compressed bytes.

    Returns:
        uint8 [H, W, 3], RGB (16-bit PNGs are scaled like mono16).

    Raises:
        RealsimError: unsupported format (e.g. compressedDepth) or undecodable data.

    """
    text = (fmt or "").strip().lower()
    if "compresseddepth" in text:
        raise RealsimError(f"compressed image format {fmt!r} (depth) is not supported")
    codec = text.split(";")[-1].strip().split(" ")[0] if text else ""
    if codec and codec not in ("jpeg", "jpg", "png"):
        raise RealsimError(
            f"unsupported compressed image format {fmt!r} (expected jpeg or png)"
        )
    buf = _as_bytes_array(data)
    if buf.size == 0:
        raise RealsimError(f"compressed image ({fmt!r}) has no data")
    img = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
    if img is None:
        raise RealsimError(f"could not decode {buf.size} bytes as a {fmt or 'compressed'} image")
    if img.dtype == np.uint16:
        img = _scale16(img)
    elif img.dtype != np.uint8:
        raise RealsimError(f"compressed image ({fmt!r}) has unsupported pixel type {img.dtype}")
    if img.ndim == 2:
        return np.repeat(img[:, :, None], 3, axis=2)
    inner = text.split("compressed", 1)[1].strip() if "compressed" in text else ""
    if inner.startswith("rgb"):
        return np.ascontiguousarray(img[:, :, :3])
    return np.ascontiguousarray(img[:, :, 2::-1])
