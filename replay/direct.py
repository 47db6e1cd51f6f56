"""Direct and hybrid I/O in the replay (the model's ``reader.direct_io``).

With ``on`` every read of a dataset file goes through a file descriptor opened with
``O_DIRECT``; with ``hybrid`` a read call of at least ``reader.direct_io_threshold`` bytes does
(the call size: the sample's transfer size, or the whole sample when it is smaller), smaller
ones are buffered. The reads themselves are :func:`~.formats.pread_direct`'s: ``preadv`` into a
buffer from an anonymous mapping (page-aligned), the sample's byte range widened to
:data:`~.formats.DIRECT_ALIGN` boundaries (the start rounded down, the end up; the page size,
a multiple of every common logical block size, as DLIO's odirect reader aligns to 4096) and
read in transfers rounded up to it; only the sample's own bytes are counted.

It applies to ``--io posix``, and with ``--io library`` to npz and npy files, which are read
whole through ``O_DIRECT`` into that buffer then parsed from memory, as DLIO's odirect reader
does (hybrid: a file of at least the threshold); the other formats' libraries read through
their own buffered files, and a replay of them with ``--io library`` says so in a plain line. Where the file system refuses
``O_DIRECT`` (``EINVAL`` at open), the replay reads buffered and says so in a plain line
(:func:`direct_plan`); it never fails for it. Bytes.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from dlreplay.model import WorkloadModel

__all__ = ["direct_call", "direct_plan", "direct_refused", "fd_is_direct"]

#: This host's ``O_DIRECT`` bit (0 where the platform has none).
O_DIRECT = getattr(os, "O_DIRECT", 0)


def direct_call(mode: str, threshold: int, call_bytes: int) -> bool:
    """Whether a read call of *call_bytes* goes direct under ``direct_io`` *mode*."""
    return mode == "on" or (mode == "hybrid" and call_bytes >= threshold)


def direct_refused(path: str | Path) -> str | None:
    """Why *path* cannot be opened with ``O_DIRECT`` here (None: it can)."""
    if not O_DIRECT:
        return "this platform has no O_DIRECT"
    try:
        fd = os.open(path, os.O_RDONLY | O_DIRECT)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return f"the file system of {path} refuses O_DIRECT (EINVAL)"
        return None  # another failure is the reads' to report, naming the file
    os.close(fd)
    return None


def direct_plan(
    model: WorkloadModel, io: str, first_file: str | Path | None
) -> tuple[str, list[str]]:
    """The ``direct_io`` mode the replay's readers use and the plain lines that say where it
    differs from the model's (*io*: the replay's ``--io``; *first_file*: a dataset file)."""
    mode = model.reader.direct_io
    if mode == "off":
        return "off", []
    what = f"reader.direct_io {mode}" + (
        f" (threshold {model.reader.direct_io_threshold} bytes)" if mode == "hybrid" else ""
    )
    if model.storage is not None and model.storage.storage_type == "s3":
        return "off", [f"{what}: the replay reads S3 objects, where O_DIRECT has no meaning"]
    if io != "posix" and model.dataset.format not in ("npz", "npy"):
        return "off", [
            f"{what}: replayed by --io posix (O_DIRECT preads into aligned buffers), and for "
            f"npz/npy files; --io library reads {model.dataset.format} through its library, buffered"
        ]
    why = direct_refused(first_file) if first_file is not None else None
    if why is not None:
        return "off", [f"{what}: {why}; the replay reads buffered, unlike the job"]
    return mode, []


def fd_is_direct(fd: int) -> bool:
    """Whether the open file descriptor *fd* of this process has ``O_DIRECT`` set (its
    ``/proc/self/fdinfo`` flags)."""
    try:
        text = Path(f"/proc/self/fdinfo/{fd}").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags:"):
            return bool(int(line.split()[1], 8) & O_DIRECT)
    return False
