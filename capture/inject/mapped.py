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
data   io.window   a slice taken of a mapped array (basic indexing, a view of the mapping):
                   ``path``; ``offset``: file offset of its first byte; ``bytes``: from its
                   first to its last byte; ``cold``: pages of it not resident in the page
                   cache when the slice was taken (``mincore(2)``), which a touch of the
                   window faults in from storage
=====  ==========  ======================================================================

What it measures: the windows the job *takes* of a mapping (their offsets and sizes, the unit
the job reads in), and how many of their pages storage must supply at that moment (page
residency of the window's pages, ``mincore``: unprivileged, one system call a window). A
window taken and never touched still counts; pages touched through other views (fancy indexing
copies, ``mmap.mmap`` objects used directly, tensors of ``torch.from_file`` sliced in C++) are
not seen, only the mapping is. Every hook calls the original once with the job's arguments and
returns its result; what it cannot measure is counted as a miss.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
from collections.abc import Callable
from typing import Any

try:  # dlreplay's own process: the package capture.inject
    from . import hooks as core
except ImportError:  # in the job: top-level modules beside each other
    import _dlreplay_hooks as core  # type: ignore[no-redef]

PAGE = mmap.PAGESIZE
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


def _wrap_getitem(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def __getitem__(self: Any, index: Any) -> Any:
        res = orig(self, index)
        if _ROOTS:
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


core.add_patch("numpy", _patch_numpy)
core.add_patch("torch", _patch_torch)
