"""Reading dataset files through the formats' real libraries (writers: :mod:`.writers`).

Readers come in two flavours:

* :class:`LibraryReader` reads a sample the way a training job does: ``numpy.load``
  (so NPZ's 256 KiB chunked member reads happen), ``h5py``, Pillow decode, polars,
  ``os.pread`` at the record's offset for tfrecord / indexed_binary;
* :class:`PosixReader` issues ``os.pread`` calls of the model's transfer size over
  the sample's byte range, plus the model's metadata calls.

Both return the number of bytes actually read (sum of read return values; for
h5py, whose C library reads by itself, the thread's ``rchar`` counter from
``/proc/thread-self/io``). Units: bytes.
"""

from __future__ import annotations

import io
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


class _Reader:
    """Base: keeps files open per reader (one per worker) unless *open_per_sample*."""

    def __init__(self, fmt: str, open_per_sample: bool) -> None:
        self.fmt = fmt
        self.open_per_sample = open_per_sample
        self._open: dict[str, Any] = {}

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
            n += len(os.pread(fd, length, off))
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
        self._stat_debt += self.stats_per_sample
        while self._stat_debt >= 1.0:
            os.stat(path)
            self._stat_debt -= 1.0
        if self.open_per_sample:
            fd = os.open(path, os.O_RDONLY)
        else:
            fd = self._open.get(path)
            if fd is None:
                fd = self._open[path] = os.open(path, os.O_RDONLY)
        try:
            self._lseek_debt += self.lseeks_per_sample
            while self._lseek_debt >= 1.0:
                os.lseek(fd, offset, os.SEEK_SET)
                self._lseek_debt -= 1.0
            transfer = max(1, int(transfer))
            pos, end, total = offset, offset + length, 0
            while pos < end:
                got = len(os.pread(fd, min(transfer, end - pos), pos))
                if got == 0:
                    break
                total += got
                pos += got
            return total
        finally:
            if self.open_per_sample:
                os.close(fd)

    def close(self) -> None:
        for fd in self._open.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._open.clear()
