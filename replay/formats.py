"""Reading dataset files through the formats' real libraries (writers: :mod:`.writers`).

Readers come in two flavours:

* :class:`LibraryReader` reads a sample the way a training job does: ``numpy.load``
  (so NPZ's 256 KiB chunked member reads happen), ``h5py``, Pillow decode, polars,
  ``os.pread`` at the record's offset for tfrecord / indexed_binary;
* :class:`PosixReader` issues ``pread`` calls of the model's transfer size over
  the sample's byte range, plus the model's metadata calls.

Both return the number of bytes actually read (sum of read return values; for
h5py, whose C library reads by itself, the thread's ``rchar`` counter from
``/proc/thread-self/io``). Units: bytes.

The replay needs the bytes read, not the bytes: the posix reader and the record reads
of the library reader fill one reusable page-aligned buffer per reader with
``os.preadv`` (:class:`ReadBuffer`), so a read makes no Python object of its size and
touches no fresh page (``os.pread`` returned a new ``bytes`` per call: for a 4 MiB
transfer, a fresh mapping whose 1,024 pages were faulted in, copied into and unmapped
again). With ``direct`` the posix reader opens files with ``O_DIRECT`` where the file
system allows it (the page cache is bypassed: reads go to the device; offsets and sizes
are aligned to :data:`DIRECT_ALIGN`, and only the bytes of the sample are counted).
"""

from __future__ import annotations

import errno
import io
import mmap
import os
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

# Writers live in :mod:`.writers`; these names stay importable from here.
from .writers import crc32c, masked_crc32c, tfrecord_frame, write_file  # noqa: E402, F401

# --------------------------------------------------------------------------- readers


class CountingFileIO(io.FileIO):
    """An unbuffered file that counts the bytes its reads return (``counted``, bytes)."""

    counted: int = 0

    def read(self, size: int = -1) -> bytes:  # type: ignore[override]
        data = super().read(size)
        if data:
            self.counted += len(data)
        return data

    def readall(self) -> bytes:
        data = super().readall()
        self.counted += len(data)
        return data

    def readinto(self, buffer: Any) -> int:  # type: ignore[override]
        n = super().readinto(buffer)
        if n:
            self.counted += n
        return n or 0


def thread_rchar() -> int:
    """Bytes returned by read-family syscalls of the calling thread so far (kernel ``rchar``)."""
    try:
        with open("/proc/thread-self/io", "rb") as fh:
            for line in fh:
                if line.startswith(b"rchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


#: Alignment of ``O_DIRECT`` offsets, sizes and buffers (bytes): the page size, a
#: multiple of every common logical block size.
DIRECT_ALIGN = mmap.PAGESIZE


class ReadBuffer:
    """A reusable page-aligned buffer (an anonymous mapping, grown to the largest size
    asked) that reads fill in place: ``view(n)`` is a memoryview of its first ``n`` bytes."""

    def __init__(self, size: int = 1 << 20) -> None:
        self._map = mmap.mmap(-1, _aligned(max(size, 1)))
        self._view = memoryview(self._map)

    def view(self, n: int) -> memoryview:
        if n > len(self._view):
            self._view.release()
            self._map.close()
            self._map = mmap.mmap(-1, _aligned(n))
            self._view = memoryview(self._map)
        return self._view[:n]

    def close(self) -> None:
        self._view.release()
        self._map.close()


def _aligned(n: int) -> int:
    return -(-n // DIRECT_ALIGN) * DIRECT_ALIGN


def pread_into(fd: int, buf: ReadBuffer, offset: int, length: int, transfer: int) -> int:
    """Read bytes [offset, offset+length) of ``fd`` with ``pread`` calls of ``transfer`` bytes
    into ``buf`` (each call overwrites the one before); the bytes read (fewer at end of file)."""
    transfer = max(1, int(transfer))
    preadv = os.preadv
    full = [buf.view(min(transfer, max(length, 1)))]
    pos, end, total = offset, offset + length, 0
    while pos < end:
        n = end - pos
        got = preadv(fd, full if n >= transfer else [full[0][:n]], pos)
        if got <= 0:
            break
        total += got
        pos += got
    return total


def pread_direct(fd: int, buf: ReadBuffer, offset: int, length: int, transfer: int) -> int:
    """:func:`pread_into` on a file opened with ``O_DIRECT``: the range is widened to
    :data:`DIRECT_ALIGN` boundaries and read in aligned transfers; only the bytes of
    [offset, offset+length) that the reads returned are counted."""
    transfer = _aligned(max(1, int(transfer)))
    start, end = offset - offset % DIRECT_ALIGN, offset + length
    stop = _aligned(end)
    full = [buf.view(min(transfer, max(stop - start, DIRECT_ALIGN)))]
    pos, total = start, 0
    preadv = os.preadv
    while pos < stop:
        n = min(transfer, stop - pos)
        got = preadv(fd, full if n == transfer else [full[0][:n]], pos)
        if got <= 0:
            break
        total += max(0, min(pos + got, end) - max(pos, offset))
        if got < n:  # end of file
            break
        pos += got
    return total


class _Reader:
    """Base: keeps files open per reader (one per worker) unless *open_per_sample*."""

    def __init__(self, fmt: str, open_per_sample: bool) -> None:
        self.fmt = fmt
        self.open_per_sample = open_per_sample
        self._open: dict[str, Any] = {}
        self._buf: ReadBuffer | None = None

    def buffer(self) -> ReadBuffer:
        """This reader's read buffer (made on first use)."""
        if self._buf is None:
            self._buf = ReadBuffer()
        return self._buf

    def close(self) -> None:
        """Close every file kept open."""
        for h in self._open.values():
            try:
                h.close() if hasattr(h, "close") else os.close(h)
            except (OSError, ValueError):
                pass
        self._open.clear()


class LibraryReader(_Reader):
    """Reads samples through the format's library (what a training job's Dataset does)."""

    def read(self, path: str, k: int, rec: Sequence[int] | None) -> int:
        """Read sample *k* of *path* (*rec*: its ``[offset, length]`` for record formats); returns bytes read."""
        fmt = self.fmt
        if fmt in ("tfrecord", "indexed_binary", "raw"):
            return self._read_record(path, k, rec)
        if fmt == "hdf5":
            return self._read_hdf5(path, k)
        fh = self._file(path)
        before = fh.counted
        fh.seek(0)
        if fmt == "npz":
            with np.load(fh) as z:  # every member, as a job's Dataset takes the arrays of a sample
                for name in z.files:
                    _ = z[name]
        elif fmt == "npy":
            arr = np.load(fh)  # FileIO → numpy reads with fromfile: count the position moved
            fh.counted = max(fh.counted, before + fh.tell())
            _ = arr[k]
        elif fmt in ("jpeg", "png"):
            from PIL import Image

            with Image.open(fh) as img:
                img.load()
        elif fmt == "parquet":
            import polars as pl

            _ = pl.read_parquet(fh).row(k)
        elif fmt == "csv":
            import polars as pl

            _ = pl.read_csv(fh).row(k)
        n = fh.counted - before
        if self.open_per_sample:
            fh.close()
        return n

    def _file(self, path: str) -> CountingFileIO:
        if self.open_per_sample:
            return CountingFileIO(path, "r")
        fh = self._open.get(path)
        if fh is None:
            fh = self._open[path] = CountingFileIO(path, "r")
        return fh

    def _read_hdf5(self, path: str, k: int) -> int:
        import h5py

        before = thread_rchar()
        if self.open_per_sample:
            with h5py.File(path, "r") as h5:
                self._read_hdf5_row(h5, k)
        else:
            h5 = self._open.get(path)
            if h5 is None:
                h5 = self._open[path] = h5py.File(path, "r")
            self._read_hdf5_row(h5, k)
        return thread_rchar() - before

    def _read_hdf5_row(self, h5: Any, k: int) -> None:
        """Row *k* of every dataset with a sample axis (the arrays a job's Dataset reads per sample).

        The dataset names are taken from the first file and kept (the files of a dataset
        share their structure), so later samples look names up as a job's code does.
        """
        names = getattr(self, "_h5_names", None)
        if names is None:
            import h5py

            # names by walking links, not visititems: H5Ovisit's object info traverses every
            # chunk index (hundreds of KiB of B-tree reads in a file of small chunks)
            found: list[tuple[str, int]] = []
            stack = [h5]
            while stack:
                group = stack.pop()
                for key in group:
                    obj = group[key]
                    if isinstance(obj, h5py.Group):
                        stack.append(obj)
                    elif isinstance(obj, h5py.Dataset) and obj.ndim >= 1:
                        found.append((obj.name.lstrip("/"), obj.shape[0]))
            leading = [n for _, n in found]
            samples = max(set(leading), key=leading.count) if leading else 0
            names = self._h5_names = [n for n, rows in found if rows == samples]
        for name in names:
            if name in h5:
                _ = h5[name][k]

    def _read_record(self, path: str, k: int, rec: Sequence[int] | None) -> int:
        fd = self._fd(path)
        try:
            n = 0
            if self.fmt == "indexed_binary":
                idx_fd = os.open(path + ".idx", os.O_RDONLY)
                try:
                    entry = os.pread(idx_fd, 16, 16 * k)
                finally:
                    os.close(idx_fd)
                n += len(entry)
                off, length = struct.unpack("<QQ", entry) if len(entry) == 16 else (0, 0)
            else:
                off, length = (int(rec[0]), int(rec[1])) if rec else (0, os.fstat(fd).st_size)
            # one read of the record, as the format's reader makes it, into the reused buffer
            n += pread_into(fd, self.buffer(), off, length, max(length, 1))
            return n
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

    def close(self) -> None:
        for h in self._open.values():
            try:
                os.close(h) if isinstance(h, int) else h.close()
            except (OSError, ValueError):
                pass
        self._open.clear()
        if self._buf is not None:
            self._buf.close()
            self._buf = None


class PosixReader(_Reader):
    """``pread`` calls of the model's transfer size over each sample's byte range (into
    one reused buffer: :func:`pread_into`), plus the model's metadata calls.

    ``direct`` opens files with ``O_DIRECT`` (:func:`pread_direct`) where the platform and
    the file system allow it, else as usual (``direct_used`` says which happened last).
    """

    def __init__(self, fmt: str, open_per_sample: bool, stats_per_sample: float = 0.0,
                 lseeks_per_sample: float = 0.0, direct: bool = False) -> None:
        super().__init__(fmt, open_per_sample)
        self.stats_per_sample = stats_per_sample
        self.lseeks_per_sample = lseeks_per_sample
        self._stat_debt = 0.0
        self._lseek_debt = 0.0
        self.direct = direct and hasattr(os, "O_DIRECT")
        self.direct_used = False
        self._direct_fds: set[int] = set()

    def _open_fd(self, path: str) -> int:
        if self.direct:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
                self._direct_fds.add(fd)
                self.direct_used = True
                return fd
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # EINVAL: this file system has no O_DIRECT
                    raise
                self.direct = False
        self.direct_used = False
        return os.open(path, os.O_RDONLY)

    def read(self, path: str, offset: int, length: int, transfer: int) -> int:
        """Read bytes [offset, offset+length) of *path* in *transfer*-byte preads; returns bytes read."""
        self._stat_debt += self.stats_per_sample
        while self._stat_debt >= 1.0:
            os.stat(path)
            self._stat_debt -= 1.0
        if self.open_per_sample:
            fd = self._open_fd(path)
        else:
            fd = self._open.get(path)
            if fd is None:
                fd = self._open[path] = self._open_fd(path)
        try:
            self._lseek_debt += self.lseeks_per_sample
            while self._lseek_debt >= 1.0:
                os.lseek(fd, offset, os.SEEK_SET)
                self._lseek_debt -= 1.0
            if fd in self._direct_fds:
                return pread_direct(fd, self.buffer(), offset, length, transfer)
            return pread_into(fd, self.buffer(), offset, length, transfer)
        finally:
            if self.open_per_sample:
                self._direct_fds.discard(fd)
                os.close(fd)

    def close(self) -> None:
        for fd in self._open.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._open.clear()
        self._direct_fds.clear()
        if self._buf is not None:
            self._buf.close()
            self._buf = None
