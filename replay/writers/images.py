"""JPEG and PNG files through Pillow with the real files' dimensions, mode and coding
(quantization, subsampling, progressive/optimized, restart interval, PNG interlacing and IDAT
chunk size), their content calibrated to the real files' sizes."""

from __future__ import annotations

import io
import math
import struct
import zlib
from typing import Any

import numpy as np

from dlreplay.model import ImageFile

_MODE_CHANNELS = {
    "1": 1,
    "L": 1,
    "P": 1,
    "I;16": 1,
    "I": 1,
    "F": 1,
    "LA": 2,
    "RGB": 3,
    "YCbCr": 3,
    "RGBA": 4,
    "CMYK": 4,
}


def image_pixels(
    width: int,
    height: int,
    mode: str,
    share: float,
    rng: np.random.Generator,
    bits: int | None = None,
) -> Any:
    """A Pillow image of noise whose amplitude is *share* (0: flat grey, 1: full-range noise).

    The encoded size grows continuously with the amplitude, for any image size (tiles of
    noise among flat ones give too few steps on small images). Palette images get a
    palette of 2**bits colours (Pillow writes the PNG bit depth from it).
    """
    from PIL import Image

    channels = _MODE_CHANNELS.get(mode, 3)
    share = min(max(share, 0.0), 1.0)
    if mode in ("I;16", "I"):
        noise = rng.integers(0, 65536, size=(height, width)).astype(np.float64) - 32768
        arr16 = np.clip(np.rint(32768 + share * noise), 0, 65535).astype(np.uint16)
        return Image.fromarray(arr16)  # I;16 (Pillow 13 refuses the mode argument for it)
    noise = rng.integers(0, 256, size=(height, width, channels)).astype(np.float64) - 128
    arr = np.clip(np.rint(128 + share * noise), 0, 255).astype(np.uint8)
    if mode in ("RGBA", "LA"):
        arr[..., -1] = 255  # opaque alpha, as photos with an alpha channel mostly are
    if channels == 1:
        arr = arr[..., 0]
    if mode == "1":
        return Image.fromarray(arr > 127)
    if mode == "P":
        colours = 1 << (bits or 8)
        img = Image.frombytes(
            "P", (width, height), (arr.astype(np.int64) * colours // 256).astype(np.uint8).tobytes()
        )
        img.putpalette([v for c in range(colours) for v in (c, 255 - c, (c * 7) % 256)])
        return img
    if mode == "CMYK":
        return Image.fromarray(arr, "CMYK")
    return Image.fromarray(arr, {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}[channels])


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """The (type, payload) of each chunk of the PNG *data*, in order (the signature skipped)."""
    out, pos = [], 8
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        out.append((kind, data[pos + 8 : pos + 8 + length]))
        pos += 12 + length
    return out


def _png_frame(kind: bytes, payload: bytes) -> bytes:
    """One PNG chunk: length, type, payload, CRC."""
    return (
        struct.pack(">I", len(payload))
        + kind
        + payload
        + struct.pack(">I", zlib.crc32(kind + payload))
    )


def png_rechunk(data: bytes, chunk_bytes: int | None, extra_bytes: int) -> bytes:
    """The PNG with its IDAT data re-split into *chunk_bytes* chunks and *extra_bytes* of text chunk."""
    chunks = _png_chunks(data)
    kinds = [k for k, _ in chunks]
    first = kinds.index(b"IDAT") if b"IDAT" in kinds else len(chunks)
    idat = b"".join(p for k, p in chunks if k == b"IDAT")
    head = chunks[:first]
    tail = [c for c in chunks[first:] if c[0] != b"IDAT"]
    extras = []
    if extra_bytes >= 12 + len(b"Comment\0") + 1:
        extras.append((b"tEXt", b"Comment\0" + b"x" * (extra_bytes - 12 - len(b"Comment\0"))))
    size = chunk_bytes or max(len(idat), 1)
    pieces = [(b"IDAT", idat[i : i + size]) for i in range(0, max(len(idat), 1), size)]
    return data[:8] + b"".join(_png_frame(k, p) for k, p in [*head, *extras, *pieces, *tail])


#: Adam7's seven passes: (first column, first row, column step, row step).
_ADAM7 = (
    (0, 0, 8, 8),
    (4, 0, 8, 8),
    (0, 4, 4, 8),
    (2, 0, 4, 4),
    (0, 2, 2, 4),
    (1, 0, 2, 2),
    (0, 1, 1, 2),
)


def _filter_rows(raw: np.ndarray, bpp: int, adaptive: bool) -> np.ndarray:
    """PNG scanlines (filter byte + filtered bytes) of the byte rows *raw* (rows x bytes) whose
    pixels are *bpp* bytes: per row the filter of least absolute sum (libpng's and Pillow's
    heuristic) when *adaptive*, else none (as Pillow writes palette and sub-byte images)."""
    h, n = raw.shape
    out = np.empty((h, n + 1), dtype=np.uint8)
    if not adaptive:
        out[:, 0] = 0
        out[:, 1:] = raw
        return out
    r = raw.astype(np.int16)
    left = np.zeros_like(r)
    left[:, bpp:] = r[:, :-bpp]
    up = np.zeros_like(r)
    up[1:] = r[:-1]
    corner = np.zeros_like(r)
    corner[1:, bpp:] = r[:-1, :-bpp]
    p = left + up - corner
    pa, pb, pc = np.abs(p - left), np.abs(p - up), np.abs(p - corner)
    paeth = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, corner))
    cands = (np.stack([r, r - left, r - up, r - (left + up) // 2, r - paeth]) & 0xFF).astype(
        np.uint8
    )
    best = np.abs(cands.view(np.int8).astype(np.int16)).sum(axis=2).argmin(axis=0)
    out[:, 0] = best
    out[:, 1:] = cands[best, np.arange(h)]
    return out


def png_interlaced(data: bytes, img: Any) -> bytes | None:
    """Pillow's PNG *data* of *img* again with Adam7 interlacing (Pillow cannot write it):
    the same chunks, IHDR's interlace method 1, and IDAT the seven passes' scanlines
    deflated at Pillow's default level. None for a pixel layout this does not handle."""
    if data[12:16] != b"IHDR":
        return None
    width, height, depth, color = struct.unpack(">IIBB", data[16:26])
    px = np.asarray(img)
    if px.dtype == bool:
        px = px.astype(np.uint8)
    if px.ndim == 2:
        px = px[..., None]
    if px.shape[:2] != (height, width) or depth not in (1, 2, 4, 8, 16):
        return None
    if depth == 16:
        px = px.astype(">u2").view(np.uint8).reshape(height, width, -1)
    elif px.dtype != np.uint8:
        return None
    bpp = (
        px.shape[2] if depth >= 8 else 1
    )  # bytes per pixel (16-bit samples are two bytes each by now)
    stream = []
    for x0, y0, dx, dy in _ADAM7:
        sub = px[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        if depth < 8:  # pack the samples of a row into bytes, first pixel in the high bits
            k = 8 // depth
            cols = sub.shape[1]
            padded = np.zeros((sub.shape[0], -(-cols // k) * k), dtype=np.uint16)
            padded[:, :cols] = sub[..., 0]
            shifts = (8 - depth - depth * np.arange(k)).astype(np.uint16)
            rows = (padded.reshape(sub.shape[0], -1, k) << shifts).sum(axis=2).astype(np.uint8)
        else:
            rows = np.ascontiguousarray(sub).reshape(sub.shape[0], -1)
        stream.append(_filter_rows(rows, bpp, adaptive=color != 3 and depth >= 8).tobytes())
    out: list[tuple[bytes, bytes]] = []
    for kind, payload in _png_chunks(data):
        if kind == b"IHDR":
            out.append((kind, payload[:12] + b"\x01"))  # interlace method 1: Adam7
        elif kind != b"IDAT":
            out.append((kind, payload))
        elif not any(k == b"IDAT" for k, _ in out):  # the passes, where the first IDAT was
            out.append((kind, zlib.compress(b"".join(stream), 6)))
    return data[:8] + b"".join(_png_frame(k, p) for k, p in out)


def _encode_image(img: Any, fmt: str, t: ImageFile) -> bytes:
    bio = io.BytesIO()
    if fmt == "jpeg":
        kw: dict[str, Any] = {"progressive": t.progressive, "optimize": t.optimize}
        if t.qtables:
            kw["qtables"] = [list(q) for q in t.qtables]
        elif t.quality:
            kw["quality"] = t.quality
        else:
            kw["quality"] = 90
        if t.subsampling and img.mode not in ("L", "1"):
            kw["subsampling"] = t.subsampling
        if t.restart_interval:
            kw["restart_marker_blocks"] = t.restart_interval
        if t.extra_bytes > 4:
            kw["comment"] = b"x" * (t.extra_bytes - 4)
        img.save(bio, format="JPEG", **kw)
        return bio.getvalue()
    img.save(bio, format="PNG")
    data = bio.getvalue()
    if t.interlaced:
        data = png_interlaced(data, img) or data
    return png_rechunk(data, t.chunk_bytes, t.extra_bytes)


#: Noise amplitudes at which each kind of image is encoded once to map amplitude -> bytes.
_CURVE_SHARES = (0.0, 0.05, 0.15, 0.3, 0.5, 0.75, 1.0)


_SIZE_CURVES: dict[str, tuple[tuple[float, int], ...]] = {}


def _size_curve(t: ImageFile, fmt: str) -> tuple[tuple[float, int], ...]:
    """(noise amplitude, encoded bytes) of image kind *t* with a fixed seed: the same in every
    generator process, so where a file's search starts never depends on the files before it."""
    key = f"{fmt}{t!r}"
    if key not in _SIZE_CURVES:
        rng = np.random.default_rng(0x1A6E)
        _SIZE_CURVES[key] = tuple(
            (
                share,
                len(
                    _encode_image(
                        image_pixels(t.width, t.height, t.mode, share, rng, t.bits), fmt, t
                    )
                ),
            )
            for share in _CURVE_SHARES
        )
    return _SIZE_CURVES[key]


#: Relative distance from its planned size at which an image is kept (the planned sizes come from
#: the real files: a trace's read sizes are these sizes to the byte).
IMAGE_SIZE_TOLERANCE = 0.0002

#: Pixels up to which an image is small: cheap to encode again.
SMALL_IMAGE_PIXELS = 256 * 256


def image_for(t: ImageFile, fmt: str, target: int, rng: np.random.Generator) -> bytes:
    """An image of kind *t* whose encoded size is as close to *target* bytes as content allows.

    The amplitude comes from the kind's size curve, then secant and halving steps in turn on
    the bracket of this file's own encodes (:func:`_next_share`); where the size no longer
    follows the amplitude closely enough (near full-range noise, sizes vary with the content
    by tens of bytes), other content at the best amplitude so far. Up to 12 encodes (20 for
    images of up to SMALL_IMAGE_PIXELS), kept
    within IMAGE_SIZE_TOLERANCE; the result depends only on the file's seed.
    """
    seed = int(rng.integers(0, 2**63))
    base = list(_size_curve(t, fmt))
    own: list[tuple[float, int]] = []
    content = [0]

    def encode(share: float) -> bytes:
        pixels = image_pixels(
            t.width, t.height, t.mode, share, np.random.default_rng([seed, content[0]]), t.bits
        )
        out = _encode_image(pixels, fmt, t)
        own.append((share, len(out)))
        return out

    best: tuple[float, bytes] | None = None
    # small images (masks, thumbnails) encode in microseconds and their size curve is the
    # steepest: more steps on the amplitude
    tries = 20 if t.width * t.height <= SMALL_IMAGE_PIXELS else 12
    for attempt in range(tries):
        if attempt >= tries - 4 and best is not None:
            content[0] += 1  # the amplitude has done what it can: other noise at the best one
            share = best[0]
        else:
            share = _next_share(base, own, target, bisect=attempt % 2 == 1)
        out = encode(share)
        if best is None or abs(len(out) - target) < abs(len(best[1]) - target):
            best = (share, out)
        if abs(len(out) - target) <= IMAGE_SIZE_TOLERANCE * target:
            break
        if attempt < tries - 4 and (
            (share == 1.0 and len(out) < 0.99 * target)
            or (share == 0.0 and len(out) > 1.01 * target)
        ):
            break  # the target is out of this kind's reach
    assert best is not None
    return best[1]


def _next_share(
    base: list[tuple[float, int]], own: list[tuple[float, int]], target: int, bisect: bool
) -> float:
    """The next noise amplitude to encode at: between the nearest points (amplitude, bytes)
    below and above *target* (this file's own encodes once they bracket it, the kind's curve
    until then), by a secant step, or by halving the bracket where *bisect*. The size curve
    is steep and concave at small amplitudes (a 32x32 mask: 82 B flat, 402 B at 1 %, 492 B
    at 2 %), where secant steps from a flat image's point alone crawl towards the target from
    above (385 B for 328 after four)."""
    below = [p for p in own if p[1] <= target]
    above = [p for p in own if p[1] >= target]
    pts = sorted(set(own)) if below and above else sorted(set(base + own))
    lo = max((p for p in pts if p[1] <= target), default=None)
    hi = min((p for p in pts if p[1] >= target and (lo is None or p[0] >= lo[0])), default=None)
    if lo is None or hi is None:  # out of the curve's reach: its nearest end
        shares = np.array([p[0] for p in pts])
        sizes = np.array([p[1] for p in pts], dtype=float)
        order = np.argsort(sizes, kind="stable")
        return float(np.clip(np.interp(target, sizes[order], shares[order]), 0.0, 1.0))
    if bisect or hi[1] == lo[1]:
        return (lo[0] + hi[0]) / 2
    return lo[0] + (hi[0] - lo[0]) * (target - lo[1]) / (hi[1] - lo[1])


def image_legacy(rng: np.random.Generator, target: int, fmt: str) -> bytes:
    """A noise image encoded by Pillow whose size approximates *target* bytes (no layout known)."""
    from PIL import Image

    pil_fmt = "JPEG" if fmt == "jpeg" else "PNG"

    def encode(side: int) -> bytes:
        pixels = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
        bio = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(
            bio, format=pil_fmt, **({"quality": 90} if pil_fmt == "JPEG" else {})
        )
        return bio.getvalue()

    probe = 64
    sample = encode(probe)
    per_pixel = max(len(sample) / (probe * probe), 0.05)
    side = max(8, int(math.sqrt(max(target, 1) / per_pixel)))
    out = encode(side)
    if abs(len(out) - target) > 0.05 * target and side > 8:
        side = max(8, int(side * math.sqrt(target / len(out))))
        out = encode(side)
    return out
