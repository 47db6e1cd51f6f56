"""Checkpoint hooks injected into a captured job: ``torch.save`` / ``torch.load`` as DFTracer
``checkpoint`` events (``capture`` / ``restart``; ``path``, ``bytes``).

A hook family of :mod:`capture.inject.hooks` (see its ``EXTENSIONS``): in the job this file is
the top-level module ``_dlreplay_checkpoint``, in dlreplay's own process
``dlreplay.capture.inject.checkpoint``. Self-contained like the core: imports nothing of
dlreplay but the core hooks module. Every hook calls the original exactly once with the job's
arguments and returns its result or raises its exception; what it cannot measure is a miss.
"""

from __future__ import annotations

import functools
import os
import sys
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


core.add_patch("torch", _patch_torch)
