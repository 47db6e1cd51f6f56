"""Give the memory the allocators keep free back to the operating system, at stage boundaries.

dlreplay keeps polars' jemalloc on jemalloc's standard 10 s decay (see
:data:`dlreplay.JEMALLOC_CONF`): a load builds, frees and rebuilds column buffers within
a second, and returning freed pages at once made every reuse fault them in again. The price is that pages freed by one stage stay mapped while the next
allocates its own, often in another thread's arena (on up to 4 cores every thread shares
one: :data:`dlreplay.ONE_ARENA`), so the peak RSS of a whole analysis
was the live data plus everything freed in the seconds before. :func:`release_free_memory`
empties those caches where a stage ends (the parse before the merge, the load before the
passes, each pass): ``arena.<i>.purge`` of polars' jemalloc, and ``malloc_trim`` of the C
library (numpy's arrays) where it has one. Within a stage nothing changes.

One jemalloc arena is left alone: the one that serves every thread's blocks of 8 MiB and
more (``opt.oversize_threshold``: whole columns of a few million rows). Being shared, what
one stage frees there the next reuses from any thread, so purging it bought no lower peak,
only page faults (measured on the ingest benchmark: ``benchmarks/RESULTS.md``). The
per-thread arenas of smaller blocks (the parse batches' columns, which one thread frees and
another never reuses) are the ones emptied.

polars does not export its jemalloc's ``mallctl``; the function is found in its runtime
library's own symbol table (``.symtab``) and used only after its machine code in memory
is checked to be the bytes of that symbol in the file. Where any step fails (another
allocator, a stripped library, another platform) nothing is called and the analysis
simply keeps more memory; ``DLREPLAY_RELEASE_MEMORY=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import struct
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["RELEASE_ENV", "prepare_release", "release_free_memory", "releaser_available"]

#: Set to ``0`` to never purge (for comparisons; results do not depend on it).
RELEASE_ENV = "DLREPLAY_RELEASE_MEMORY"
#: jemalloc's ``MALLCTL_ARENAS_ALL``: ``arena.4096.purge`` purges every arena.
_ARENAS_ALL = 4096
_MALLCTL = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_size_t,
)
_SHT_SYMTAB = 2
_STT_FUNC = 2
_SYM = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYM_DTYPE = np.dtype(
    [
        ("name", "<u4"),
        ("info", "u1"),
        ("other", "u1"),
        ("shndx", "<u2"),
        ("value", "<u8"),
        ("size", "<u8"),
    ]
)

_lock = threading.Lock()
_resolved = False
_mallctl: Any = None
_trim: Any = None
#: the ``arena.<i>.purge`` names of every arena but the one of large blocks (``keep_large``)
_purges: list[bytes] = []
_PURGE_ALL = [f"arena.{_ARENAS_ALL}.purge".encode()]


def _symbols(
    path: str, wanted: tuple[bytes, ...], at: dict[bytes, int] | None = None
) -> dict[bytes, tuple[int, int, int, int]]:
    """(value, size, file offset, index in the table) of the function symbols ``wanted`` in
    the ``.symtab`` of the 64-bit little-endian ELF file ``path`` (empty where it has none).

    ``at``: where each symbol was found before (its index): only those entries are read
    and checked (their names, read from the file's string table, must be the wanted
    ones), instead of searching the whole table."""
    found: dict[bytes, tuple[int, int, int, int]] = {}
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
            count = min(sec[5], len(mm) - sec[4]) // _SYM.size
            if at is not None:
                entries = [
                    (k, name, _SYM.unpack_from(mm, sec[4] + k * _SYM.size))
                    for name, k in at.items()
                    if name in wanted and 0 <= k < count
                ]
                # each entry must name its symbol (the name's bytes and its end, in the file)
                entries = [
                    (k, name, e)
                    for k, name, e in entries
                    if mm[s0 + e[0] : min(s0 + e[0] + len(name) + 1, s1)] == name + b"\0"
                ]
            else:
                names: dict[int, bytes] = {}
                for name in wanted:
                    hit = mm.find(b"\0" + name + b"\0", s0, s1)
                    if hit >= 0:
                        names[hit + 1 - s0] = name
                if not names:
                    continue
                # a copy of the symbol table (a few MB), not a view of the mapping:
                # a view held past this loop (a sampling profiler's frame of np.isin, as Dask's
                # workers run one) made the mapping's close raise BufferError
                table = np.frombuffer(mm[sec[4] : sec[4] + count * _SYM.size], dtype=_SYM_DTYPE)
                entries = [
                    (int(k), names[int(table["name"][k])], tuple(int(x) for x in table[k].tolist()))
                    for k in np.flatnonzero(np.isin(table["name"], list(names)))
                ]
                del table
            for k, name, (_st_name, info, _other, shndx, value, size) in entries:
                if info & 0xF == _STT_FUNC and 0 < shndx < shnum and size:
                    code = secs[shndx]
                    found[name] = (value, size, value - code[3] + code[4], k)
        return found


_ANCHOR = b"PyInit__polars_runtime"
_WANTED = (b"_rjem_mallctl", _ANCHOR)


def _cache_file() -> Path:
    """Where :func:`_find_mallctl` keeps where it found its symbols in each runtime library."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dlreplay" / "jemalloc-symbols.json"


def _file_key(path: str) -> str:
    """The identity of the library file ``path``: any rebuild or reinstall changes it."""
    st = os.stat(path)
    return f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def _still_there(key: str) -> bool:
    """Whether the library file a cache ``key`` names is still the file it was."""
    try:
        return _file_key(key.rsplit(":", 3)[0]) == key
    except (OSError, ValueError):
        return False


def _kept_indices(key: str) -> dict[bytes, int] | None:
    """The symbol table indices of :data:`_WANTED` found before in the file of ``key``, or
    None (none kept, or unreadable). Only a hint: :func:`_symbols` checks them in the file."""
    try:
        kept = json.loads(_cache_file().read_text()).get(key)
        return {name: int(kept[name.decode()]) for name in _WANTED}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _keep_symbols(key: str, syms: dict[bytes, tuple[int, int, int, int]]) -> None:
    """Keep the table indices of ``syms`` for the file of ``key`` (the cache file is written
    whole or not at all; errors are ignored: the next process searches the table again)."""
    target = _cache_file()
    tmp: str | None = None
    try:
        try:
            kept = json.loads(target.read_text())
            kept = kept if isinstance(kept, dict) else {}
        except (OSError, ValueError):
            kept = {}
        # only entries of library files still there as they were (a reinstalled polars, a
        # deleted virtual environment: their entries would only pile up)
        kept = {k: v for k, v in kept.items() if k != key and _still_there(k)}
        kept[key] = {name.decode(): v[3] for name, v in syms.items()}
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".jemalloc-symbols.")
        with os.fdopen(fd, "w") as fh:
            json.dump(kept, fh)
        os.replace(tmp, target)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _find_mallctl() -> Any:
    """polars' jemalloc ``mallctl`` as a ctypes function, or None.

    The symbol table of polars' runtime library is tens of MB: searching it was a
    noticeable part of every process's first load. What it
    finds is kept per library file (path, size, mtime, inode) in the user's cache
    directory as the symbols' indices in the table: the next process reads those two
    entries and checks their names in the file (and, as always, that the code at the
    address is the bytes the file holds there); if any check fails it searches again.
    """
    runtime = sys.modules.get("polars._plr")
    path = getattr(runtime, "__file__", None)
    if not path or not path.endswith(".so") or not sys.platform.startswith("linux"):
        return None
    key = _file_key(path)
    hint = _kept_indices(key)
    fn = _checked_mallctl(path, _symbols(path, _WANTED, hint)) if hint is not None else None
    if fn is None:
        syms = _symbols(path, _WANTED)
        fn = _checked_mallctl(path, syms)
        if fn is not None:
            _keep_symbols(key, syms)
    return fn


def _checked_mallctl(path: str, syms: dict[bytes, tuple[int, int, int, int]]) -> Any:
    """``mallctl`` at the place ``syms`` give in the loaded library ``path``, or None where
    that is not the code the file holds for it, or not jemalloc 5."""
    if len(syms) != 2:
        return None
    lib = ctypes.CDLL(path)  # the library already loaded: dlopen returns its handle
    bias = ctypes.cast(getattr(lib, _ANCHOR.decode()), ctypes.c_void_p).value
    if bias is None:
        return None
    bias -= syms[_ANCHOR][0]
    value, _size, offset, _k = syms[b"_rjem_mallctl"]
    with open(path, "rb") as fh:
        fh.seek(offset)
        expected = fh.read(32)
    if len(expected) != 32 or ctypes.string_at(bias + value, 32) != expected:
        return None  # not the code the symbol table describes: never call it
    fn = _MALLCTL(bias + value)
    version = ctypes.c_char_p()
    size = ctypes.c_size_t(ctypes.sizeof(version))
    if (
        fn(b"version", ctypes.byref(version), ctypes.byref(size), None, 0) != 0
        or not (version.value or b"")[:2] == b"5."
    ):
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


def _read(fn: Any, name: bytes, ctype: Any) -> int | None:
    """The integer setting ``name`` through ``mallctl`` ``fn``, or None where it has none."""
    value = ctype()
    size = ctypes.c_size_t(ctypes.sizeof(value))
    if fn(name, ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
        return None
    return int(value.value)


def _purge_names(fn: Any) -> list[bytes]:
    """``arena.<i>.purge`` for every arena of ``mallctl`` ``fn`` except jemalloc's arena of
    large blocks: it exists when ``opt.oversize_threshold`` is set, created after the
    ``opt.narenas`` automatic arenas (index ``opt.narenas``); else ``arena.<all>.purge``."""
    oversize = _read(fn, b"opt.oversize_threshold", ctypes.c_size_t)
    auto = _read(fn, b"opt.narenas", ctypes.c_uint)
    total = _read(fn, b"arenas.narenas", ctypes.c_uint)
    if not oversize or auto is None or total is None or total <= auto:
        return _PURGE_ALL
    return [f"arena.{i}.purge".encode() for i in range(total) if i != auto]


def _resolve() -> None:
    global _resolved, _mallctl, _trim, _purges
    with _lock:
        if _resolved:
            return
        try:
            _mallctl = _find_mallctl()
            if _mallctl is not None:
                _purges = _purge_names(_mallctl)
        except (OSError, ValueError, BufferError, struct.error):
            _mallctl = None
        _trim = _find_trim()
        _resolved = True


def releaser_available() -> tuple[bool, bool]:
    """(jemalloc purge, malloc_trim): which of the two :func:`release_free_memory` can call."""
    _resolve()
    return _mallctl is not None, _trim is not None


def prepare_release() -> None:
    """Find the allocators' functions now (once per process; slower where the search's
    result is not kept yet, see :func:`_find_mallctl`). Searching for ``mallctl`` maps
    polars' runtime library and reads its symbol table: its file pages count in the RSS
    for a moment. A load calls this before it parses, while little memory is in use;
    found at the first release instead, inside a load, those pages raised the load's
    peak."""
    if os.environ.get(RELEASE_ENV, "1") != "0":
        _resolve()


def release_free_memory(*, keep_large: bool = False) -> None:
    """Return the free pages polars' jemalloc and the C library's malloc keep to the OS.

    ``keep_large``: all but jemalloc's shared arena of large blocks (see the module's doc),
    between the steps of one stage whose next step builds columns like those just freed
    (the steps of a load); a stage's end returns everything.

    Costs a few milliseconds (and the page faults of memory reused later); a no-op where
    the allocators cannot be reached or ``DLREPLAY_RELEASE_MEMORY=0``. Call it where a
    stage has dropped what it built, not inside a loop.
    """
    if os.environ.get(RELEASE_ENV, "1") == "0":
        return
    _resolve()
    if _mallctl is not None:
        for name in _purges if keep_large else _PURGE_ALL:
            _mallctl(name, None, None, None, 0)
    if _trim is not None:
        _trim(0)
