"""Reading dataset files through the formats' real libraries (writers: :mod:`.writers`).

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

The builtin loader needs the bytes read, not the bytes: the posix reader and the record reads
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
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .common import ReplayError
from .direct import direct_call

# Writers live in :mod:`.writers`; these names stay importable from here.
from .writers import crc32c, masked_crc32c, tfrecord_frame, write_file  # noqa: E402, F401

# --------------------------------------------------------------------------- readers


def _read_counters() -> tuple[int, int, int]:
    """(rchar, syscr, bytes of this probe) of the calling thread, from ``/proc/thread-self/io``
    (read through a file kept open a thread: :func:`~.served.proc_io`).

    rchar: bytes returned by read-family syscalls so far; syscr: read-family syscalls so far.
    The kernel adds a read to them after it returns, so the probe's own read is in the next
    probe's values: the caller subtracts it (``bytes of this probe`` and one call).
    """
    from .served import proc_io

    text = proc_io(thread=True)
    if text is None:
        return 0, 0, 0
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


#: What a sample decodes to: the array its library returns (decoded pixels, the record row),
#: or the arrays a Dataset takes of a sample (an NPZ file's members, an HDF5 file's rows), as
#: the library returned them (:func:`joined` makes them one flat array)
Decoded = np.ndarray | tuple[np.ndarray, ...]


class _Reader:
    """Base: keeps files open per reader (one per worker) unless *open_per_sample*."""

    def __init__(self, fmt: str, open_per_sample: bool) -> None:
        self.fmt = fmt
        self.open_per_sample = open_per_sample
        self._open: dict[str, Any] = {}
        self.meter = ReadMeter()
        self._buf: ReadBuffer | None = None
        #: seconds the calling thread waited on the library's own threads (pyarrow reads a
        #: row group's chunks in its I/O threads): the job's preprocess time holds that wait,
        #: so the sample's modelled preprocessing takes it out, as the thread's runnable time
        self.library_wait = 0.0

    def buffer(self) -> ReadBuffer:
        """This reader's read buffer (made on first use)."""
        if self._buf is None:
            self._buf = ReadBuffer()
        return self._buf

    def close(self) -> None:
        """Close every file kept open and release the read buffer."""
        for h in self._open.values():
            try:
                if isinstance(h, int):
                    os.close(h)
                elif hasattr(h, "close"):  # (a mapped array is let go: its map closes with it)
                    h.close()
            except (OSError, ValueError):
                pass
        self._open.clear()
        if self._buf is not None:
            self._buf.close()
            self._buf = None


#: the formats whose library this process has primed (a forked worker inherits its parent's)
_PRIMED: set[str] = set()


def prime_library(fmt: str) -> None:
    """Import what the format's library imports on its first use (reads of .py files that are
    not the dataset's): decode a tiny sample held in memory. Once a process: a worker forked
    from a primed process has it all (polars' writes in a forked worker, whose thread pool the
    fork left behind, took 1.5-4 s at each worker's start)."""
    if fmt in _PRIMED:
        return
    _PRIMED.add(fmt)
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
        import polars as pl

        if fmt == "csv":
            pl.read_csv(b"a\n1\n")
        else:
            buf = io.BytesIO()
            pl.DataFrame({"a": [1]}).write_parquet(buf)
            pl.read_parquet(io.BytesIO(buf.getvalue()))
            try:  # reader.row_group_reads' library (the parquet extra): imported here, so each
                # worker forked per epoch has it (importing it there took 2.5 s on a busy VM)
                import pyarrow.parquet as pq
            except ImportError:
                return
            pq.ParquetFile(io.BytesIO(buf.getvalue())).read_row_group(0, use_threads=False)


def _array_key(name: str) -> str:
    """An array's name as the libraries list it: an HDF5 path without its leading ``/``
    (h5py's ``name`` of a dataset under the root), an NPZ member without ``.npy``."""
    name = name.lstrip("/")
    return name[: -len(".npy")] if name.endswith(".npy") else name


def _member(value: Any) -> np.ndarray:
    """An NPZ member as an array: numpy hands a member that is no ``.npy`` over as bytes."""
    return np.frombuffer(value, dtype=np.uint8) if isinstance(value, bytes) else value


def _sample_of(arrays: list[np.ndarray], k: int | None) -> Decoded:
    """One sample from the arrays a Dataset takes: row *k* of arrays with more than one row
    (None: the arrays are the sample's already), the whole array otherwise; several arrays
    stay several (a job's Dataset returns them as they are: joining them was a copy of every
    sample that the job's workers did not make)."""
    rows = [
        np.ascontiguousarray(a[k] if k is not None and a.ndim >= 1 and a.shape[0] > 1 else a)
        for a in arrays
    ]
    if len(rows) == 1:
        return rows[0]
    return tuple(rows) if rows else np.empty(0, dtype=np.uint8)


def joined(decoded: Decoded) -> np.ndarray:
    """A decoded sample as one array: a single array as it is, several as one flat byte array
    of their total size (the sample's decoded size)."""
    if isinstance(decoded, np.ndarray):
        return decoded
    return (
        np.concatenate([r.reshape(-1).view(np.uint8) for r in decoded])
        if decoded
        else np.empty(0, dtype=np.uint8)
    )


#: Bytes per read of a text dataset file (CSV) unless the model's transfer sizes say
#: otherwise: pandas' C parser reads 256 KiB at a time.
TEXT_CHUNK_BYTES = 256 << 10


class LibraryReader(_Reader):
    """Reads samples through the format's library, the way a training job's Dataset does.

    * jpeg / png: ``PIL.Image.open(path).convert("RGB")`` (torchvision's default loader:
      Pillow opens the path itself, with a buffered file);
    * npz / npy: ``numpy.load(path)`` (with files kept open: ``numpy.load`` on a kept
      buffered handle, rewound);
    * with ``buffered`` false (the job handed the library an unbuffered file object,
      ``reader.file_buffering: unbuffered``), the library gets ``open(path, "rb",
      buffering=0)`` instead: each of its reads is one ``read(2)``, as in the job;
    * hdf5: ``h5py.File(path)`` with its default driver, kept open unless open_per_sample
      (unbuffered: ``h5py.File`` of ``open(path, "rb", buffering=0)``, its fileobj driver);
    * parquet / csv: the file read in chunks of the model's largest transfer (256 KiB,
      pandas' reads, when unknown), then parsed by polars from memory;
    * tfrecord / indexed_binary / raw: ``os.pread`` of the record's byte range.

    Bytes read are counted by the kernel for the calling thread (:class:`ReadMeter`). The
    library's lazy imports (numpy's zip reader, Pillow's format plugins) happen when the
    reader is made, by decoding a tiny in-memory sample, so no sample's count holds them.
    """

    def __init__(
        self,
        fmt: str,
        open_per_sample: bool,
        buffered: bool = True,
        index_style: str | None = None,
        text_chunk: int = TEXT_CHUNK_BYTES,
        memory_map: bool = False,
        direct_io: str = "off",
        direct_io_threshold: int = 0,
        unread: Sequence[str] = (),
        record_buffer: int = 0,
        row_groups: bool = False,
    ) -> None:
        super().__init__(fmt, open_per_sample)
        #: parquet: a sample read as the row group holding it (:meth:`_row_group_row`)
        self.row_groups = row_groups and fmt == "parquet"
        self._group: tuple[str, int, Any] | None = (
            None  # the last row group read: path, index, table
        )
        self._group_starts: dict[str, list[int]] = {}
        self.buffered = buffered
        #: raw: read a record through a Python file of this buffer (bytes), as a job's
        #: ``seek`` + ``readline``/``read`` on ``open(path, "rb")`` does (0: ``os.pread`` of the
        #: record's bytes alone)
        self.record_buffer = record_buffer if fmt == "raw" else 0
        #: hdf5 datasets / npz members / parquet columns the job never reads per sample
        #: (without ``/``, ``.npy``)
        self.unread = {_array_key(n) for n in unread}
        #: npz/npy: whole files read through O_DIRECT (:mod:`.direct`), as DLIO's odirect reader
        self.direct_io = direct_io if fmt in ("npz", "npy") else "off"
        self.direct_io_threshold = direct_io_threshold
        self.index_style = index_style
        self.memory_map = memory_map
        self.text_chunk = max(4096, int(text_chunk))
        #: the unbuffered files handed to h5py (it never closes a file object it is given)
        self._raw: list[Any] = []
        prime_library(fmt)

    def close(self) -> None:
        """Close every file kept open, then the files handed to h5py under them."""
        super().close()
        for raw in self._raw:
            raw.close()
        self._raw.clear()

    def read(self, path: str, k: int, rec: Sequence[int] | None) -> int:
        """Read sample *k* of *path* (*rec*: its ``[offset, length]`` for record formats); returns bytes read."""
        return self.read_decoded(path, k, rec)[0]

    def read_decoded(self, path: str, k: int, rec: Sequence[int] | None) -> tuple[int, Decoded]:
        """Read sample *k* of *path*; returns (bytes read, the decoded sample: an array, or the
        arrays of a sample a Dataset takes, see :data:`Decoded`)."""
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
        if fmt == "npy" and self.memory_map:
            return self._mapped_row(path, k)
        if fmt == "arrow":  # a map-style Dataset's row of a mapped Arrow file
            return self._mapped_table_row(path, k)
        if fmt in ("npz", "npy"):
            if self.direct_io != "off" and (data := self._read_direct(path)) is not None:
                return self._numpy_sample(io.BytesIO(data), k)
            if self.open_per_sample and not self.buffered:
                with open(path, "rb", buffering=0) as raw:
                    return self._numpy_sample(raw, k)
            return self._numpy_sample(path if self.open_per_sample else self._handle(path), k)
        if fmt == "pt":
            return self._read_pt(path)
        if self.row_groups:
            return self._row_group_row(path, k)
        if fmt in ("parquet", "csv"):
            import polars as pl

            data = self._read_whole(path)
            frame = pl.read_parquet(io.BytesIO(data)) if fmt == "parquet" else pl.read_csv(data)
            value = frame.row(k)[0]
            data = value if isinstance(value, bytes) else str(value).encode()
            return np.frombuffer(data, dtype=np.uint8)
        raise ReplayError(
            f"unsupported dataset format {fmt!r}"
        )  # pragma: no cover - validated by the model

    def _row_group_row(self, path: str, k: int) -> Decoded:
        """Row *k* of a Parquet file as a job's ``ParquetFile.read_row_group`` gets it: the file
        opened once a process (pyarrow reads its footer then), the row group holding the row
        read (its column chunks), the last group kept, so rows of one group read it once."""
        import bisect

        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ReplayError(
                "reader.row_group_reads needs pyarrow (pip install 'dlreplay[parquet]'), or "
                "--set reader.row_group_reads=false to read whole files"
            ) from None

        pf = self._open.get(path)
        if pf is None:
            pf = pq.ParquetFile(path)
            if not self.open_per_sample:
                self._open[path] = pf
            meta = pf.metadata
            starts = [0]
            for g in range(meta.num_row_groups):
                starts.append(starts[-1] + meta.row_group(g).num_rows)
            self._group_starts[path] = starts
        starts = self._group_starts[path]
        g = min(max(bisect.bisect_right(starts, k) - 1, 0), len(starts) - 2)
        if self._group is None or self._group[:2] != (path, g):
            # decoded in this thread (use_threads=False): its CPU is counted as the library's
            # time, which the sample's preprocessing holds (pyarrow's pool's is not); the
            # chunks are read in pyarrow's I/O threads, and this thread's wait for them is the
            # job's too (the reads themselves: 10-15 us from the page cache, counted with it)
            from .loader import runnable_seconds

            # the columns the job reads (pyarrow then reads only their chunks)
            names = pf.schema_arrow.names
            cols = [n for n in names if _array_key(n) not in self.unread] if self.unread else None
            t0, r0 = time.perf_counter(), runnable_seconds()
            self._group = (path, g, pf.read_row_group(g, columns=cols or None, use_threads=False))
            self.library_wait += (time.perf_counter() - t0) - (runnable_seconds() - r0)
        table = self._group[2]
        row = min(k - starts[g], max(table.num_rows - 1, 0))
        value = table.column(0)[row].as_py() if table.num_rows and table.num_columns else b""
        if self.open_per_sample:
            pf.close()
        data = value if isinstance(value, bytes) else str(value).encode()
        return np.frombuffer(data, dtype=np.uint8)

    def _read_whole(self, path: str) -> bytes:
        """A file read start to end in reads of ``text_chunk`` bytes, and the read at its end
        that returns nothing, as pandas' ``read_csv`` reads (256 KiB at a time: DLIO's CSV
        reader, and most jobs' CSV datasets) before parsing. Parquet too: polars given a path
        (or a file) maps it, and a mapping's reads are page faults that neither the meter nor
        a tracer sees (a Parquet replay counted 0 bytes)."""
        parts = []
        with open(path, "rb", buffering=0) as fh:
            while block := fh.read(self.text_chunk):
                parts.append(block)
        return b"".join(parts)

    def _read_direct(self, path: str) -> bytes | None:
        """The whole file through ``O_DIRECT`` in one aligned read into the reader's buffer, as
        DLIO's odirect npy/npz reader (then parsed from memory); None when the model's
        ``direct_io`` keeps this file buffered (hybrid: smaller than the threshold)."""
        size = os.stat(path).st_size
        if not direct_call(self.direct_io, self.direct_io_threshold, size):
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
        try:
            got = pread_direct(fd, self.buffer(), 0, size, max(size, 1))
        finally:
            os.close(fd)
        return bytes(self.buffer().view(got))

    def _numpy_sample(self, src: Any, k: int) -> Decoded:
        if self.fmt == "npz":
            with np.load(src) as z:  # every member, as a job's Dataset takes the arrays of a sample
                # (a member that is no .npy, e.g. a torch.save archive's pickle or storages,
                # numpy hands over as its bytes)
                return _sample_of(
                    [_member(z[name]) for name in z.files if name not in self.unread], k
                )
        return _sample_of([np.load(src)], k)

    def _read_pt(self, path: str) -> Decoded:
        """A ``torch.save`` archive read by ``torch.load`` (tensors only: ``weights_only``), as
        the job's Dataset did: its tensors as arrays."""
        try:
            import torch
        except ImportError:
            raise ReplayError(
                "dataset.format pt is read by torch.load: install the torch extra "
                "(pip install 'dlreplay[torch]')"
            ) from None
        if self.open_per_sample and not self.buffered:
            with open(path, "rb", buffering=0) as raw:
                obj = torch.load(raw, weights_only=True)
        else:
            obj = torch.load(
                path if self.open_per_sample else self._handle(path), weights_only=True
            )
        values = (
            obj.values()
            if isinstance(obj, dict)
            else obj
            if isinstance(obj, (list, tuple))
            else [obj]
        )
        return tuple(v.numpy() for v in values if isinstance(v, torch.Tensor)) or np.zeros(
            0, np.uint8
        )

    def _handle(self, path: str) -> Any:
        fh = self._open.get(path)
        if fh is None:  # kept open across samples
            fh = self._open[path] = open(path, "rb", buffering=-1 if self.buffered else 0)  # noqa: SIM115
        fh.seek(0)
        return fh

    def _read_hdf5(self, path: str, k: int) -> Decoded:
        import h5py

        # unbuffered: the job handed h5py an unbuffered Python file object (h5py's fileobj
        # driver: every request of the library one seek and read(2)), else h5py's own driver
        if self.open_per_sample:
            if not self.buffered:
                with open(path, "rb", buffering=0) as raw, h5py.File(raw, "r") as h5:
                    return self._read_hdf5_row(h5, k)
            with h5py.File(path, "r") as h5:
                return self._read_hdf5_row(h5, k)
        h5 = self._open.get(path)
        if h5 is None:
            src = path if self.buffered else open(path, "rb", buffering=0)  # noqa: SIM115
            if not self.buffered:
                self._raw.append(src)
            h5 = self._open[path] = h5py.File(src, "r")
        return self._read_hdf5_row(h5, k)

    def _read_hdf5_row(self, h5: Any, k: int) -> Decoded:
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
                    if f"{group.name.rstrip('/')}/{key}".lstrip("/") in self.unread:
                        continue  # never opened, as the job never opens it
                    obj = group[key]
                    if isinstance(obj, h5py.Group):
                        stack.append(obj)
                    elif isinstance(obj, h5py.Dataset) and obj.ndim >= 1:
                        found.append((obj.name.lstrip("/"), obj.shape[0]))
            leading = [n for _, n in found]
            samples = max(set(leading), key=leading.count) if leading else 0
            names = self._h5_names = [
                n for n, rows in found if rows == samples and n not in self.unread
            ]
        return _sample_of([np.asarray(h5[name][k]) for name in names if name in h5], None)

    def _read_record(self, path: str, k: int, rec: Sequence[int] | None) -> Decoded:
        if self.index_style == "dlio" and rec is not None:
            return self._read_dlio_record(path, int(rec[0]), int(rec[1]))
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
            if self.record_buffer:
                return self._buffered_record(path, off, length)
            return np.frombuffer(os.pread(fd, length, off), dtype=np.uint8)
        finally:
            if self.open_per_sample:
                os.close(fd)

    def _buffered_record(self, path: str, off: int, length: int) -> Decoded:
        """A record read through a buffered Python file (``seek``, then ``read``): each read
        call fills the file's buffer from the record's offset, as the job's did."""
        key = f"{path}\0buffered"
        fh = self._open.get(key) if not self.open_per_sample else None
        if fh is None:
            fh = open(path, "rb", buffering=self.record_buffer)  # noqa: SIM115
            if not self.open_per_sample:
                self._open[key] = fh
        try:
            fh.seek(off)
            return np.frombuffer(fh.read(length), dtype=np.uint8)
        finally:
            if self.open_per_sample:
                fh.close()

    def _mapped_row(self, path: str, k: int) -> Decoded:
        """Row *k* of an NPY file mapped once (``np.load(mmap_mode="r")``, kept: a Dataset that
        maps its array in ``__init__`` or at its first item), copied out of the mapping, so its
        pages are faulted in from storage as the job's were; no read call beyond the header's."""
        arr = self._open.get(path)
        if arr is None:
            arr = self._open[path] = np.load(path, mmap_mode="r")
        return np.array(arr[k] if arr.ndim and arr.shape[0] > 1 else arr)

    def _mapped_table_row(self, path: str, k: int) -> Decoded:
        """Row *k* of an Arrow IPC stream (or file) mapped once a process (``pa.memory_map``,
        as HF ``datasets`` maps its cache files), each column's value copied out of the
        mapping: its pages faulted in from storage, no read call."""
        import pyarrow as pa

        table = self._open.get(path)
        if table is None:
            source = pa.memory_map(path)
            try:
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:  # the random-access file format
                table = pa.ipc.open_file(source).read_all()
            self._open[path] = table
        values = [table.column(c)[k].as_py() for c in table.column_names]
        return tuple(
            np.frombuffer(v, dtype=np.uint8) if isinstance(v, bytes) else np.asarray(v)
            for v in values
        )

    def _read_dlio_record(self, path: str, offset: int, length: int) -> Decoded:
        """DLIO 2.0's ``IndexedBinaryReader.get_sample``: a Python file object, ``seek`` to the
        record and ``readinto`` an array of its size. With ``memory_map``, its
        ``IndexedBinaryMMapReader``: the file mapped (``np.memmap``), the record a view of the
        mapping that nothing touches (no read call; the sample handed over is DLIO's resized one)."""
        if self.memory_map:
            mapped = np.memmap(path, mode="r", dtype=np.uint8)
            return mapped[offset : offset + length]
        fh = open(path, "rb") if self.open_per_sample else self._handle(path)  # noqa: SIM115
        try:
            fh.seek(offset)
            out = np.empty(length, dtype=np.uint8)
            fh.readinto(out)  # type: ignore[arg-type]  # an ndarray is a writable buffer; numpy's stubs do not say so
            return out
        finally:
            if self.open_per_sample:
                fh.close()

    def _fd(self, path: str) -> int:
        if self.open_per_sample:
            return os.open(path, os.O_RDONLY)
        fd = self._open.get(path)
        if fd is None:
            fd = self._open[path] = os.open(path, os.O_RDONLY)
        return fd


class PosixReader(_Reader):
    """``pread`` calls of the model's transfer size over each sample's byte range, plus the
    model's metadata calls.

    :meth:`read` (the builtin loader: only the count matters) reads into one reused buffer
    (:func:`pread_into`); :meth:`read_decoded` (the PyTorch loader, which hands the sample to
    ``collate``) reads into a new array of the sample's size. ``direct`` opens files with
    ``O_DIRECT`` (:func:`pread_direct`) where the platform and the file system allow it, else
    as usual (``direct_used`` says which happened last); it applies to :meth:`read`.
    """

    def __init__(
        self,
        fmt: str,
        open_per_sample: bool,
        stats_per_sample: float = 0.0,
        lseeks_per_sample: float = 0.0,
        direct: bool = False,
    ) -> None:
        super().__init__(fmt, open_per_sample)
        self.stats_per_sample = stats_per_sample
        self.lseeks_per_sample = lseeks_per_sample
        self._stat_debt = 0.0
        self._lseek_debt = 0.0
        self.direct = direct and hasattr(os, "O_DIRECT")
        self.direct_used = False
        self._direct_fds: set[int] = set()

    def _open_fd(self, path: str, direct: bool) -> int:
        if direct and self.direct:
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

    def _begin(self, path: str, offset: int, direct: bool) -> int:
        """The sample's metadata calls (stat, lseek as the model says) and its file descriptor."""
        self._stat_debt += self.stats_per_sample
        while self._stat_debt >= 1.0:
            os.stat(path)
            self._stat_debt -= 1.0
        fd: int | None
        if self.open_per_sample:
            fd = self._open_fd(path, direct)
        else:
            key = path + "\0direct" if direct and self.direct else path  # hybrid: one fd of each
            fd = self._open.get(key)
            if fd is None:
                fd = self._open[key] = self._open_fd(path, direct)
        self._lseek_debt += self.lseeks_per_sample
        while self._lseek_debt >= 1.0:
            os.lseek(fd, offset, os.SEEK_SET)
            self._lseek_debt -= 1.0
        return fd

    def _end(self, fd: int) -> None:
        if self.open_per_sample:
            self._direct_fds.discard(fd)
            os.close(fd)

    def read(self, path: str, offset: int, length: int, transfer: int, direct: bool = True) -> int:
        """Read bytes [offset, offset+length) of *path* in *transfer*-byte preads; returns bytes
        read. *direct*: through ``O_DIRECT`` when the reader was made ``direct``."""
        fd = self._begin(path, offset, direct)
        try:
            if fd in self._direct_fds:
                return pread_direct(fd, self.buffer(), offset, length, transfer)
            return pread_into(fd, self.buffer(), offset, length, transfer)
        finally:
            self._end(fd)

    def read_decoded(
        self, path: str, offset: int, length: int, transfer: int
    ) -> tuple[int, Decoded]:
        """As :meth:`read`, into a new array: (bytes read, the bytes as stored, uint8)."""
        fd = self._begin(path, offset, False)
        try:
            transfer = max(1, int(transfer))
            buf = bytearray(max(0, length))
            view = memoryview(buf)
            pos, total = 0, 0
            while pos < length:
                got = os.preadv(fd, [view[pos : pos + min(transfer, length - pos)]], offset + pos)
                if got <= 0:
                    break
                total += got
                pos += got
            return total, np.frombuffer(buf, dtype=np.uint8)[:total]
        finally:
            self._end(fd)

    def close(self) -> None:
        super().close()
        self._direct_fds.clear()
