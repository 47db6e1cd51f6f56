"""Data-loader instrumentation injected into a captured job (self-contained).

This module runs inside the traced job's interpreter, which may not have dlreplay
installed, so it imports nothing from dlreplay. ``dlreplay capture`` copies it onto the
job's PYTHONPATH as the top-level module ``_dlreplay_hooks``, which ``sitecustomize`` imports.

Events go into DFTracer's own per-process stream through the C region API of the
preloaded library (``initialize_region`` / ``update_metadata_*`` /
``finalize_region``), looked up with ctypes in the process's global symbol table.
We do not import ``dftracer.dftracer`` (the pybind module): importing it in a
preloaded process re-initialises the DFTracer core into a new ``-app`` file and
discards every event the preload had buffered. Event names, categories and argument
names follow DFTracer's AI logging conventions (``dftracer.python.ai``; DFTracer docs,
"AI/DL Logging"), as if the job had written ``for epoch ...: with ai.pipeline.epoch``
and ``for batch in ai.dataloader.fetch.iter(loader)``, so DFTracer's own tools read
dlreplay traces:

=============  ===============  ================================================
cat            name             meaning (args)
=============  ===============  ================================================
pipeline       epoch            one pass over a DataLoader (``epoch``, ``steps``)
dataloader     fetch.iter       consumer blocked in ``next()`` for one batch
                                (``epoch``, ``step``, ``count``, ``batch_size``;
                                ``tensors``: tensors in the batch)
dataloader     fetch.block      consumer time between receiving batch ``step``
                                and asking for the next (the training step; same
                                args, and ``cpu_time``: CPU microseconds the
                                training process spent in it, all its threads;
                                ``cpu_threads``: how many threads shared it)
dataloader     fetch.stop       the last ``next()`` of an epoch, which found its
                                end (``batch_size`` 0): not a batch
data           item             one ``Dataset.__getitem__`` (``image_idx``;
                                ``cpu_time``: CPU microseconds the worker spent)
data           items            one ``Dataset.__getitems__``, or one batch fetch of an
                                ``IterableDataset`` (``count``, ``cpu_time``)
checkpoint     capture/restart  ``torch.save`` / ``torch.load`` (``path``, ``bytes``)
=============  ===============  ================================================

``step`` is 0-based within the epoch and ``count`` 1-based, as DFTracer's ``.iter``
writes it. Traces of format_version 1 spelled these ``dataloader/fetch``,
``compute/step`` and ``checkpoint/save``/``load``; dlreplay reads both.

Timestamps are taken by DFTracer itself (microseconds), so they share the clock of
the POSIX events.

``cpu_time`` is the process's CPU clock (``CLOCK_PROCESS_CPUTIME_ID``: the training loop,
torch's intra-op threads, any other thread of the training process; not its DataLoader
workers, which are other processes) over the loop body; ``cpu_threads`` is that over the
calling thread's own CPU clock, rounded (1: the loop ran on one thread; n: torch's pool of n
threads shared the work). A step on a GPU host uses little of it; a CPU-trained model
most of its wall time, taken from the DataLoader workers on a small host. Not part of
DFTracer's conventions (which have no host-CPU field): extra args its tools ignore.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import importlib.abc
import importlib.util
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_INT_MAX = 2**31 - 1
_INT_MIN = -(2**31)


_CSTRINGS: dict[str, bytes] = {}


def _cstr(text: str) -> bytes:
    """A NUL-terminated string that lives for the whole process.

    DFTracer's region API keeps the ``const char*`` it is given for names,
    categories and keys instead of copying them, so the bytes must never be freed.
    """
    b = _CSTRINGS.get(text)
    if b is None:
        b = _CSTRINGS[text] = text.encode("utf-8", "replace")
    return b


class _Regions:
    """Thin ctypes binding of DFTracer's C region API; a no-op when not preloaded."""

    def __init__(self) -> None:
        self.enabled = False
        self._fini: Any = None
        self._settle: Any = None
        self._finalized = False
        self._names: collections.deque[Any] = collections.deque(maxlen=256)
        if os.environ.get("DFTRACER_ENABLE") != "1":
            return
        try:
            lib = ctypes.CDLL(None)
            self._begin = lib.initialize_region
            self._end = lib.finalize_region
            self._set_int = lib.update_metadata_int
            self._set_str = lib.update_metadata_string
        except (AttributeError, OSError):
            return
        self._begin.restype = ctypes.c_void_p
        self._begin.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
        self._end.restype = None
        self._end.argtypes = [ctypes.c_void_p]
        self._set_int.restype = None
        self._set_int.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        self._set_str.restype = None
        self._set_str.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
        # Both called holding the GIL (PyDLL): see :meth:`finalize`.
        held = ctypes.PyDLL(None)
        self._fini = getattr(held, "_Z13dftracer_finiv", None)
        self._settle = getattr(held, "usleep", None)
        self.enabled = True

    def begin(self, name: str, cat: str, **args: Any) -> int | None:
        """Open a region now; returns a handle for :meth:`end` (None when disabled)."""
        if not self.enabled or self._finalized:
            return None
        handle = self._begin(_cstr(name), _cstr(cat), 0)
        if handle and args:
            self.update(handle, **args)
        return handle

    def begin_unnamed(self, cat: str, width: int = 16) -> tuple[int | None, Any]:
        """Open a region whose name is written when it ends (:meth:`end_named`).

        DFTracer keeps the name pointer and reads it when the event is written, so the
        name lives in a buffer of ours, filled in before the region is finalized. Buffers
        stay referenced (a ring of the last 256) well past the event's write.
        """
        if not self.enabled or self._finalized:
            return None, None
        buf = ctypes.create_string_buffer(width + 1)
        self._names.append(buf)
        return self._begin(ctypes.cast(buf, ctypes.c_char_p), _cstr(cat), 0), buf

    def end_named(self, region: tuple[int | None, Any], name: str, **args: Any) -> None:
        """Name a region of :meth:`begin_unnamed` (at most its buffer's width) and close it."""
        handle, buf = region
        if not handle:
            return
        raw = name.encode()[: len(buf) - 1]
        ctypes.memmove(buf, raw + b"\0", len(raw) + 1)
        self.end(handle, **args)

    def update(self, handle: int | None, **args: Any) -> None:
        """Attach key/value args. Ints outside C int range are written as decimal strings."""
        if not handle:
            return
        for key, value in args.items():
            if value is None:
                continue
            if isinstance(value, bool):
                value = int(value)
            if isinstance(value, int) and _INT_MIN <= value <= _INT_MAX:
                self._set_int(handle, _cstr(key), value)
            else:
                # Values are interned too: the string may be read only when the event is written.
                self._set_str(handle, _cstr(key), _cstr(str(value)))

    def end(self, handle: int | None, **args: Any) -> None:
        """Close a region (its duration ends now)."""
        if not handle:
            return
        if args:
            self.update(handle, **args)
        if not self._finalized:
            self._end(handle)

    def finalize(self, child_end: bool = False) -> None:
        """Flush and close this process's trace file (idempotent).

        Needed where a process leaves through ``os._exit`` (multiprocessing children),
        which skips the preload library's destructor and would lose buffered events.
        *child_end*: a multiprocessing child whose target returned (its queues are closed).
        """
        if self.enabled and self._fini is not None and not self._finalized:
            self._finalized = True
            with _signals_held(child_end):
                self._finalize_alone(_helper_threads_done(child_end))

    def _finalize_alone(self, quiet: set[Any]) -> None:
        if self._settle is None or all(t in quiet for t in threading.enumerate()):
            self._fini()
            return
        # DFTracer frees its buffers in ``dftracer_fini`` while another thread may be inside
        # one of its interceptors, logging a call on a traced file: the process died of
        # SIGSEGV (a reader thread still running at a multiprocessing child's end, or a
        # garbage collection closing a file in a helper thread; never without capture;
        # gdb: the thread in DFTLogger::log while DFTLogger::finalize frees; see
        # tests/test_capture_threads.py). So the other threads are kept out of it: the GIL
        # is held through the call (PyDLL, where CDLL would release it), after every
        # waiting thread was made to wait at a long switch interval (the sleep) so none
        # asks for the GIL meanwhile, and after a pause (held too) for calls already
        # under way to return: a file call takes microseconds, and an interceptor logs its
        # event before it returns. A call slower than the pause is not covered.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(_HOLD_S)
        try:
            time.sleep(0.001)
            self._settle(_SETTLE_US)
            self._fini()
        finally:
            sys.setswitchinterval(interval)


#: How long (microseconds) a child's end waits, holding the GIL, for the file calls other
#: threads have under way before DFTracer is finalized (:meth:`_Regions.finalize`), and the
#: switch interval (seconds) meanwhile: no waiting thread asks for the GIL before it.
_SETTLE_US = 100_000
_HOLD_S = 0.5


#: Signals that end a process, held at a child's end while DFTracer finalizes (below).
_ENDING_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


@contextmanager
def _signals_held(child_end: bool) -> Iterator[None]:
    """At a child's end (*child_end*), a signal that would end the process while DFTracer is
    being finalized arrives after it, with the handler it had: PyTorch's worker SIGTERM handler
    (C) calls ``_exit``, which DFTracer intercepts to finalize again inside ``dftracer_fini``
    (gdb: ``handler_SIGTERM`` → ``_exit_wrapper`` over ``BufferManager::finalize``); the worker
    aborted, "Resource deadlock avoided", in about one Ctrl-C'd traced replay in seven. The
    disposition is the process's (a mask would cover this thread only); it is read from the
    kernel (Python's table may name a handler inherited from the parent) and put back byte for
    byte; an ignored signal is left alone."""
    if not child_end or threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    held: dict[int, tuple[Any, Any]] = {}
    try:
        libc = ctypes.CDLL(None)
        for name in _ENDING_SIGNALS:
            sig = int(getattr(signal, name))
            saved = ctypes.create_string_buffer(512)  # a struct sigaction, opaque past its handler
            if libc.sigaction(sig, None, saved) != 0:
                continue
            if ctypes.c_void_p.from_buffer(saved).value == int(signal.SIG_IGN):
                continue
            before = signal.signal(sig, lambda signum, frame: arrived.append(signum))
            held[sig] = (saved, before)
    except (AttributeError, OSError, ValueError):
        pass
    try:
        yield
    finally:
        _release_signals(held, arrived)


def _release_signals(held: dict[int, tuple[Any, Any]], arrived: list[int]) -> None:
    """Put back what :func:`_signals_held` replaced, then deliver what arrived meanwhile.

    A function of its own: entering it runs the Python handlers of signals that arrived
    during the call (a Python function's start is where the interpreter runs them)."""
    libc = ctypes.CDLL(None)
    for sig, (saved, before) in held.items():
        if before is not None:
            signal.signal(sig, before)  # Python's own table, as it was
        libc.sigaction(sig, saved, None)  # the kernel's, exactly as it was
    for sig in dict.fromkeys(arrived):
        os.kill(os.getpid(), sig)


def _helper_threads_done(child_end: bool) -> set[Any]:
    """Let multiprocessing's own daemon threads in this process finish before DFTracer is
    finalized; returns those that need no wait.

    - At a child's end (*child_end*), multiprocessing has closed its queues; their feeders
      (a DataLoader worker's result queue's, whose join the worker cancels) are joined, for
      a quarter of a second at most: they write to pipes (a full one, whose reader has gone,
      would hold them for good).
    - The fd-passing server (``resource_sharer``; it serves the parent's requests for a
      tensor's shared-memory file) waits in ``accept`` on a socket whose path
      multiprocessing has removed by now (so ``stop()``, which connects to it, fails). It
      reads no file: left as it is."""
    me = threading.current_thread()
    deadline = time.monotonic() + 0.25
    for t in threading.enumerate() if child_end else ():
        if t.name.startswith("QueueFeederThread") and t is not me:
            t.join(max(0.0, deadline - time.monotonic()))
    sharer_mod = sys.modules.get("multiprocessing.resource_sharer")
    server = getattr(getattr(sharer_mod, "_resource_sharer", None), "_thread", None)
    return {me} | ({server} if server is not None else set())


REGIONS = _Regions()

#: Where each process of a capture writes the calls its hooks could not record: a directory
#: (``dlreplay capture`` sets it to the trace directory), one ``hook-misses-<pid>.json`` each.
MISSES_ENV = "DLREPLAY_HOOK_MISSES_DIR"
MISSES_PREFIX = "hook-misses-"


class _Misses:
    """Calls a hook could not record, by (hook, reason). The job's call went on unchanged;
    only its event (or an arg of it) is missing. Written to this process's file at its end
    (``atexit``; a multiprocessing child or a SIGTERM after its trace is closed, so that
    write is not traced). Never raises."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def after_fork(self) -> None:
        """A forked child starts with no misses of its own (and a lock nobody holds)."""
        self.counts = {}
        self._lock = threading.Lock()

    def add(self, hook: str, reason: str) -> None:
        try:
            with self._lock:
                self.counts[(hook, reason)] = self.counts.get((hook, reason), 0) + 1
        except Exception:  # counting must never break the job either
            pass

    def write(self) -> None:
        """This process's misses as JSON in the capture's directory (atomic; no-op without any)."""
        folder = os.environ.get(MISSES_ENV)
        if not folder or not self.counts:
            return
        try:
            with self._lock:
                rows = [
                    {"hook": h, "reason": r, "count": n}
                    for (h, r), n in sorted(self.counts.items())
                ]
            path = os.path.join(folder, f"{MISSES_PREFIX}{os.getpid()}.json")
            with open(path + ".tmp", "w", encoding="utf-8") as fh:
                fh.write(json.dumps({"pid": os.getpid(), "misses": rows}))
            os.replace(path + ".tmp", path)
        except Exception:
            pass


MISSES = _Misses()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=MISSES.after_fork)


def guard(hook: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` (a hook's own bookkeeping), or None, counted as a miss of *hook*, when it
    raises: whatever goes wrong in recording, the job's own call still runs as it would."""
    try:
        return fn(*args)
    except Exception as exc:
        MISSES.add(hook, f"error in the hook ({type(exc).__name__})")
        return None


@contextmanager
def region(name: str, cat: str = "user", **args: Any) -> Iterator[Callable[..., None]]:
    """Trace a block as one event; yields ``update(**args)`` to add args before it ends."""
    handle = guard("region", functools.partial(REGIONS.begin, name, cat, **args))

    def update(**more: Any) -> None:
        guard("region", functools.partial(REGIONS.update, handle, **more))

    try:
        yield update
    finally:
        guard("region", REGIONS.end, handle)


def traced(
    name: str | None = None, cat: str = "user"
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: trace every call of a function as one event."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        label = name or fn.__qualname__

        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            with region(label, cat):
                return fn(*a, **k)

        return wrapper

    return deco


# --------------------------------------------------------------------------- torch


def _batch_shape(batch: Any, limit: int = 4096) -> tuple[int, int | None]:
    """(samples, tensors) of a collated batch, in one breadth-first walk of at most ``limit``
    objects. Samples: the leading dimension of the first tensor/array found, else the
    length of the first list of scalars, else ``len(batch)``, else 1. Tensors: how many
    the batch holds (a worker hands each to the main process through shared memory, one
    file-descriptor transfer each); None when torch is not imported."""
    torch = sys.modules.get("torch")
    tensor = torch.Tensor if torch is not None else ()
    size: int | None = None
    n = seen = 0
    queue = collections.deque([batch])
    while queue and seen < limit:
        obj = queue.popleft()
        seen += 1
        if isinstance(obj, tensor):
            n += 1
        if size is None:
            shape = getattr(obj, "shape", None)
            if shape is not None and len(shape) > 0:
                size = int(shape[0])
        if isinstance(obj, dict):
            queue.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            if (
                size is None
                and obj
                and not hasattr(obj[0], "shape")
                and not isinstance(obj[0], (list, tuple, dict))
            ):
                size = len(obj)
            queue.extend(obj)
    if size is None:
        try:
            size = len(batch)
        except TypeError:
            size = 1
    return size, (n if torch is not None else None)


_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _cpu_clocks() -> tuple[int, int]:
    """(CPU ns of this process, all its threads; CPU ns of the calling thread)."""
    return time.process_time_ns(), time.thread_time_ns()


class _IterState:
    __slots__ = ("epoch", "step", "epoch_handle", "step_handle", "step_cpu", "step_t0", "done")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.step = 0
        self.epoch_handle: int | None = None
        self.step_handle: int | None = None
        self.step_cpu = (0, 0)
        self.step_t0 = 0.0
        self.done = False

    def begin_step(self, size: int) -> None:
        """Open the loop body of the batch just received (``fetch.block``)."""
        self.step_handle = REGIONS.begin(
            "fetch.block",
            "dataloader",
            epoch=self.epoch,
            step=self.step,
            count=self.step + 1,
            batch_size=size,
        )
        # when the loop body began (time.perf_counter): a traced replay counts its step from here
        self.step_t0 = time.perf_counter()
        if self.step_handle:
            self.step_cpu = _cpu_clocks()

    def end_step(self) -> None:
        """Close the loop body with the CPU the training process spent in it."""
        if self.step_handle:
            proc, own = _cpu_clocks()
            cpu, mine = proc - self.step_cpu[0], own - self.step_cpu[1]
            threads = (
                min(_CPUS, max(1, round(cpu / mine))) if mine > 0 else 1
            )  # at most what can run at once
            REGIONS.end(self.step_handle, cpu_time=cpu // 1000, cpu_threads=threads)
        self.step_handle = None

    def close(self) -> None:
        self.end_step()
        REGIONS.end(self.epoch_handle, steps=self.step)
        self.epoch_handle = None
        self.done = True


_open_iters: list[_IterState] = []
_lock = threading.Lock()


def _open_epoch(loader: Any) -> _IterState:
    """Close the loader's previous epoch if still open; open the next (before the workers
    start: they prefetch at once)."""
    epoch = loader.__dict__.get("_dlreplay_epoch", -1) + 1
    loader.__dict__["_dlreplay_epoch"] = epoch
    prev = loader.__dict__.get("_dlreplay_state")
    if prev is not None and not prev.done:
        prev.close()
    state = _IterState(epoch)
    state.epoch_handle = REGIONS.begin("epoch", "pipeline", epoch=epoch)
    return state


def _adopt(loader: Any, it: Any, state: _IterState) -> None:
    """Tie *state* to the new iterator *it* of *loader* (closed at exit if still open)."""
    try:
        it.__dict__["_dlreplay_state"] = state
        loader.__dict__["_dlreplay_state"] = state
    except BaseException:
        state.close()
        raise
    with _lock:
        _open_iters.append(state)


def _state_of(it: Any) -> _IterState | None:
    state = it.__dict__.get("_dlreplay_state")
    return state if isinstance(state, _IterState) and not state.done else None


def _before_next(state: _IterState) -> tuple[int | None, Any]:
    """End the loop body; open the wait, named when it ends (a batch, or the epoch's end)."""
    state.end_step()
    return REGIONS.begin_unnamed("dataloader")  # (handle, name buffer)


def _after_stop(state: _IterState, t_handle: Any, how: str) -> None:
    """``next()`` raised: StopIteration (``how`` "last") or another exception ("error")."""
    if t_handle is not None:
        args = {how: 1}
        REGIONS.end_named(
            t_handle, "fetch.stop", epoch=state.epoch, step=state.step, batch_size=0, **args
        )
    state.close()


def _after_batch(state: _IterState, t_handle: Any, batch: Any) -> None:
    """``next()`` returned *batch*: close the wait as ``fetch.iter``, open the loop body."""
    try:
        size, tensors = _batch_shape(batch)
        if t_handle is not None:
            REGIONS.end_named(
                t_handle,
                "fetch.iter",
                epoch=state.epoch,
                step=state.step,
                count=state.step + 1,
                batch_size=size,
                tensors=tensors,
            )
        state.begin_step(size)
    finally:  # the next batch is the next step, whatever could not be recorded of this one
        state.step += 1


def _patch_dataloader(mod: Any) -> None:
    loader_cls = mod.DataLoader
    iter_cls = mod._BaseDataLoaderIter
    if getattr(loader_cls, "_dlreplay_patched", False):
        return
    orig_iter = loader_cls.__iter__
    orig_next = iter_cls.__next__

    def __iter__(self: Any) -> Any:
        state = guard("DataLoader.__iter__", _open_epoch, self)
        try:
            it = orig_iter(self)
        except BaseException:
            if state is not None:
                guard("DataLoader.__iter__", state.close)
            raise
        if state is not None:
            guard("DataLoader.__iter__", _adopt, self, it, state)
        return it

    def __next__(self: Any) -> Any:
        state = guard("DataLoader.__next__", _state_of, self)
        if state is None:
            return orig_next(self)
        t_handle = guard("DataLoader.__next__", _before_next, state)
        try:
            batch = orig_next(self)
        except StopIteration:
            guard("DataLoader.__next__", _after_stop, state, t_handle, "last")
            raise
        except BaseException:
            guard("DataLoader.__next__", _after_stop, state, t_handle, "error")
            raise
        guard("DataLoader.__next__", _after_batch, state, t_handle, batch)
        return batch

    loader_cls.__iter__ = __iter__
    iter_cls.__next__ = __next__
    loader_cls._dlreplay_patched = True


def _begin_cpu(name: str, **args: Any) -> tuple[int | None, int]:
    """Open a ``data`` region; (its handle, the process's CPU ns now)."""
    handle = REGIONS.begin(name, "data", **args)
    return handle, (time.process_time_ns() if handle else 0)


def _end_cpu(opened: tuple[int | None, int] | None) -> None:
    """Close a region of :func:`_begin_cpu` with the CPU microseconds spent since."""
    if opened is not None and opened[0]:
        REGIONS.end(opened[0], cpu_time=(time.process_time_ns() - opened[1]) // 1000)


def _patch_fetch(mod: Any) -> None:
    map_cls = mod._MapDatasetFetcher
    iter_cls = mod._IterableDatasetFetcher
    if getattr(map_cls, "_dlreplay_patched", False):
        return

    def item(dataset: Any, idx: Any) -> Any:
        opened = guard(
            "Dataset.__getitem__",
            functools.partial(_begin_cpu, "item", image_idx=idx if isinstance(idx, int) else None),
        )
        try:
            return dataset[idx]
        finally:
            guard("Dataset.__getitem__", _end_cpu, opened)

    # torch's own _MapDatasetFetcher.fetch, step for step, with an event per item (or batch)
    def map_fetch(self: Any, possibly_batched_index: Any) -> Any:
        if self.auto_collation:
            if hasattr(self.dataset, "__getitems__") and self.dataset.__getitems__:
                opened = guard(
                    "Dataset.__getitems__",
                    lambda: _begin_cpu("items", count=len(possibly_batched_index)),
                )
                try:
                    data = self.dataset.__getitems__(possibly_batched_index)
                finally:
                    guard("Dataset.__getitems__", _end_cpu, opened)
            else:
                data = [item(self.dataset, idx) for idx in possibly_batched_index]
        else:
            data = item(self.dataset, possibly_batched_index)
        return self.collate_fn(data)

    orig_iter_fetch = iter_cls.fetch

    # an IterableDataset's batch (its samples' reads, decode and collation): one items event
    def iter_fetch(self: Any, possibly_batched_index: Any) -> Any:
        opened = guard(
            "IterableDataset fetch",
            lambda: _begin_cpu(
                "items", count=len(possibly_batched_index) if self.auto_collation else 1
            ),
        )
        try:
            return orig_iter_fetch(self, possibly_batched_index)
        finally:
            guard("IterableDataset fetch", _end_cpu, opened)

    map_cls.fetch = map_fetch
    iter_cls.fetch = iter_fetch
    map_cls._dlreplay_patched = True


#: What to patch in each module once it is imported: a module name, the patches to run on it in
#: order. Extensions (below) add theirs with :func:`add_patch` when they are imported.
PATCHES: dict[str, list[Callable[[Any], None]]] = {
    "torch.utils.data.dataloader": [_patch_dataloader],
    "torch.utils.data._utils.fetch": [_patch_fetch],
}

#: The hook modules beside this one, each one family of hooks (``capture/inject/<name>.py``,
#: the top-level module ``_dlreplay_<name>`` in the job). Each imports this module for the
#: region API, the miss counter and :func:`guard`, and registers its patches with
#: :func:`add_patch`; :func:`install` imports them.
EXTENSIONS = ("checkpoint", "distributed", "steps", "mapped", "s3")


def add_patch(module: str, patch: Callable[[Any], None]) -> None:
    """Run *patch* on *module* once it is imported (now, in :func:`install`, if it already is).
    A patch must be idempotent and must never change what the module does for the job."""
    PATCHES.setdefault(module, [])
    if patch not in PATCHES[module]:
        PATCHES[module].append(patch)


def _run_patches(fullname: str, module: Any) -> None:
    for patch in PATCHES.get(fullname, ()):
        try:
            patch(module)
        except Exception as exc:  # never break the user's job
            MISSES.add(f"import {fullname}", f"not instrumented ({type(exc).__name__})")
            print(f"dlreplay: could not instrument {fullname}: {exc}", file=sys.stderr)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs a patch right after a target module finishes executing (no eager torch import)."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in PATCHES or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        except Exception:  # the import system's own finders will say it again, as without us
            MISSES.add(f"import {fullname}", "module spec not found")
            return None
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        orig_exec = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            orig_exec(module)
            _run_patches(fullname, module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


# ------------------------------------------------------------------ process exits


def _close_open_iterators() -> None:
    with _lock:
        for state in _open_iters:
            if not state.done:
                state.close()
        _open_iters.clear()


def _at_exit() -> None:
    """The main process's end: close what is open, name what the hooks missed."""
    guard("exit", _close_open_iterators)
    MISSES.write()


def _finalize_process(child_end: bool = False) -> None:
    guard("exit", _close_open_iterators)
    guard("exit", REGIONS.finalize, child_end)
    MISSES.write()  # after the trace is closed: this write is not one of the job's


def _patch_multiprocessing() -> None:
    """Finalize DFTracer at the end of every multiprocessing child (they leave via os._exit)."""
    import multiprocessing.process as mp_process

    cls = mp_process.BaseProcess
    if getattr(cls, "_dlreplay_patched", False):
        return
    orig = cls._bootstrap  # type: ignore[attr-defined]

    def _bootstrap(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return orig(self, *args, **kwargs)
        finally:
            _finalize_process(child_end=True)

    cls._bootstrap = _bootstrap  # type: ignore[attr-defined]
    cls._dlreplay_patched = True  # type: ignore[attr-defined]


def _on_sigterm(signum: int, frame: Any) -> None:
    # Flush the trace, then die of the same signal so the exit status is unchanged.
    _finalize_process()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install() -> None:
    """Install all hooks in this process (idempotent). Called from sitecustomize."""
    if getattr(install, "_done", False) or not REGIONS.enabled:
        return
    install._done = True  # type: ignore[attr-defined]
    # DLREPLAY_LOADER_HOOKS=0 (capture --no-loader-hooks): POSIX/STDIO only, as DFTracer's preload
    # alone records; children are still flushed at exit, or their events would be lost
    if os.environ.get("DLREPLAY_LOADER_HOOKS", "1") != "0":
        for extension in EXTENSIONS:
            try:
                importlib.import_module(f"_dlreplay_{extension}")
            except Exception as exc:  # never break the user's job: that family goes unrecorded
                MISSES.add(f"extension {extension}", f"not loaded ({type(exc).__name__})")
        for name in list(PATCHES):
            mod = sys.modules.get(name)
            if mod is not None:
                _run_patches(name, mod)
        sys.meta_path.insert(0, _PostImportFinder())
    _patch_multiprocessing()
    import atexit

    atexit.register(_at_exit)
    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):
            pass
