"""Image payload decoding: every encoding, row padding, endianness, compressed formats."""

from __future__ import annotations

import array

import cv2
import numpy as np
import pytest

from realsim_core.errors import RealsimError
from realsim_core.images import decode_compressed, decode_image, decode_mask, decode_mask_u8

H, W = 5, 7


def _rgb() -> np.ndarray:
    """[H, W, 3] uint8 with distinct values per pixel and channel."""
    return (np.arange(H * W * 3, dtype=np.uint32).reshape(H, W, 3) * 7 % 251).astype(np.uint8)


def _padded(pixels: np.ndarray, pad: int) -> tuple[bytes, int]:
    """Row-major bytes of [H, row_bytes] with `pad` junk bytes after each row."""
    rows = pixels.reshape(pixels.shape[0], -1).view(np.uint8)
    junk = np.full((rows.shape[0], pad), 0xAB, np.uint8)
    padded = np.concatenate([rows, junk], axis=1)
    return padded.tobytes(), padded.shape[1]


@pytest.mark.parametrize("pad", [0, 3])
def test_colour_encodings(pad):
    rgb = _rgb()
    alpha = np.full((H, W, 1), 200, np.uint8)
    cases = {
        "rgb8": rgb,
        "bgr8": rgb[:, :, ::-1],
        "rgba8": np.concatenate([rgb, alpha], axis=2),
        "bgra8": np.concatenate([rgb[:, :, ::-1], alpha], axis=2),
        "8UC3": rgb[:, :, ::-1],
    }
    for enc, payload in cases.items():
        data, step = _padded(np.ascontiguousarray(payload), pad)
        out = decode_image(enc, H, W, step, data)
        assert out.dtype == np.uint8 and out.shape == (H, W, 3), enc
        assert out.flags.c_contiguous and out.flags.writeable, enc
        np.testing.assert_array_equal(out, rgb, err_msg=enc)


@pytest.mark.parametrize("pad", [0, 1])
def test_mono8(pad):
    mono = _rgb()[:, :, 0]
    data, step = _padded(mono, pad)
    for enc in ("mono8", "8UC1"):
        out = decode_image(enc, H, W, step, data)
        assert out.shape == (H, W, 3)
        for c in range(3):
            np.testing.assert_array_equal(out[:, :, c], mono)


@pytest.mark.parametrize("bigendian", [0, 1])
@pytest.mark.parametrize("pad", [0, 2])
def test_mono16_scaled_full_range(bigendian, pad):
    values = np.array([[0, 257, 65535, 32768, 128, 1000, 65278]] * H, dtype=np.uint16)
    # 257 * k maps exactly to k; 32768 -> 127.5 rounds to 128; 128 -> 0.498 -> 0.
    expect = np.array([[0, 1, 255, 128, 0, 4, 254]] * H, dtype=np.uint8)
    stored = values.astype(">u2" if bigendian else "<u2")
    data, step = _padded(stored, pad)
    for enc in ("mono16", "16UC1"):
        out = decode_image(enc, H, W, step, data, is_bigendian=bigendian)
        np.testing.assert_array_equal(out[:, :, 0], expect)
        np.testing.assert_array_equal(out[:, :, 2], expect)
    # Reading big-endian data as little-endian swaps the bytes (the flag matters).
    if bigendian:
        wrong = decode_image("mono16", H, W, step, data, is_bigendian=0)
        assert wrong[0, 5, 0] == 231  # 1000 = 0x03E8 read as 0xE803 = 59395


def test_data_container_types():
    rgb = _rgb()
    flat = rgb.reshape(-1)
    for data in (flat.tobytes(), bytearray(flat.tobytes()), memoryview(flat.tobytes()),
                 array.array("B", flat.tobytes()), flat, list(flat)):
        np.testing.assert_array_equal(decode_image("rgb8", H, W, W * 3, data), rgb)


def test_last_row_without_padding_is_accepted():
    rgb = _rgb()
    data, step = _padded(rgb, 4)
    out = decode_image("rgb8", H, W, step, data[:-4])
    np.testing.assert_array_equal(out, rgb)


def test_errors_name_encoding_and_sizes():
    data = _rgb().tobytes()
    with pytest.raises(RealsimError, match="unsupported image encoding 'yuv422'"):
        decode_image("yuv422", H, W, W * 2, data)
    with pytest.raises(RealsimError, match=r"'rgb8' 7x5 step 21: 104 data bytes, expected 105"):
        decode_image("rgb8", H, W, W * 3, data[:-1])
    with pytest.raises(RealsimError, match="step 20 is smaller than one row"):
        decode_image("rgb8", H, W, 20, data)
    with pytest.raises(RealsimError, match="invalid size 0x5"):
        decode_image("rgb8", H, 0, 0, b"")


def test_masks():
    mono = np.zeros((H, W), np.uint8)
    mono[1:3, 2:5] = 1
    mono[4, 6] = 7
    data, step = _padded(mono, 2)
    mask = decode_mask("mono8", H, W, step, data)
    assert mask.dtype == bool and mask.shape == (H, W)
    assert int(mask.sum()) == 7 and mask[4, 6] and not mask[0, 0]
    labels = decode_mask_u8("mono8", H, W, step, data)
    assert labels[4, 6] == 7 and labels[1, 2] == 1  # label values kept
    rgba = np.zeros((H, W, 4), np.uint8)
    rgba[..., 3] = 255  # alpha alone does not make a pixel "object"
    rgba[0, 0, 1] = 9
    m = decode_mask("rgba8", H, W, W * 4, rgba.tobytes())
    assert int(m.sum()) == 1 and m[0, 0]
    np.testing.assert_array_equal(decode_mask_u8("rgba8", H, W, W * 4, rgba.tobytes()),
                                  m.astype(np.uint8) * 255)


def _encode(ext: str, img: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(ext, img)
    assert ok
    return buf.tobytes()


def test_compressed_png_channel_order():
    rgb = _rgb()
    bgr_png = _encode(".png", rgb[:, :, ::-1])
    for fmt in ("png", "rgb8; png compressed bgr8", "bgr8; png compressed bgr8", ""):
        np.testing.assert_array_equal(decode_compressed(fmt, bgr_png), rgb, err_msg=fmt)
    # A file whose channels were stored as RGB ("compressed rgb8") is not swapped.
    rgb_png = _encode(".png", rgb)
    np.testing.assert_array_equal(decode_compressed("rgb8; png compressed rgb8", rgb_png), rgb)
    mono_png = _encode(".png", rgb[:, :, 0])
    out = decode_compressed("mono8; png compressed mono8", mono_png)
    np.testing.assert_array_equal(out[:, :, 1], rgb[:, :, 0])
    png16 = _encode(".png", np.full((H, W), 257 * 10, np.uint16))
    assert decode_compressed("png", png16)[0, 0, 0] == 10


def test_compressed_jpeg():
    img = np.zeros((16, 16, 3), np.uint8)
    img[..., 0] = 200  # pure red in RGB
    jpg = _encode(".jpg", img[:, :, ::-1])
    out = decode_compressed("rgb8; jpeg compressed bgr8", np.frombuffer(jpg, np.uint8))
    assert out.shape == (16, 16, 3)
    assert abs(int(out[8, 8, 0]) - 200) <= 3 and out[8, 8, 2] <= 3


def test_compressed_errors():
    with pytest.raises(RealsimError, match="could not decode 9 bytes as a jpeg"):
        decode_compressed("jpeg", b"not a jpg")
    with pytest.raises(RealsimError, match="no data"):
        decode_compressed("png", b"")
    with pytest.raises(RealsimError, match="unsupported compressed image format 'tiff'"):
        decode_compressed("tiff", b"123")
    with pytest.raises(RealsimError, match="depth"):
        decode_compressed("16UC1; compressedDepth png", b"123")
