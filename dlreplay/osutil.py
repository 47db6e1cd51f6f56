"""Small operating-system helpers every stage shares: atomic writes, host memory."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_text", "host_memory_bytes"]


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write *text* to *path* atomically (temporary file in the same folder, fsync, rename).

    An interrupted write leaves the old file (or none), never a half-written one. The
    file gets the usual mode (0666 minus the umask), not mkstemp's 0600.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def host_memory_bytes() -> int:
    """Physical memory of this host in bytes (``os.sysconf``), 0 if unknown."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0
