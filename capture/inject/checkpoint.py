"""Checkpoint hooks injected into a captured job: DFTracer ``checkpoint`` events
(``capture`` for a save, ``restart`` for a load; args ``path``, ``bytes``).

A hook family of :mod:`capture.inject.hooks` (see its ``EXTENSIONS``): in the job this file is
the top-level module ``_dlreplay_checkpoint``, in dlreplay's own process
``dlreplay.capture.inject.checkpoint``. Self-contained like the core: imports nothing of
dlreplay but the core hooks module. Every hook calls the original exactly once with the job's
arguments and returns its result or raises its exception; what it cannot measure is a miss.

What is recorded:

* ``torch.save`` / ``torch.load`` (``torch.serialization`` too): one event per call; ``path``
  the file (or the stream's name when it is one); ``bytes`` the file's size, a stream's
  advance, what a ``BytesIO`` holds past its position. A pipe or another stream that cannot
  seek is never asked to (``tell()`` raises on DCP's streams and sockets): its event has no
  ``bytes`` and the call is a miss ("unseekable stream").
* ``torch.distributed.checkpoint`` (DCP) ``save`` / ``load`` (and the deprecated
  ``save_state_dict`` / ``load_state_dict``): one event per call and rank, ``path`` the
  checkpoint directory (absolute), ``bytes`` what this rank's ``FileSystemWriter`` wrote
  (its shard files ``__<rank>_<n>.distcp``, plus ``.metadata`` on the coordinator, from
  DCP's own write results: no extra I/O) or what its ``FileSystemReader`` read (the
  lengths of the items of its load plan, plus ``.metadata``). The POSIX events under the
  event carry each file, its write calls and fsync. Another storage writer or reader has no
  ``bytes`` (a miss, "unknown target"); analyze then takes the POSIX transfers inside the
  event. ``io_us``: the microseconds this rank spent in its ``FileSystemWriter``'s
  ``write_data`` (until its future was done) and ``finish``, or its ``FileSystemReader``'s
  ``read_data`` and ``read_metadata``: the writing and reading of the files (with the tensors'
  copies into them), so that distill can tell them from the save's planning and pickling and
  its ranks' collectives when the checkpoint directory was not traced. A save through a
  ``FileSystemWriter`` also has ``fsync`` (its ``sync_files``: 1 when DCP fsyncs each file)
  and, on the rank that wrote it, ``metadata_bytes`` (the ``.metadata`` file's size, part of
  ``bytes``): what the POSIX events would show of the files when their directory is not
  traced. ``async_save`` is not an event: its writes run on a background thread after the
  call returns; its POSIX events are in the trace.
* Inside a DCP call, the ``torch.save`` / ``torch.load`` / ``pickle`` calls DCP makes for each
  tensor and for ``.metadata`` are parts of the DCP event, not events (nor misses) of their own.
* ``pickle`` and ``numpy`` (``pickle.dump``/``load``, ``np.save``/``savez``/``load``) are
  not checkpoint events: ``np.load`` and ``pickle.load`` are how datasets are read, and
  ``np.save``/``np.savez`` how jobs write their datasets before training, so neither call
  says "checkpoint". They are left unpatched (transparent by construction); their POSIX calls
  are in the trace and analyze classifies each file by its use (read as samples: dataset;
  written and not sampled: checkpoint).
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

try:  # dlreplay's own process: the package capture.inject
    from . import hooks as core
except ImportError:  # in the job: top-level modules beside each other
    import _dlreplay_hooks as core  # type: ignore[no-redef]

#: Why a checkpoint event has no ``bytes``: the target's size cannot be known without
#: touching it in a way the job would notice (a seek), or the target is not a file or stream.
_UNSEEKABLE = "unseekable stream"
_UNKNOWN = "unknown target"


class _DcpState:
    """The DCP call in progress in this process (any thread: DCP's writer threads too):
    ``depth`` of nested DCP calls, the bytes its storage has reported, whether a
    ``FileSystemWriter``/``FileSystemReader`` reported any, and the nanoseconds spent in
    their data and metadata calls (``io_ns``)."""

    __slots__ = ("depth", "nbytes", "measured", "io_ns", "sync", "metadata")

    def __init__(self) -> None:
        self.depth = 0
        self.nbytes = 0
        self.measured = False
        self.io_ns = 0
        self.sync: bool | None = None  # the FileSystemWriter's sync_files (None: no writer)
        self.metadata = 0  # bytes of the .metadata this rank's writer wrote

    def add(self, nbytes: int) -> None:
        if self.depth:
            self.nbytes += int(nbytes)
            self.measured = True

    def add_io(self, ns: int) -> None:
        if self.depth:
            self.io_ns += int(ns)


_DCP = _DcpState()


class _Target:
    """What ``torch.save``/``torch.load`` was given, as far as the hook can tell without
    changing it: a path (``path`` and ``by_path``), or a stream (``path``: its name when
    that is a path; ``start``: its position before the call, None with ``reason`` when
    it has none)."""

    __slots__ = ("path", "by_path", "start", "reason")

    def __init__(self, f: Any) -> None:
        self.by_path = isinstance(f, (str, bytes, os.PathLike))
        self.start: int | None = None
        self.reason: str | None = None
        if self.by_path:
            self.path: str | None = os.fsdecode(f)
            return
        name = getattr(f, "name", None)
        self.path = name if isinstance(name, str) else None
        self.start, self.reason = _position(f)


def _position(f: Any) -> tuple[int | None, str | None]:
    """The stream's position, or (None, why not). Asks ``seekable()`` first where the
    stream has it, so an unseekable one is never asked to ``tell()``."""
    if not callable(getattr(f, "tell", None)):
        return None, _UNKNOWN
    seekable = getattr(f, "seekable", None)
    try:
        if callable(seekable) and not seekable():
            return None, _UNSEEKABLE
        return int(f.tell()), None
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return None, _UNSEEKABLE


def _file_size(path: str | None) -> int | None:
    if path and os.path.isfile(path):
        return os.path.getsize(path)
    return None


def _saved_bytes(hook: str, target: _Target, f: Any) -> int | None:
    """Bytes ``torch.save`` wrote: the file's size, else the stream's advance. A size that
    cannot be known is a miss of *hook*, counted with its reason."""
    if target.by_path:
        size = _file_size(target.path)
        reason = _UNKNOWN
    elif target.start is not None:
        end, reason_or_none = _position(f)
        size = end - target.start if end is not None else None
        reason = reason_or_none or _UNSEEKABLE
    else:
        size, reason = None, target.reason or _UNKNOWN
    if size is None:
        core.MISSES.add(hook, reason)
    return size


def _loaded_bytes(hook: str, target: _Target, f: Any) -> int | None:
    """Bytes ``torch.load`` had to read: the file's size (a path, or a stream named by
    one), or what a ``BytesIO`` holds past its position. Else a miss of *hook*."""
    size = _file_size(target.path)
    if size is None and not target.by_path and target.start is not None:
        getbuffer = getattr(f, "getbuffer", None)
        if callable(getbuffer):
            with getbuffer() as view:
                size = max(0, view.nbytes - target.start)
    if size is None:
        core.MISSES.add(hook, target.reason or _UNKNOWN)
    return size


def _wrap_checkpoint(orig: Callable[..., Any], hook: str, name: str) -> Callable[..., Any]:
    """``torch.save``/``torch.load`` as a ``checkpoint`` event *name* around the original,
    called exactly once with the job's arguments; its result or exception is the job's."""
    measure = _saved_bytes if name == "capture" else _loaded_bytes

    at = 1 if name == "capture" else 0  # torch.save(obj, f, ...), torch.load(f, ...)

    def begin(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[_Target, int | None, Any]:
        f = args[at] if len(args) > at else kwargs["f"]
        return _Target(f), core.REGIONS.begin(name, "checkpoint"), f

    def end(opened: tuple[_Target, int | None, Any] | None, ok: bool) -> None:
        if opened is None:  # begin missed, and was counted
            return
        target, handle, f = opened
        if not ok:  # the job's call raised: nothing was saved or loaded to measure
            core.REGIONS.end(handle, path=target.path, error=1)
            return
        core.REGIONS.end(handle, path=target.path, bytes=measure(hook, target, f))

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _DCP.depth:  # one of DCP's own tensors or its metadata: part of the DCP event
            return orig(*args, **kwargs)
        opened = core.guard(hook, begin, args, kwargs)
        try:
            result = orig(*args, **kwargs)
        except BaseException:
            core.guard(hook, end, opened, False)
            raise
        core.guard(hook, end, opened, True)
        return result

    return wrapper


def _patch_torch(mod: Any) -> None:
    if getattr(mod, "_dlreplay_patched", False) or not hasattr(mod, "save"):
        return
    save = _wrap_checkpoint(mod.save, "torch.save", "capture")
    load = _wrap_checkpoint(mod.load, "torch.load", "restart")
    mod.save = save
    mod.load = load
    serialization = sys.modules.get("torch.serialization")
    if serialization is not None:
        serialization.save = save  # type: ignore[attr-defined]
        serialization.load = load  # type: ignore[attr-defined]
    mod._dlreplay_patched = True


def _dcp_path(kwargs: dict[str, Any], storage: str) -> str | None:
    """The checkpoint directory of a DCP call: ``checkpoint_id``, else its storage writer's or
    reader's ``checkpoint_id``/``path`` (absolute; no I/O)."""
    target = kwargs.get("checkpoint_id")
    if target is None and kwargs.get(storage) is not None:
        target = getattr(kwargs[storage], "path", None)
    if isinstance(target, (str, bytes, os.PathLike)):
        return os.path.abspath(os.fsdecode(target))
    return None


def _wrap_dcp(orig: Callable[..., Any], hook: str, name: str) -> Callable[..., Any]:
    """DCP's ``save``/``load`` as one ``checkpoint`` event *name* of this rank around the
    original (called exactly once; its result or exception is the job's)."""
    storage = "storage_writer" if name == "capture" else "storage_reader"

    def begin(kwargs: dict[str, Any]) -> tuple[str | None, int | None]:
        path = _dcp_path(kwargs, storage)
        return path, core.REGIONS.begin(name, "checkpoint")

    def end(opened: tuple[str | None, int | None] | None, ok: bool, nbytes: int | None) -> None:
        if opened is None:
            return
        path, handle = opened
        if not ok:
            core.REGIONS.end(handle, path=path, error=1)
            return
        if nbytes is None:  # not a FileSystemWriter/Reader: analyze takes the POSIX transfers
            core.MISSES.add(hook, _UNKNOWN)
        io_us = _DCP.io_ns // 1000 if _DCP.measured else None
        extra: dict[str, int] = {}
        if _DCP.sync is not None:  # a FileSystemWriter's save: its fsync, its .metadata
            extra["fsync"] = int(_DCP.sync)
            if _DCP.metadata:
                extra["metadata_bytes"] = _DCP.metadata
        core.REGIONS.end(handle, path=path, bytes=nbytes, io_us=io_us, **extra)

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _DCP.depth:  # a DCP call inside another: the outer one is the event
            return orig(*args, **kwargs)
        opened = core.guard(hook, begin, kwargs)
        _DCP.depth, _DCP.nbytes, _DCP.measured, _DCP.io_ns = 1, 0, False, 0
        _DCP.sync, _DCP.metadata = None, 0
        try:
            result = orig(*args, **kwargs)
        except BaseException:
            _DCP.depth = 0
            core.guard(hook, end, opened, False, None)
            raise
        _DCP.depth = 0
        core.guard(hook, end, opened, True, _DCP.nbytes if _DCP.measured else None)
        return result

    return wrapper


def _written(results: Any) -> int:
    """Bytes of DCP ``WriteResult``s (each item's length in its shard file)."""
    return sum(int(r.storage_data.length) for r in results)


def _metadata_size(storage: Any, rank: int | None) -> int:
    """The size of a DCP ``.metadata`` file (``__<rank>.metadata`` without collectives)."""
    return os.path.getsize(os.fspath(storage._get_metadata_path(rank)))


def _patch_dcp_storage(fs: Any) -> None:
    """Report what DCP's ``FileSystemWriter`` wrote and its ``FileSystemReader`` read to the
    DCP call in progress (from DCP's own plans and results: no extra I/O but a ``stat`` of
    ``.metadata``). Each wrapper calls the original once and returns what it returns."""
    writer, reader = fs._FileSystemWriter, fs.FileSystemReader
    if getattr(writer, "_dlreplay_patched", False):
        return
    write_data, finish = writer.write_data, writer.finish
    read_data, read_metadata = reader.read_data, reader.read_metadata

    def sync_files(self: Any) -> None:
        sync = getattr(self, "sync_files", None)
        if _DCP.depth and isinstance(sync, bool):
            _DCP.sync = sync

    def write_wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        core.guard("dcp.FileSystemWriter", sync_files, self)
        t0 = time.perf_counter_ns()
        fut = write_data(self, *args, **kwargs)

        def on_written(fut: Any) -> None:
            _DCP.add_io(time.perf_counter_ns() - t0)
            core.guard("dcp.FileSystemWriter", lambda: _DCP.add(_written(fut.value())))

        core.guard("dcp.FileSystemWriter", fut.add_done_callback, on_written)
        return fut

    def finish_wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        result = finish(self, *args, **kwargs)
        _DCP.add_io(time.perf_counter_ns() - t0)
        local = not getattr(self, "use_collectives", True) and self.rank is not None
        rank = self.rank if local else None

        def metadata() -> None:
            size = _metadata_size(self, rank)
            _DCP.add(size)
            if _DCP.depth:
                _DCP.metadata += size

        core.guard("dcp.FileSystemWriter", metadata)
        return result

    def read_wrapper(self: Any, plan: Any, *args: Any, **kwargs: Any) -> Any:
        def planned() -> None:
            data = self.storage_data
            _DCP.add(sum(int(data[item.storage_index].length) for item in plan.items))

        core.guard("dcp.FileSystemReader", planned)
        t0 = time.perf_counter_ns()
        fut = read_data(self, plan, *args, **kwargs)
        core.guard(
            "dcp.FileSystemReader",
            fut.add_done_callback,
            lambda _f: _DCP.add_io(time.perf_counter_ns() - t0),
        )
        return fut

    def metadata_wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        result = read_metadata(self, *args, **kwargs)
        _DCP.add_io(time.perf_counter_ns() - t0)
        rank = kwargs.get("rank")
        core.guard("dcp.FileSystemReader", lambda: _DCP.add(_metadata_size(self, rank)))
        return result

    for cls, attr, fn, orig in (
        (writer, "write_data", write_wrapper, write_data),
        (writer, "finish", finish_wrapper, finish),
        (reader, "read_data", read_wrapper, read_data),
        (reader, "read_metadata", metadata_wrapper, read_metadata),
    ):
        setattr(cls, attr, functools.wraps(orig)(fn))
    writer._dlreplay_patched = True


def _patch_dcp(mod: Any) -> None:
    """``torch.distributed.checkpoint``: save/load (and the deprecated *_state_dict) as events,
    wherever the job's import finds them (the package and its saver/loader modules)."""
    if getattr(mod, "_dlreplay_patched", False) or not hasattr(mod, "save"):
        return
    saver, loader = mod.state_dict_saver, mod.state_dict_loader
    wrapped: dict[str, Callable[..., Any]] = {}
    for attr, name in (
        ("save", "capture"),
        ("save_state_dict", "capture"),
        ("load", "restart"),
        ("load_state_dict", "restart"),
    ):
        orig = getattr(mod, attr, None)
        if orig is None:
            continue
        wrapped[attr] = _wrap_dcp(orig, f"dcp.{attr}", name)
        setattr(mod, attr, wrapped[attr])
        for sub in (saver, loader):
            if getattr(sub, attr, None) is orig:
                setattr(sub, attr, wrapped[attr])
    _patch_dcp_storage(mod.filesystem)
    mod._dlreplay_patched = True


core.add_patch("torch", _patch_torch)
core.add_patch("torch.distributed.checkpoint", _patch_dcp)
