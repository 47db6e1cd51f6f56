"""Writing and reading dataset files through the formats' real libraries.

Writers (:func:`write_file`) produce one file of the plan from a seeded generator.
Readers come in two flavours:

* :class:`LibraryReader` reads a sample the way a training job does: ``numpy.load`` on
  the path (so NPZ's chunked member reads happen), ``h5py`` with its default driver,
  ``PIL.Image.open(path).convert("RGB")`` as torchvision's default loader, polars,
  ``os.pread`` at the record's offset for tfrecord / indexed_binary;
* :class:`PosixReader` issues ``os.pread`` calls of the model's transfer size over
  the sample's byte range, plus the model's metadata calls.

Both return the number of bytes actually read (for libraries, which read by themselves,
the calling thread's ``rchar`` counter from ``/proc/thread-self/io``; for ``os.pread``,
the sum of its return values) and, through ``read_decoded``, the decoded sample (the
array the library returns: pixels, the record's row), which the PyTorch replay hands
to ``collate``. Units: bytes.
"""

from __future__ import annotations

import io
import math
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlreplay.model import Layout

from .common import TMP_SUFFIX, ReplayError

# --------------------------------------------------------------------------- CRC32C

_POLY = 0x82F63B78


def _make_table() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table[i] = c
    return table


_TABLE = _make_table()
_TABLE_LIST = [int(x) for x in _TABLE]


def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, mat[i]) for i in range(32)]


def _zeros_operator(nbytes: int) -> list[int]:
    """The GF(2) matrix (32 columns) advancing a raw CRC register over *nbytes* zero bytes."""
    one_bit = [_POLY] + [1 << i for i in range(31)]  # one zero bit
    op = one_bit
    for _ in range(3):  # 8 bits
        op = _gf2_square(op)
    result = [1 << i for i in range(32)]  # identity
    n = nbytes
    while n:
        if n & 1:
            result = [_gf2_times(op, c) for c in result]
        n >>= 1
        if n:
            op = _gf2_square(op)
    return result


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli) of *data*, as TFRecord uses it (numpy, lane-parallel).

    The data is split into equal lanes whose raw CRCs are computed in parallel with a
    byte table, then combined with the zero-advance operator over GF(2).
    """
    buf = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    n = buf.size
    if n < 4096:
        c = 0xFFFFFFFF
        for b in buf.tobytes():
            c = _TABLE_LIST[(c ^ b) & 0xFF] ^ (c >> 8)
        return c ^ 0xFFFFFFFF
    m = max(256, int(math.sqrt(n)))
    lanes = -(-n // m)
    padded = np.zeros(lanes * m, dtype=np.uint8)
    padded[lanes * m - n:] = buf  # leading zeros do not change a raw CRC that starts at 0
    cols = padded.reshape(lanes, m).T.copy()
    reg = np.zeros(lanes, dtype=np.uint32)
    for j in range(m):
        reg = _TABLE[(reg ^ cols[j]) & 0xFF] ^ (reg >> np.uint32(8))
    shift = _zeros_operator(m)
    raw = 0
    for g in reg.tolist():
        raw = _gf2_times(shift, raw) ^ g
    init = _gf2_times(_zeros_operator(n), 0xFFFFFFFF)
    return (raw ^ init) ^ 0xFFFFFFFF


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """TFRecord's masked CRC-32C."""
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_frame(payload: bytes) -> bytes:
    """One TFRecord: uint64 length, masked CRC of the length, payload, masked CRC of the payload."""
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", masked_crc32c(length)) + payload + struct.pack("<I", masked_crc32c(payload))


# --------------------------------------------------------------------------- writers


def _image_bytes(rng: np.random.Generator, target: int, fmt: str) -> bytes:
    """A noise image encoded by Pillow whose size approximates *target* bytes."""
    from PIL import Image

    pil_fmt = "JPEG" if fmt == "jpeg" else "PNG"

    def encode(side: int) -> bytes:
        pixels = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
        bio = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(bio, format=pil_fmt, **({"quality": 90} if pil_fmt == "JPEG" else {}))
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


def write_file(fmt: str, path: Path, sizes: Sequence[int], layout: Layout, rng: np.random.Generator
               ) -> tuple[int, list[list[int]] | None, int]:
    """Write one dataset file at *path* (via a temporary name, then renamed).

    Returns (file bytes, record byte ranges ``[[offset, length], ...]`` for record
    formats else None, bytes of side files such as the ``.idx`` of indexed_binary).
    OSError propagates (the caller names the path).
    """
    tmp = path.with_name(f".{path.name}{TMP_SUFFIX}")
    offsets: list[list[int]] | None = None
    aux = 0
    n = len(sizes)
    if fmt in ("npz", "npy", "hdf5"):
        arr = np.frombuffer(rng.bytes(n * sizes[0]), dtype=np.uint8).reshape(n, sizes[0])
        if fmt == "npz":
            with open(tmp, "wb") as fh:
                (np.savez_compressed if layout.compressed else np.savez)(fh, x=arr)
        elif fmt == "npy":
            with open(tmp, "wb") as fh:
                np.save(fh, arr)
        else:
            import h5py

            kw: dict[str, Any] = {}
            if layout.hdf5_chunk_shape:
                kw["chunks"] = tuple(max(1, min(c, d)) for c, d in zip(layout.hdf5_chunk_shape, arr.shape, strict=False))
                if len(kw["chunks"]) != arr.ndim:
                    kw["chunks"] = (kw["chunks"][0], arr.shape[1])
            elif layout.hdf5_chunk_bytes:
                kw["chunks"] = (max(1, min(n, layout.hdf5_chunk_bytes // sizes[0])), sizes[0])
            if layout.hdf5_compression:
                kw["compression"] = layout.hdf5_compression
                if layout.hdf5_compression == "gzip" and layout.compression_level is not None:
                    kw["compression_opts"] = layout.compression_level
            with h5py.File(tmp, "w") as h5:
                h5.create_dataset("records", data=arr, **kw)
    elif fmt in ("jpeg", "png"):
        tmp.write_bytes(_image_bytes(rng, sizes[0], fmt))
    elif fmt in ("raw", "tfrecord", "indexed_binary"):
        offsets = []
        pos = 0
        with open(tmp, "wb") as fh:
            for s in sizes:
                payload = rng.bytes(s)
                blob = tfrecord_frame(payload) if fmt == "tfrecord" else payload
                fh.write(blob)
                offsets.append([pos, len(blob)])
                pos += len(blob)
        if fmt == "indexed_binary":
            idx = path.with_name(path.name + ".idx")
            idx_tmp = idx.with_name(f".{idx.name}{TMP_SUFFIX}")
            idx_tmp.write_bytes(np.asarray(offsets, dtype="<u8").tobytes())
            _fsync_path(idx_tmp)
            os.replace(idx_tmp, idx)
            aux = idx.stat().st_size
    elif fmt in ("csv", "parquet"):
        import polars as pl

        if fmt == "csv":
            rows = [rng.bytes(max(1, s // 2)).hex() + ("0" if s % 2 and s > 1 else "") for s in sizes]
            pl.DataFrame({"data": rows}).write_csv(tmp)
        else:
            pl.DataFrame({"data": [rng.bytes(s) for s in sizes]}, schema={"data": pl.Binary}).write_parquet(
                tmp, compression="uncompressed")
    else:  # pragma: no cover - validated by the model
        raise ReplayError(f"unsupported dataset format {fmt!r}")
    _fsync_path(tmp)
    os.replace(tmp, path)
    return path.stat().st_size, offsets, aux


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- readers


def _read_counters() -> tuple[int, int, int]:
    """(rchar, syscr, bytes of this probe) of the calling thread, from ``/proc/thread-self/io``.

    rchar: bytes returned by read-family syscalls so far; syscr: read-family syscalls so far.
    The kernel adds a read to them after it returns, so the probe's own read is in the next
    probe's values: the caller subtracts it (``bytes of this probe`` and one call).
    """
    try:
        fd = os.open("/proc/thread-self/io", os.O_RDONLY)
    except OSError:
        return 0, 0, 0
    try:
        text = os.read(fd, 4096)
    finally:
        os.close(fd)
    rchar = syscr = 0
    for line in text.splitlines():
        if line.startswith(b"rchar:"):
            rchar = int(line.split()[1])
        elif line.startswith(b"syscr:"):
            syscr = int(line.split()[1])
    return rchar, syscr, len(text)


class ReadMeter:
    """Bytes and read calls the calling thread makes between :meth:`start` and :meth:`stop`.

    Counted by the kernel, so it sees what a library does on its own (h5py's C library,
    Pillow's and numpy's buffered reads) exactly as a tracer does. Units: bytes, calls.
    """

    def __init__(self) -> None:
        self._r0 = self._c0 = self._probe = 0
        self.bytes = 0
        self.calls = 0

    def start(self) -> None:
        self._r0, self._c0, self._probe = _read_counters()

    def stop(self) -> tuple[int, int]:
        """(bytes, read calls) since :meth:`start`."""
        r1, c1, _ = _read_counters()
        self.bytes = max(0, r1 - self._r0 - self._probe)
        self.calls = max(0, c1 - self._c0 - 1)
        return self.bytes, self.calls


def thread_rchar() -> int:
    """Bytes returned by read-family syscalls of the calling thread so far (kernel ``rchar``)."""
    return _read_counters()[0]


#: What a sample decodes to: the array its library returns (decoded pixels, the record row).
Decoded = np.ndarray


class _Reader:
    """Base: keeps files open per reader (one per worker) unless *open_per_sample*."""

    def __init__(self, fmt: str, open_per_sample: bool) -> None:
        self.fmt = fmt
        self.open_per_sample = open_per_sample
        self._open: dict[str, Any] = {}
        self.meter = ReadMeter()

    def close(self) -> None:
        """Close every file kept open."""
        for h in self._open.values():
            try:
                os.close(h) if isinstance(h, int) else h.close()
            except (OSError, ValueError):
                pass
        self._open.clear()


def prime_library(fmt: str) -> None:
    """Import what the format's library imports on its first use (reads of .py files that are
    not the dataset's): decode a tiny sample held in memory."""
    if fmt in ("jpeg", "png"):
        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (8, 8)).save(buf, format="JPEG" if fmt == "jpeg" else "PNG")
        for _ in range(2):  # a path-less open takes one more plugin path the first time
            buf.seek(0)
            with Image.open(buf) as img:
                img.convert("RGB")
    elif fmt in ("npz", "npy"):
        buf = io.BytesIO()
        if fmt == "npz":
            np.savez(buf, x=np.zeros((1, 1), dtype=np.uint8))
            buf.seek(0)
            with np.load(buf) as z:
                z["x"]
        else:
            np.save(buf, np.zeros((1, 1), dtype=np.uint8))
            buf.seek(0)
            np.load(buf)
    elif fmt == "hdf5":
        import h5py  # noqa: F401
    elif fmt in ("parquet", "csv"):
        import polars  # noqa: F401


class LibraryReader(_Reader):
    """Reads samples through the format's library, the way a training job's Dataset does.

    * jpeg / png: ``PIL.Image.open(path).convert("RGB")`` (torchvision's default loader:
      Pillow opens the path itself, with a buffered file);
    * npz / npy: ``numpy.load(path)`` (with files kept open: ``numpy.load`` on a kept
      buffered handle, rewound);
    * with ``buffered`` false (the job handed the library an unbuffered file object,
      ``reader.file_buffering: unbuffered``), the library gets ``open(path, "rb",
      buffering=0)`` instead: each of its reads is one ``read(2)``, as in the job;
    * hdf5: ``h5py.File(path)`` with its default driver, kept open unless open_per_sample;
    * parquet / csv: polars on the path;
    * tfrecord / indexed_binary / raw: ``os.pread`` of the record's byte range.

    Bytes read are counted by the kernel for the calling thread (:class:`ReadMeter`). The
    library's lazy imports (numpy's zip reader, Pillow's format plugins) happen when the
    reader is made, by decoding a tiny in-memory sample, so no sample's count holds them.
    """

    def __init__(self, fmt: str, open_per_sample: bool, buffered: bool = True) -> None:
        super().__init__(fmt, open_per_sample)
        self.buffered = buffered
        prime_library(fmt)

    def read(self, path: str, k: int, rec: Sequence[int] | None) -> int:
        """Read sample *k* of *path* (*rec*: its ``[offset, length]`` for record formats); returns bytes read."""
        return self.read_decoded(path, k, rec)[0]

    def read_decoded(self, path: str, k: int, rec: Sequence[int] | None) -> tuple[int, Decoded]:
        """Read sample *k* of *path*; returns (bytes read, the decoded sample as an array)."""
        self.meter.start()
        out = self._decode(path, k, rec)
        nbytes, _ = self.meter.stop()
        return nbytes, out

    def _decode(self, path: str, k: int, rec: Sequence[int] | None) -> Decoded:
        fmt = self.fmt
        if fmt in ("tfrecord", "indexed_binary", "raw"):
            return self._read_record(path, k, rec)
        if fmt == "hdf5":
            return self._read_hdf5(path, k)
        if fmt in ("jpeg", "png"):
            from PIL import Image

            if not self.buffered:
                with open(path, "rb", buffering=0) as raw, Image.open(raw) as img:
                    return np.asarray(img.convert("RGB"))
            with Image.open(path) as img:
                return np.asarray(img.convert("RGB"))
        if fmt in ("npz", "npy"):
            if self.open_per_sample and not self.buffered:
                with open(path, "rb", buffering=0) as raw:
                    return self._numpy_sample(raw, k)
            return self._numpy_sample(path if self.open_per_sample else self._handle(path), k)
        if fmt in ("parquet", "csv"):
            import polars as pl

            frame = pl.read_parquet(path) if fmt == "parquet" else pl.read_csv(path)
            value = frame.row(k)[0]
            data = value if isinstance(value, bytes) else str(value).encode()
            return np.frombuffer(data, dtype=np.uint8)
        raise ReplayError(f"unsupported dataset format {fmt!r}")  # pragma: no cover - validated by the model

    def _numpy_sample(self, src: Any, k: int) -> Decoded:
        if self.fmt == "npz":
            with np.load(src) as z:
                return np.ascontiguousarray(z["x"][k])
        return np.ascontiguousarray(np.load(src)[k])

    def _handle(self, path: str) -> Any:
        fh = self._open.get(path)
        if fh is None:  # kept open across samples
            fh = self._open[path] = open(path, "rb", buffering=-1 if self.buffered else 0)  # noqa: SIM115
        fh.seek(0)
        return fh

    def _read_hdf5(self, path: str, k: int) -> Decoded:
        import h5py

        if self.open_per_sample:
            with h5py.File(path, "r") as h5:
                return np.asarray(h5["records"][k])
        h5 = self._open.get(path)
        if h5 is None:
            h5 = self._open[path] = h5py.File(path, "r")
        return np.asarray(h5["records"][k])

    def _read_record(self, path: str, k: int, rec: Sequence[int] | None) -> Decoded:
        fd = self._fd(path)
        try:
            if self.fmt == "indexed_binary":
                idx_fd = os.open(path + ".idx", os.O_RDONLY)
                try:
                    entry = os.pread(idx_fd, 16, 16 * k)
                finally:
                    os.close(idx_fd)
                off, length = struct.unpack("<QQ", entry) if len(entry) == 16 else (0, 0)
            else:
                off, length = (int(rec[0]), int(rec[1])) if rec else (0, os.fstat(fd).st_size)
            return np.frombuffer(os.pread(fd, length, off), dtype=np.uint8)
        finally:
            if self.open_per_sample:
                os.close(fd)

    def _fd(self, path: str) -> int:
        if self.open_per_sample:
            return os.open(path, os.O_RDONLY)
        fd = self._open.get(path)
        if fd is None:
            fd = self._open[path] = os.open(path, os.O_RDONLY)
        return fd


class PosixReader(_Reader):
    """``os.pread`` calls of the model's transfer size over each sample's byte range."""

    def __init__(self, fmt: str, open_per_sample: bool, stats_per_sample: float = 0.0,
                 lseeks_per_sample: float = 0.0) -> None:
        super().__init__(fmt, open_per_sample)
        self.stats_per_sample = stats_per_sample
        self.lseeks_per_sample = lseeks_per_sample
        self._stat_debt = 0.0
        self._lseek_debt = 0.0

    def read(self, path: str, offset: int, length: int, transfer: int) -> int:
        """Read bytes [offset, offset+length) of *path* in *transfer*-byte preads; returns bytes read."""
        return self.read_decoded(path, offset, length, transfer)[0]

    def read_decoded(self, path: str, offset: int, length: int, transfer: int) -> tuple[int, Decoded]:
        """As :meth:`read`; also returns the bytes read (uint8 array, the sample as stored)."""
        self._stat_debt += self.stats_per_sample
        while self._stat_debt >= 1.0:
            os.stat(path)
            self._stat_debt -= 1.0
        if self.open_per_sample:
            fd = os.open(path, os.O_RDONLY)
        else:
            kept = self._open.get(path)
            if kept is None:
                kept = self._open[path] = os.open(path, os.O_RDONLY)
            fd = kept
        try:
            self._lseek_debt += self.lseeks_per_sample
            while self._lseek_debt >= 1.0:
                os.lseek(fd, offset, os.SEEK_SET)
                self._lseek_debt -= 1.0
            transfer = max(1, int(transfer))
            buf = bytearray(max(0, length))
            view = memoryview(buf)
            pos, total = 0, 0
            while pos < length:
                got = os.preadv(fd, [view[pos:pos + min(transfer, length - pos)]], offset + pos)
                if got == 0:
                    break
                total += got
                pos += got
            return total, np.frombuffer(buf, dtype=np.uint8)[:total]
        finally:
            if self.open_per_sample:
                os.close(fd)
