"""What the storage served a replay: the block layer's reads and writes for the replay's
processes, the dataset device's own counters, and cold epochs (the dataset's pages dropped).

* **served bytes** (per batch, then per epoch): ``read_bytes`` of ``/proc/<pid>/io`` (bytes
  the block layer read for a process: page-cache misses, readahead included) taken by each
  reading process itself, as a delta per batch (a :class:`ReadMeter` in every loader worker:
  workers are other processes, and a worker forked from a forkserver is not the accelerator's
  child, so nothing else sees its counters). A reader in a thread that is not its process's
  main thread (the builtin loader's thread workers) takes ``/proc/thread-self/io`` instead, so
  threads of one process do not count each other's reads. Reads a format library does in
  threads of its own (polars) are counted in a worker process, not in a thread worker.
* **written bytes** (per epoch, per accelerator): the accelerator process's ``write_bytes``
  less ``cancelled_write_bytes`` (bytes it dirtied for the storage: written back now or
  later; checkpoints, and a traced replay's own trace files), and ``wchar`` (bytes passed to
  write calls).
* **device bytes** (per epoch): sectors read and written by the dataset's block device
  (``/sys/dev/block/MAJ:MIN/stat``, 512 B sectors), by every process on the host: the
  storage's own count, flushed writes included; absent where the dataset is not on a block
  device (tmpfs, overlay, NFS).
* **an S3 replay** (the model's ``storage_type: s3``): its reads never reach this host's block
  layer, so its served bytes are the bytes the object store returned to its GETs (the responses'
  ``Content-Length``, or the bytes the client library handed over), counted by the reader
  (:class:`ReadMeter` given the reader's count), and the epoch says ``served_from:
  object_store``; no page-cache share, no device counters and nothing dropped by ``--cold``
  (the server's caches are its own).
* **cold** (:func:`drop_pages`): before an epoch, each dataset file is flushed
  (``fdatasync``) and its pages dropped (``posix_fadvise(POSIX_FADV_DONTNEED)``), and with
  method ``auto`` the whole page cache too when ``/proc/sys/vm/drop_caches`` is writable;
  residency after the drop is checked on a few files with ``mincore(2)``.

Sizes in bytes, times in seconds.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "COLD_METHODS",
    "SERVED_FROM",
    "EpochProbe",
    "ReadMeter",
    "count_served",
    "device_counters",
    "drop_pages",
    "cold_epoch",
    "filesystem_of",
    "io_counters",
    "residency",
]

#: ``--cold`` methods: ``auto`` (fadvise per file, and drop_caches when writable), ``fadvise`` (per file only)
COLD_METHODS = ("auto", "fadvise")
#: Filesystems whose files live in memory: nothing can be dropped
MEMORY_FS = ("tmpfs", "ramfs", "devtmpfs")
DROP_CACHES = "/proc/sys/vm/drop_caches"
#: Files whose residency is checked after a drop (mincore maps each)
RESIDENCY_SAMPLE = 8
SECTOR = 512

#: where an epoch's served bytes came from: the block layer (``/proc/<pid>/io``), or the object
#: store's GET responses (an S3 replay)
SERVED_FROM = ("block_layer", "object_store")

#: open ``/proc/.../io`` files, by (pid, native thread id or 0 for the process): one pread per read
_FDS: dict[tuple[int, int], int] = {}
_FDS_LOCK = threading.Lock()


def proc_io(thread: bool = False) -> bytes | None:
    """The text of the calling process's (or, *thread*, the calling thread's) ``/proc/.../io``,
    by one ``pread`` of a file kept open a thread (an open, a read and a close each time cost
    20-40 us an item on this 2-core VM, a fifth of a JSON line's time); None where /proc is
    not readable."""
    key = (os.getpid(), threading.get_native_id() if thread else 0)
    path = "/proc/thread-self/io" if thread else "/proc/self/io"
    for _ in range(2):
        with _FDS_LOCK:
            fd = _FDS.get(key)
        try:
            if fd is None:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                with _FDS_LOCK:
                    _FDS[key] = fd
            return os.pread(fd, 1024, 0)
        except OSError:
            with _FDS_LOCK:
                stale = _FDS.pop(key, None)
            if stale is None:
                return None
            try:  # a thread id reused by another thread, or an fd closed under us: open again once
                os.close(stale)
            except OSError:
                pass
    return None


def io_counters(thread: bool = False) -> dict[str, int] | None:
    """The calling process's (or, *thread*, the calling thread's) ``/proc/.../io`` counters
    (``rchar``, ``wchar``, ``read_bytes``, ``write_bytes``, ``cancelled_write_bytes``, bytes);
    None where the kernel keeps none (no task I/O accounting) or /proc is not readable."""
    raw = proc_io(thread)
    if raw is None:
        return None
    out = {}
    for line in raw.decode("ascii", "replace").splitlines():
        name, _, value = line.partition(":")
        if value.strip().isdigit():
            out[name.strip()] = int(value)
    return out if "read_bytes" in out else None


class ReadMeter:
    """Bytes the block layer read for the reading thread's process (or the thread alone when it
    is not its process's main thread) since the previous :meth:`take`; made in the thread
    that reads. With *counter* (a reader's running count of the bytes its storage returned:
    an S3 reader's GET responses), the deltas of that count instead."""

    def __init__(self, counter: Callable[[], int] | None = None) -> None:
        self.thread = threading.current_thread() is not threading.main_thread()
        self.pid = os.getpid()
        self.counter = counter
        if counter is not None:
            self.last: int | None = int(counter())
            return
        first = io_counters(self.thread)
        self.last = first["read_bytes"] if first else None

    def take(self) -> int | None:
        """Bytes read from the storage since the last call (or since the meter was made); None
        where they cannot be counted."""
        if self.last is None or os.getpid() != self.pid:  # unmeasured, or a forked copy
            return None
        if self.counter is not None:
            got, self.last = int(self.counter()) - self.last, int(self.counter())
            return max(got, 0)
        now = io_counters(self.thread)
        if now is None:
            return None
        got, self.last = now["read_bytes"] - self.last, now["read_bytes"]
        return max(got, 0)


def count_served(rec: dict[str, Any], served: int | None) -> None:
    """Add a batch's served bytes to its epoch's record *rec* (a batch its loader could not
    measure is counted in ``served_unmeasured_batches``)."""
    if served is None:
        rec["served_unmeasured_batches"] = rec.get("served_unmeasured_batches", 0) + 1
    else:
        rec["served_bytes"] = rec.get("served_bytes", 0) + int(served)


def device_counters(path: str) -> tuple[str, int, int] | None:
    """(device name, bytes read, bytes written) of the block device holding *path*, from
    ``/sys/dev/block/MAJ:MIN/stat`` (all processes); None where *path* is on no block device."""
    try:
        dev = os.stat(path).st_dev
        base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
        with open(base + "/stat") as fh:
            fields = fh.read().split()
        name = os.path.basename(os.path.realpath(base))
        return name, int(fields[2]) * SECTOR, int(fields[6]) * SECTOR
    except (OSError, ValueError, IndexError):
        return None


class EpochProbe:
    """One accelerator's counters across an epoch: its process's writes, and the dataset
    device's reads and writes (only where *device* is true: one accelerator per host does it;
    never for *objects*: an S3 replay's dataset is in the object store, not on a device here)."""

    def __init__(self, data_dir: str, device: bool, objects: bool = False) -> None:
        self.data_dir = data_dir
        self.objects = objects
        self.io = io_counters()
        self.dev = device_counters(data_dir) if device and not objects else None

    def finish(self, rec: dict[str, Any], cold: dict[str, Any] | None = None) -> None:
        """Write the epoch's ``written_bytes``, ``write_call_bytes``, (where measured) the
        device's ``device``, ``device_read_bytes``, ``device_write_bytes``, and what ``--cold``
        did before it (*cold*, see :func:`drop_pages`) into *rec*, and ``served_from`` (a
        :data:`SERVED_FROM`: what its ``served_bytes`` count)."""
        rec.setdefault("served_bytes", 0)
        rec["served_from"] = SERVED_FROM[1] if self.objects else SERVED_FROM[0]
        if cold is not None:
            rec["cold"] = cold
        io = io_counters()
        if self.io is not None and io is not None:
            dirty = io["write_bytes"] - io.get("cancelled_write_bytes", 0)
            was = self.io["write_bytes"] - self.io.get("cancelled_write_bytes", 0)
            rec["written_bytes"] = max(dirty - was, 0)
            rec["write_call_bytes"] = max(io.get("wchar", 0) - self.io.get("wchar", 0), 0)
        dev = device_counters(self.data_dir) if self.dev is not None else None
        if self.dev is not None and dev is not None:
            rec["device"] = dev[0]
            rec["device_read_bytes"] = max(dev[1] - self.dev[1], 0)
            rec["device_write_bytes"] = max(dev[2] - self.dev[2], 0)


# --------------------------------------------------------------------------- cold epochs


def filesystem_of(path: str) -> tuple[str, str, str]:
    """(filesystem type, source device, mount point) of *path*, by the longest mount point of
    ``/proc/self/mounts`` above it; ("unknown", "", "") where none is found."""
    real = os.path.realpath(path)
    best = ("unknown", "", "")
    try:
        with open("/proc/self/mounts") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return best
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best[2]):
            best = (parts[2], parts[0], mnt)
    return best


_LIBC: Any = None


def residency(path: str) -> float | None:
    """Fraction of *path*'s pages in the page cache (``mincore(2)`` over a read-only mapping);
    None where it cannot be told (an empty or unreadable file, no mincore)."""
    global _LIBC
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL(None, use_errno=True)
            _LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                return None
            mapped = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
    except (OSError, ValueError, AttributeError):
        return None
    try:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        view = np.frombuffer(mapped, dtype=np.uint8)  # (ctypes takes only writable buffers)
        rc = _LIBC.mincore(ctypes.c_void_p(view.ctypes.data), size, vec)
        del view
        if rc != 0:
            return None
        return int((np.frombuffer(bytes(vec), dtype=np.uint8) & 1).sum()) / pages
    except (TypeError, ValueError, BufferError):
        return None
    finally:
        try:
            mapped.close()
        except BufferError:
            pass


def _drop_file(path: str) -> str | None:
    """Flush *path* and drop its pages; an error's text, or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    try:
        try:
            os.fdatasync(fd)  # dirty pages are not dropped: flush first (this file only)
        except OSError:
            pass  # a read-only filesystem has nothing dirty
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return None
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    finally:
        os.close(fd)


def _drop_caches() -> str | None:
    """Drop the whole page cache through ``/proc/sys/vm/drop_caches`` (after ``sync``); None when
    done, else why not."""
    if not os.access(DROP_CACHES, os.W_OK):
        return "not writable (needs root)"
    try:
        os.sync()
        with open(DROP_CACHES, "w") as fh:
            fh.write("1\n")
        return None
    except OSError as exc:
        return exc.strerror or str(exc)


def drop_pages(
    data_dir: str, paths: Sequence[str], method: str, whole_cache: bool = True
) -> dict[str, Any]:
    """Drop the dataset's pages before an epoch (see the module doc); *paths* relative to
    *data_dir*; *whole_cache*: this caller may write drop_caches (one accelerator per host).

    Returns what was done: ``method`` (``fadvise``, ``fadvise+drop_caches`` or ``none``),
    ``files``, ``seconds``, ``filesystem``, ``resident_after_percent`` (mean residency of up to
    :data:`RESIDENCY_SAMPLE` files after the drop; None where not told) and ``note`` (a plain
    sentence: what could not be done and why)."""
    t0 = time.perf_counter()
    fstype, source, _ = filesystem_of(data_dir)
    full = [os.path.join(data_dir, p) for p in paths]
    out: dict[str, Any] = {
        "method": "none",
        "files": 0,
        "seconds": 0.0,
        "filesystem": fstype,
        "source": source,
        "resident_after_percent": None,
        "note": "",
    }
    if fstype in MEMORY_FS:
        out["note"] = (
            f"page cache cannot be dropped on {fstype}: its files live in memory, every read is "
            f"served from memory"
        )
        return out
    errors = [e for e in (_drop_file(p) for p in full) if e]
    out["files"] = len(full) - len(errors)
    out["method"] = "fadvise"
    notes = []
    if errors:
        notes.append(f"{len(errors)} file(s) not dropped ({errors[0]})")
    if method == "auto" and whole_cache:
        why = _drop_caches()
        if why is None:
            out["method"] = "fadvise+drop_caches"
        else:
            notes.append(f"{DROP_CACHES}: {why}; each file's pages dropped with posix_fadvise")
    step = max(1, len(full) // RESIDENCY_SAMPLE)
    res = [r for r in (residency(p) for p in full[::step][:RESIDENCY_SAMPLE]) if r is not None]
    if res:
        out["resident_after_percent"] = 100.0 * sum(res) / len(res)
        if out["resident_after_percent"] > 10.0:
            notes.append(
                f"{out['resident_after_percent']:.0f} % of the checked files' pages stayed in "
                f"memory after the drop ({fstype} may ignore POSIX_FADV_DONTNEED)"
            )
    out["note"] = "; ".join(notes)
    out["seconds"] = time.perf_counter() - t0
    return out


def cold_epoch(spec: Any, rank: int, sync: Callable[[], None]) -> dict[str, Any] | None:
    """``--cold``: every accelerator drops the dataset's pages (a host of its own has its own
    page cache; rank 0 alone may drop the whole cache), then waits for the others (*sync*: the
    replay's barrier), so no epoch starts before every drop is done. *spec*: the
    :class:`~.loader.WorkerSpec` (its ``cold`` method, ``data_dir``, ``paths``, ``s3``). What was
    done (see :func:`drop_pages`; for an S3 replay, nothing, with a note saying why), or None
    when the replay is not cold."""
    if not spec.cold:
        return None
    if getattr(spec, "s3", None) is not None:
        return {
            "method": "none",
            "files": 0,
            "seconds": 0.0,
            "filesystem": "s3",
            "source": f"s3://{spec.s3.bucket}/{spec.s3.prefix}",
            "resident_after_percent": None,
            "note": (
                "--cold: the replay reads objects from S3: nothing of them is in this host's page "
                "cache, and the object store's own caches cannot be dropped from here"
            ),
        }
    done = drop_pages(spec.data_dir, spec.paths, spec.cold, whole_cache=rank == 0)
    sync()
    return done
