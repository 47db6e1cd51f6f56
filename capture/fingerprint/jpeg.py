"""JPEG files: dimensions, mode, quantization tables (and the libjpeg quality they come
from), chroma subsampling, progressive and optimized coding, restart interval, and the bytes
of the segments that are not image data."""

from __future__ import annotations

import io
import struct
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from .common import Unreadable

#: Payload of libjpeg's standard Huffman tables (DHT segments without their 2-byte length):
#: DC+AC for luminance (29 + 179 bytes), and the same again for chrominance.
_STD_DHT = {1: 29 + 179, 3: 2 * (29 + 179)}
_SAMPLING = {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}
_QUALITY_TABLES: dict[int, np.ndarray] = {}


def _reference_luma(quality: int) -> np.ndarray:
    """Pillow's (libjpeg's) luminance table at *quality*, as Pillow reports tables."""
    if quality not in _QUALITY_TABLES:
        from PIL import Image

        buf = io.BytesIO()
        Image.new("L", (8, 8)).save(buf, "JPEG", quality=quality)
        buf.seek(0)
        with Image.open(buf) as im:
            _QUALITY_TABLES[quality] = np.asarray(im.quantization[0], dtype=np.int64)  # type: ignore[attr-defined]
    return _QUALITY_TABLES[quality]


def jpeg_quality(luma: Sequence[int]) -> int:
    """The libjpeg quality (1..100) whose scaled standard luminance table is nearest *luma*."""
    table = np.asarray(luma, dtype=np.int64)
    best = min(range(1, 101), key=lambda q: (int(np.abs(_reference_luma(q) - table).sum()), -q))
    return best


def _jpeg_segments(path: str) -> tuple[dict[str, int], int]:
    """Bytes per marker kind before the first scan (APPn, COM, DHT, DQT, ...) and the restart interval."""
    seen: Counter[str] = Counter()
    restart = 0
    with open(path, "rb") as fh:
        if fh.read(2) != b"\xff\xd8":
            raise Unreadable("not a JPEG (no SOI marker)")
        while True:
            b = fh.read(1)
            while b == b"\xff":
                b = fh.read(1)
            if not b:
                break
            marker = b[0]
            if marker in (0x01, *range(0xD0, 0xD8)):  # standalone markers
                continue
            raw = fh.read(2)
            if len(raw) < 2:
                break
            (length,) = struct.unpack(">H", raw)
            name = (
                "APP0"
                if marker == 0xE0
                else "APPn"
                if 0xE1 <= marker <= 0xEF
                else "COM"
                if marker == 0xFE
                else "DHT"
                if marker == 0xC4
                else "DRI"
                if marker == 0xDD
                else "SOS"
                if marker == 0xDA
                else f"M{marker:02X}"
            )
            if name == "SOS":
                break
            if name == "DRI":
                restart = struct.unpack(">H", fh.read(2))[0]
                fh.seek(length - 4, 1)
            else:
                fh.seek(length - 2, 1)
            seen[name] += length - 2 if name == "DHT" else length + 2
    return dict(seen), restart


def inspect_jpeg(path: str) -> dict[str, Any]:
    """A JPEG's image coding, read with Pillow and from the markers before the first scan."""
    from PIL import Image, JpegImagePlugin

    with Image.open(path) as im:
        width, height = im.size
        mode = im.mode
        quant = im.quantization  # type: ignore[attr-defined]
        tables = [list(map(int, quant[k])) for k in sorted(quant)]
        sampling = JpegImagePlugin.get_sampling(im) if mode not in ("L", "1") else -1
        progressive = bool(im.info.get("progressive") or im.info.get("progression"))
    segments, restart = _jpeg_segments(path)
    bands = 1 if mode in ("L", "1") else 3
    optimize = (not progressive) and segments.get("DHT", 0) != _STD_DHT.get(bands, -1)
    return {
        "width": width,
        "height": height,
        "mode": mode,
        "quality": jpeg_quality(tables[0]) if tables else None,
        "qtables": tables,
        "subsampling": _SAMPLING.get(sampling),
        "progressive": progressive,
        "optimize": optimize,
        "restart_interval": restart,
        "extra_bytes": segments.get("APPn", 0) + segments.get("COM", 0),
    }
