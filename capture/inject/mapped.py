"""Memory-mapped data hooks injected into a captured job: which files are mapped and which
windows of them the job touches, as DFTracer AI-convention ``data`` events.

A hook family of :mod:`capture.inject.hooks` (see its ``EXTENSIONS``): in the job this file is
the top-level module ``_dlreplay_mapped``. Self-contained like the core.

DFTracer's preload sees ``mmap`` calls but not the page faults that read a mapped file: a job
that reads its data through a mapping shows no read at all. These hooks record it instead:

=====  ==========  ======================================================================
cat    name        meaning (args)
=====  ==========  ======================================================================
data   io.mmap     a read-only mapping made: ``np.memmap`` (modes ``r``, ``c``, ``r+``) or
                   ``torch.from_file`` (``path``; ``offset``: file offset of the mapped
                   array, bytes; ``bytes``: its size)
data   io.window   a piece of a mapped file taken by the job: ``path``; ``offset``: file offset
                   of its first byte; ``bytes``: from its first to its last byte; ``cold``:
                   pages of it not resident in the page cache when taken (``mincore(2)``),
                   which a touch of it faults in from storage. From: a basic slice of an
                   ``np.memmap`` (a view), each run of consecutive rows an integer-array index
                   of its first axis copies out (``data[ix[:, None] + np.arange(n)]``,
                   ``data[[3, 4, 5]]``; cold measured before the copy), a slice or ``read`` of
                   an ``mmap.mmap`` of a file (its ``io.mmap`` written at its first read)
=====  ==========  ======================================================================

What it measures: the pieces the job *takes* of a mapping (their offsets and sizes, the unit
the job reads in), and how many of their pages storage must supply at that moment (page
residency of the piece's pages, ``mincore``: unprivileged, one system call a piece). A slice
taken and never touched still counts. Not seen: boolean masks and indexes of other axes
(``data[mask]``, ``data[:, idx]``), gathers of more than :data:`MAX_RUNS` runs (a miss),
``np.take``, single bytes and searches of an ``mmap.mmap`` (``m[i]``, ``find``, ``readline``),
its buffer (``np.frombuffer(m)``, ``memoryview(m)``: Megatron's indexed datasets) and tensors
of ``torch.from_file`` (only the mapping is recorded). ``mmap.mmap`` is a built-in type whose
methods cannot be patched: the module's ``mmap`` becomes a subclass with the same name, repr,
pickling error and behaviour (``isinstance`` holds both ways for maps made after the hooks are
installed, at interpreter start). Every hook calls the original once with the job's arguments
and returns its result; what it cannot measure is counted as a miss.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import sys
from collections.abc import Callable
from typing import Any

try:  # dlreplay's own process: the package capture.inject
    from . import hooks as core
except ImportError:  # in the job: top-level modules beside each other
    import _dlreplay_hooks as core  # type: ignore[no-redef]

PAGE = mmap.PAGESIZE
#: Runs of rows an integer-array index of a memmap may copy and still be recorded, one window
#: each (a scattered gather beyond it is a miss: one event per element would cost more than it)
MAX_RUNS = 4096
_READ_MODES = ("r", "c", "r+", "readonly", "copyonwrite", "readwrite")


class _Residency:
    """``mincore(2)`` through ctypes: pages of an address range not resident (None: unknown)."""

    def __init__(self) -> None:
        self._fn: Any = None
        try:
            fn = ctypes.CDLL(None, use_errno=True).mincore
        except (AttributeError, OSError):
            return
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self._fn = fn

    def cold_pages(self, start: int, end: int) -> int | None:
        """Pages of ``[start, end)`` (addresses inside one mapping) not in the page cache."""
        if self._fn is None or end <= start:
            return None
        first = start - start % PAGE
        n = (end - first + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * n)()
        if self._fn(first, n * PAGE, vec) != 0:
            return None
        return n - sum(b & 1 for b in bytes(vec))


RESIDENCY = _Residency()


def _root(arr: Any) -> tuple[str, int, int, int] | None:
    """(path, file offset of the mapped array's first byte, its address, its bytes) of an ``np.memmap``
    made from a file, kept on the mapping object all its views share (``_mmap``)."""
    mm = getattr(arr, "_mmap", None)
    return _ROOTS.get(id(mm)) if mm is not None else None


#: id(mapping object) -> (path, file offset of the array's first byte, the array's address, its
#: bytes); a new mapping under the id of a dead one replaces it when it is made
_ROOTS: dict[int, tuple[str, int, int, int]] = {}
_MAX_ROOTS = 4096


def _record_map(arr: Any) -> None:
    mode = getattr(arr, "mode", None)
    name = getattr(arr, "filename", None)
    mm = getattr(arr, "_mmap", None)
    if isinstance(name, os.PathLike):  # numpy keeps a pathlib.Path as it was given
        name = os.fspath(name)
    if mm is None or mode not in _READ_MODES or not isinstance(name, str):
        return
    if len(_ROOTS) >= _MAX_ROOTS:
        _ROOTS.clear()  # only live mappings matter; they are re-learnt at their next slice
    addr = int(arr.__array_interface__["data"][0])
    offset = int(getattr(arr, "offset", 0) or 0)
    _ROOTS[id(mm)] = (name, offset, addr, int(arr.nbytes))
    handle = core.REGIONS.begin("io.mmap", "data", path=name, offset=offset, bytes=int(arr.nbytes))
    core.REGIONS.end(handle)


def _record_window(parent: Any, view: Any) -> None:
    root = _root(parent)
    if root is None or not hasattr(view, "__array_interface__"):
        return
    if getattr(view, "size", 0) == 0:
        return
    path, offset, addr, nbytes = root
    lo, hi = _byte_bounds(view)
    if lo < addr or hi > addr + nbytes:  # a copy (fancy indexing), not a view of the mapping
        return
    cold = RESIDENCY.cold_pages(lo, hi)
    handle = core.REGIONS.begin("io.window", "data", path=path, offset=offset + lo - addr)
    core.REGIONS.end(handle, bytes=hi - lo, cold=cold)


def _byte_bounds(a: Any) -> tuple[int, int]:
    """[first, last + 1) byte addresses of the array *a* (numpy's ``byte_bounds``)."""
    ai = a.__array_interface__
    low = high = int(ai["data"][0])
    strides = ai.get("strides")
    item = a.dtype.itemsize
    if strides is None:
        return low, low + a.size * item
    for dim, stride in zip(ai["shape"], strides, strict=True):
        if stride < 0:
            low += (dim - 1) * stride
        else:
            high += (dim - 1) * stride
    return low, high + item


def _wrap_new(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __new__(subtype: Any, *args: Any, **kwargs: Any) -> Any:
        arr = orig(subtype, *args, **kwargs)
        core.guard("np.memmap", _record_map, arr)
        return arr

    return __new__


def _fancy_runs(arr: Any, index: Any) -> list[tuple[str, int, int, int | None]] | None:
    """The windows an integer-array index of *arr*'s first axis copies out (``data[idx]``,
    ``data[ix[:, None] + np.arange(n)]``): per run of consecutive rows, (path, file offset,
    bytes, cold pages), cold measured now, before the copy faults them in. None for any other
    index (basic slices are views: :func:`_record_window` sees them)."""
    np = sys.modules["numpy"]
    if not isinstance(index, (list, np.ndarray)):
        return None
    root = _root(arr)
    if root is None or not arr.flags.c_contiguous or arr.ndim == 0 or arr.shape[0] == 0:
        return None
    idx = np.asarray(index)  # a list is read, never changed; an array is used as it is
    if idx.dtype.kind not in "iu" or idx.size == 0:
        return None  # boolean masks, objects: not recorded
    n = arr.shape[0]
    if (
        idx.ndim >= 1
        and idx.shape[-1] > 1
        and idx.min() >= 0
        and bool((np.diff(idx, axis=-1) == 1).all())
    ):  # each last-axis row of the index one run of rows: no sort needed
        starts = idx[..., 0].ravel().astype(np.int64)
        ends = starts + idx.shape[-1]
    else:
        rows = np.unique(np.where(idx < 0, idx + n, idx).ravel().astype(np.int64))
        cut = np.flatnonzero(np.diff(rows) != 1) + 1
        starts, ends = rows[np.r_[0, cut]], rows[np.r_[cut - 1, rows.size - 1]] + 1
    if starts.min() < 0 or ends.max() > n:
        return None  # out of bounds: the job's own call raises IndexError
    if starts.size > MAX_RUNS:
        core.MISSES.add("np.memmap index", f"a gather of more than {MAX_RUNS} runs of rows")
        return None
    path, offset, addr, _ = root
    row = int(arr.strides[0])
    base = int(arr.__array_interface__["data"][0])
    out = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        lo = base + a * row
        out.append(
            (path, offset + lo - addr, (b - a) * row, RESIDENCY.cold_pages(lo, lo + (b - a) * row))
        )
    return out


def _record_runs(runs: list[tuple[str, int, int, int | None]]) -> None:
    for path, offset, nbytes, cold in runs:
        handle = core.REGIONS.begin("io.window", "data", path=path, offset=offset)
        core.REGIONS.end(handle, bytes=nbytes, cold=cold)


def _wrap_getitem(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __getitem__(self: Any, index: Any) -> Any:
        runs = core.guard("np.memmap index", _fancy_runs, self, index) if _ROOTS else None
        res = orig(self, index)
        if runs:
            core.guard("np.memmap index", _record_runs, runs)
        elif _ROOTS:
            core.guard("np.memmap slice", _record_window, self, res)
        return res

    return __getitem__


def _patch_numpy(mod: Any) -> None:
    cls = getattr(mod, "memmap", None)
    if cls is None or getattr(cls, "_dlreplay_mapped", False):
        return
    cls.__new__ = staticmethod(_wrap_new(cls.__new__))
    cls.__getitem__ = _wrap_getitem(cls.__getitem__)
    cls._dlreplay_mapped = True


def _record_from_file(args: tuple[Any, ...], kwargs: dict[str, Any], tensor: Any) -> None:
    name = args[0] if args else kwargs.get("filename")
    if not isinstance(name, (str, os.PathLike)):
        return
    nbytes = int(tensor.numel()) * int(tensor.element_size())
    handle = core.REGIONS.begin("io.mmap", "data", path=os.fsdecode(name), offset=0, bytes=nbytes)
    core.REGIONS.end(handle)


def _patch_torch(mod: Any) -> None:
    orig = getattr(mod, "from_file", None)
    if orig is None or getattr(orig, "_dlreplay_mapped", False):
        return

    @functools.wraps(orig)
    def from_file(*args: Any, **kwargs: Any) -> Any:
        tensor = orig(*args, **kwargs)
        core.guard("torch.from_file", _record_from_file, args, kwargs, tensor)
        return tensor

    from_file._dlreplay_mapped = True  # type: ignore[attr-defined]
    mod.from_file = from_file


# ------------------------------------------------------------------ mmap.mmap used directly


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (the fields up to ``internal``); ``obj`` as a bare pointer, so
    ctypes never touches its reference count (``PyBuffer_Release`` does)."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


def _address(obj: Any) -> int:
    """The address of *obj*'s buffer (a read-only mapping included), its export released at once."""
    api = ctypes.pythonapi
    view = _PyBuffer()
    if api.PyObject_GetBuffer(ctypes.py_object(obj), ctypes.byref(view), 0) != 0:
        raise ValueError("no buffer")
    try:
        return int(view.buf or 0)
    finally:
        api.PyBuffer_Release(ctypes.byref(view))


#: id(mmap.mmap object) -> [path, file offset of the mapping, its bytes, io.mmap written]: file
#: mappings made by the job (np.memmap's own are never sliced through the mmap object)
_MMAPS: dict[int, list[Any]] = {}


def _record_mmap(m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    fileno = args[0] if args else kwargs.get("fileno", -1)
    if not isinstance(fileno, int) or fileno < 0:
        return  # anonymous memory, no file
    offset = kwargs.get("offset", args[5] if len(args) > 5 else 0)
    path = os.readlink(f"/proc/self/fd/{fileno}")
    if not path.startswith("/") or path.endswith(" (deleted)"):
        return  # a pipe, a socket, an unlinked file (multiprocessing's heap): no file to name
    if len(_MMAPS) >= _MAX_ROOTS:
        _MMAPS.clear()
    _MMAPS[id(m)] = [path, int(offset or 0), len(m), False]


def _record_mm_read(m: Any, start: int, stop: int) -> tuple[Any, ...] | None:
    """(the mapping's entry, file offset, bytes, cold pages) of bytes [start, stop) of *m*,
    measured before they are copied out; None when *m* is not a recorded file mapping."""
    entry = _MMAPS.get(id(m))
    if entry is None or stop <= start or m.closed:
        return None
    addr = _address(m)
    return entry, entry[1] + start, stop - start, RESIDENCY.cold_pages(addr + start, addr + stop)


def _mm_slice(m: Any, key: slice) -> tuple[Any, ...] | None:
    if id(m) not in _MMAPS or m.closed:
        return None
    start, stop, step = key.indices(len(m))
    if step < 0:
        start, stop = stop + 1, start + 1
    return _record_mm_read(m, start, stop)


def _mm_read(m: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    if id(m) not in _MMAPS or m.closed:
        return None
    n = args[0] if args else None
    pos, size = m.tell(), len(m)
    stop = size if n is None or n < 0 else min(size, pos + int(n))
    return _record_mm_read(m, pos, stop)


def _emit_mm(taken: tuple[Any, ...]) -> None:
    entry, offset, nbytes, cold = taken
    if not entry[3]:  # the mapping, once, at its first read
        entry[3] = True
        handle = core.REGIONS.begin(
            "io.mmap", "data", path=entry[0], offset=entry[1], bytes=entry[2]
        )
        core.REGIONS.end(handle)
    handle = core.REGIONS.begin("io.window", "data", path=entry[0], offset=offset)
    core.REGIONS.end(handle, bytes=nbytes, cold=cold)


def _patch_mmap(mod: Any) -> None:
    """``mmap.mmap`` becomes a subclass (a built-in type's methods cannot be patched) that
    records its slices (``m[a:b]``) and ``read``s of file mappings. It looks and behaves as
    the built-in: same name, repr and pickling error; single bytes (``m[i]``), ``find``,
    ``readline`` and the buffer (``np.frombuffer(m)``, ``memoryview(m)``) are not recorded."""
    base = mod.mmap
    if getattr(base, "_dlreplay_mapped", False):
        return

    class mmap(base):  # type: ignore[misc, valid-type]
        __slots__ = ()
        _dlreplay_mapped = True

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            m = base.__new__(cls, *args, **kwargs)
            core.guard("mmap.mmap", _record_mmap, m, args, kwargs)
            return m

        def __getitem__(self, key: Any) -> Any:
            taken = (
                core.guard("mmap.mmap slice", _mm_slice, self, key)
                if type(key) is slice and _MMAPS
                else None
            )
            res = base.__getitem__(self, key)
            if taken:
                core.guard("mmap.mmap slice", _emit_mm, taken)
            return res

        def read(self, *args: Any) -> Any:
            taken = core.guard("mmap.mmap read", _mm_read, self, args) if _MMAPS else None
            res = base.read(self, *args)
            if taken:
                core.guard("mmap.mmap read", _emit_mm, taken)
            return res

        def __repr__(self) -> str:
            text = base.__repr__(self)
            return "<mmap.mmap" + text[5:] if text.startswith("<mmap ") else text

        def __reduce_ex__(self, protocol: Any) -> Any:
            raise TypeError("cannot pickle 'mmap.mmap' object")

    mmap.__module__ = base.__module__
    mmap.__qualname__ = base.__qualname__
    mmap.__doc__ = base.__doc__
    mod.mmap = mmap


core.add_patch("numpy", _patch_numpy)
core.add_patch("mmap", _patch_mmap)
core.add_patch("torch", _patch_torch)
