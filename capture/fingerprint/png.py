"""PNG files: dimensions, mode, bit depth, interlacing, and the IDAT chunks' sizes and
compression, by walking the file's chunks."""

from __future__ import annotations

import struct
from typing import Any

from .common import Unreadable

#: A PNG file's first eight bytes.
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def inspect_png(path: str) -> dict[str, Any]:
    """A PNG's header fields and IDAT chunks, by walking its chunks (mode from Pillow)."""
    from PIL import Image

    with Image.open(path) as im:
        mode = im.mode
    idat: list[int] = []
    extra = 0
    info: dict[str, Any] = {}
    with open(path, "rb") as fh:
        if fh.read(8) != PNG_MAGIC:
            raise Unreadable("not a PNG")
        for _ in range(100_000):
            head = fh.read(8)
            if len(head) < 8:
                break
            length, kind = struct.unpack(">I4s", head)
            if kind == b"IHDR":
                w, h, depth, color, _c, _f, interlace = struct.unpack(">IIBBBBB", fh.read(13))
                info = {
                    "width": w,
                    "height": h,
                    "bits": depth,
                    "color": color,
                    "interlaced": bool(interlace),
                }
                fh.seek(4, 1)
                continue
            if kind == b"IDAT":
                idat.append(length)
            elif kind == b"IEND":
                break
            elif kind not in (b"PLTE", b"tRNS"):
                extra += length + 12
            fh.seek(length + 4, 1)
    if not info:
        raise Unreadable("PNG without IHDR")
    channels = _PNG_CHANNELS.get(info["color"], 1)
    raw = info["height"] * (1 + (info["width"] * channels * info["bits"] + 7) // 8)
    return {
        "width": info["width"],
        "height": info["height"],
        "mode": mode,
        "bits": info["bits"],
        "interlaced": info["interlaced"],
        "idat_chunks": len(idat),
        "chunk_bytes": max(idat) if idat else None,
        "compression_ratio": round(sum(idat) / raw, 6) if raw else None,
        "extra_bytes": extra,
    }
