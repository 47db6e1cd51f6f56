"""Give the memory the allocators keep free back to the operating system, at stage boundaries.

dlreplay keeps polars' jemalloc on jemalloc's standard 10 s decay (see
:data:`dlreplay.JEMALLOC_CONF`): a load builds, frees and rebuilds column buffers within
a second, and returning freed pages at once made every reuse fault them in again (a fifth
of the CPU time). The price is that pages freed by one stage stay mapped while the next
allocates its own, often in another thread's arena, so the peak RSS of a whole analysis
was the live data plus everything freed in the seconds before. :func:`release_free_memory`
empties those caches where a stage ends (the parse before the merge, the load before the
passes, each pass): ``arena.<all>.purge`` of polars' jemalloc, and ``malloc_trim`` of the C
library (numpy's arrays) where it has one. Within a stage nothing changes.

polars does not export its jemalloc's ``mallctl``; the function is found in its runtime
library's own symbol table (``.symtab``) and used only after its machine code in memory
is checked to be the bytes of that symbol in the file. Where any step fails (another
allocator, a stripped library, another platform) nothing is called and the analysis
simply keeps more memory; ``DLREPLAY_RELEASE_MEMORY=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import sys
import threading
from typing import Any

import numpy as np

__all__ = ["RELEASE_ENV", "prepare_release", "release_free_memory", "releaser_available"]

#: Set to ``0`` to never purge (for comparisons; results do not depend on it).
RELEASE_ENV = "DLREPLAY_RELEASE_MEMORY"
#: jemalloc's ``MALLCTL_ARENAS_ALL``: ``arena.4096.purge`` purges every arena.
_ARENAS_ALL = 4096
_MALLCTL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_size_t)
_SHT_SYMTAB = 2
_STT_FUNC = 2
_SYM = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYM_DTYPE = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"),
                       ("size", "<u8")])

_lock = threading.Lock()
_resolved = False
_mallctl: Any = None
_trim: Any = None


def _symbols(path: str, wanted: tuple[bytes, ...]) -> dict[bytes, tuple[int, int, int]]:
    """(value, size, file offset) of the function symbols ``wanted`` in the ``.symtab`` of the
    64-bit little-endian ELF file ``path`` (empty where it has none)."""
    found: dict[bytes, tuple[int, int, int]] = {}
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:6] != b"\x7fELF\x02\x01":
            return found
        shoff = struct.unpack_from("<Q", mm, 0x28)[0]
        shentsize, shnum = struct.unpack_from("<HH", mm, 0x3A)
        if shentsize != _SECTION.size or shoff + shnum * shentsize > len(mm):
            return found
        secs = [_SECTION.unpack_from(mm, shoff + i * shentsize) for i in range(shnum)]
        for sec in secs:
            if sec[1] != _SHT_SYMTAB or sec[9] != _SYM.size or sec[6] >= shnum:
                continue
            strtab = secs[sec[6]]
            s0, s1 = strtab[4], strtab[4] + strtab[5]
            names: dict[int, bytes] = {}
            for name in wanted:
                at = mm.find(b"\0" + name + b"\0", s0, s1)
                if at >= 0:
                    names[at + 1 - s0] = name
            if not names:
                continue
            # a copy of the symbol table (4.7 MB for polars 1.x), not a view of the mapping: a
            # view held past this loop (a sampling profiler's frame of np.isin, as Dask's
            # workers run one) made the mapping's close raise BufferError
            table = np.frombuffer(mm[sec[4]:sec[4] + (sec[5] // _SYM.size) * _SYM.size], dtype=_SYM_DTYPE)
            for k in np.flatnonzero(np.isin(table["name"], list(names))):
                st_name, info, _other, shndx, value, size = (int(x) for x in table[k].tolist())
                if info & 0xF == _STT_FUNC and 0 < shndx < shnum and size:
                    code = secs[shndx]
                    found[names[st_name]] = (value, size, value - code[3] + code[4])
            del table
        return found


def _find_mallctl() -> Any:
    """polars' jemalloc ``mallctl`` as a ctypes function, or None."""
    runtime = sys.modules.get("polars._plr")
    path = getattr(runtime, "__file__", None)
    if not path or not path.endswith(".so") or not sys.platform.startswith("linux"):
        return None
    anchor = b"PyInit__polars_runtime"
    syms = _symbols(path, (b"_rjem_mallctl", anchor))
    if len(syms) != 2:
        return None
    lib = ctypes.CDLL(path)  # the library already loaded: dlopen returns its handle
    bias = ctypes.cast(getattr(lib, anchor.decode()), ctypes.c_void_p).value
    if bias is None:
        return None
    bias -= syms[anchor][0]
    value, _size, offset = syms[b"_rjem_mallctl"]
    with open(path, "rb") as fh:
        fh.seek(offset)
        expected = fh.read(32)
    if len(expected) != 32 or ctypes.string_at(bias + value, 32) != expected:
        return None  # not the code the symbol table describes: never call it
    fn = _MALLCTL(bias + value)
    version = ctypes.c_char_p()
    size = ctypes.c_size_t(ctypes.sizeof(version))
    if fn(b"version", ctypes.byref(version), ctypes.byref(size), None, 0) != 0 or not (version.value or b"")[:2] == b"5.":
        return None
    return fn


def _find_trim() -> Any:
    """The C library's ``malloc_trim`` (glibc), or None."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def _resolve() -> None:
    global _resolved, _mallctl, _trim
    with _lock:
        if _resolved:
            return
        try:
            _mallctl = _find_mallctl()
        except (OSError, ValueError, BufferError, struct.error):
            _mallctl = None
        _trim = _find_trim()
        _resolved = True


def releaser_available() -> tuple[bool, bool]:
    """(jemalloc purge, malloc_trim): which of the two :func:`release_free_memory` can call."""
    _resolve()
    return _mallctl is not None, _trim is not None


def prepare_release() -> None:
    """Find the allocators' functions now (once per process, ~50 ms). Finding ``mallctl``
    maps polars' runtime library and reads its symbol table: about 40 MB of file pages
    count in the RSS for those milliseconds. A load calls this before it parses, while
    little memory is in use; found at the first release instead, inside a single-file
    load on 2 cores, those pages were the load's peak (+18 bytes an event)."""
    if os.environ.get(RELEASE_ENV, "1") != "0":
        _resolve()


def release_free_memory() -> None:
    """Return the free pages polars' jemalloc and the C library's malloc keep to the OS.

    Costs a few milliseconds (and the page faults of memory reused later); a no-op where
    the allocators cannot be reached or ``DLREPLAY_RELEASE_MEMORY=0``. Call it where a
    stage has dropped what it built, not inside a loop.
    """
    if os.environ.get(RELEASE_ENV, "1") == "0":
        return
    _resolve()
    if _mallctl is not None:
        _mallctl(f"arena.{_ARENAS_ALL}.purge".encode(), None, None, None, 0)
    if _trim is not None:
        _trim(0)
