"""Ctrl-C that dlreplay cannot lose.

Python runs a SIGINT handler at the next bytecode boundary of the main thread, which may
be inside code whose exceptions the interpreter discards ("Exception ignored in ..."):
garbage-collection finalizers (a multiprocessing ``Queue``'s, when the previous epoch's
loader is collected) and ``os.register_at_fork`` callbacks (``logging``'s, while a loader
worker is forked). A ``KeyboardInterrupt`` raised there vanishes and the replay used to
run to completion (seen under CPU load). :data:`INTERRUPT` records the request in a flag before raising, and the replay
loop checks the flag at every step, so a swallowed ``KeyboardInterrupt`` still stops the
run at the next step; while the handler is installed such a swallowed interrupt is not
printed either (``sys.unraisablehook``).

The CLI installs the flag's handler for the whole command (mode ``always``: every Ctrl-C
raises, as Python's default does); a replay switches to ``first`` (later Ctrl-Cs must not
cut the writing of the partial metrics) or, in a process that only waits for accelerator
processes, to ``flag`` (nothing raised; the flag is polled).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Interrupt:
    """A remembered Ctrl-C. ``requested`` stays set until :meth:`reset`."""

    def __init__(self) -> None:
        self.requested = False

    def reset(self) -> None:
        self.requested = False

    def check(self) -> None:
        """Raise KeyboardInterrupt if Ctrl-C was received (even if its exception was swallowed)."""
        if self.requested:
            raise KeyboardInterrupt

    def _raise_always(self, signum: int, frame: Any) -> None:
        self.requested = True
        raise KeyboardInterrupt

    def _raise_first(self, signum: int, frame: Any) -> None:
        if self.requested:  # later Ctrl-Cs must not cut the writing of the partial result
            return
        self.requested = True
        raise KeyboardInterrupt

    def _flag_only(self, signum: int, frame: Any) -> None:
        self.requested = True

    def install(self, mode: str = "first") -> bool:
        """Handle SIGINT with this flag (``mode``: always, first, flag); False (nothing
        installed) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return False
        handler = {
            "always": self._raise_always,
            "first": self._raise_first,
            "flag": self._flag_only,
        }[mode]
        signal.signal(signal.SIGINT, handler)
        if not isinstance(sys.unraisablehook, _QuietInterrupts):
            sys.unraisablehook = _QuietInterrupts(sys.unraisablehook)
        return True

    @contextmanager
    def catching(self, mode: str = "first") -> Iterator[Interrupt]:
        """While inside, SIGINT sets the flag and raises KeyboardInterrupt as ``mode`` says."""
        previous = signal.getsignal(signal.SIGINT)
        previous_hook = sys.unraisablehook
        installed = self.install(mode)
        try:
            yield self
        finally:
            if installed:
                signal.signal(
                    signal.SIGINT, previous if previous is not None else signal.default_int_handler
                )
                sys.unraisablehook = previous_hook

    @contextmanager
    def deferred(self) -> Iterator[Interrupt]:
        """While inside, a Ctrl-C only sets the flag: nothing is raised half-way through, e.g.,
        starting worker processes (a worker started but not yet registered would be orphaned).
        Only when this flag's raising handler is installed; the caller checks the flag later."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        current = signal.getsignal(signal.SIGINT)
        if current not in (self._raise_first, self._raise_always):
            yield self
            return
        signal.signal(signal.SIGINT, self._flag_only)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, current)


class _QuietInterrupts:
    """``sys.unraisablehook`` that drops swallowed KeyboardInterrupts (the flag keeps them)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, unraisable: Any) -> None:
        if unraisable.exc_type is KeyboardInterrupt and INTERRUPT.requested:
            return
        self.inner(unraisable)


#: The process's interrupt flag (signal handlers are per process anyway).
INTERRUPT = Interrupt()

#: ``DLREPLAY_STACKS_ON=USR1`` (or ``USR2``): that signal prints every thread's Python stack
#: on stderr instead of ending the process (:func:`stacks_on_signal`).
STACKS_ENV = "DLREPLAY_STACKS_ON"


def stacks_on_signal() -> bool:
    """Where :data:`STACKS_ENV` names ``USR1`` or ``USR2``, make that signal print every
    thread's Python stack on stderr and go on: ``kill -USR1 PID`` shows where a run that does
    not stop is waiting. The processes dlreplay starts inherit the variable (a traced replay's
    child) or the handler (loader workers forked from it). Off by default: some MPI process
    managers signal their ranks with SIGUSR1, whose default action ends them. True when
    installed.

    The stacks are read by a Python handler, in the main thread and under the GIL, not by
    ``faulthandler.register(all_threads=True)``: that one reads the other threads' frames
    from inside the C signal handler while those threads run, and it crashed a held
    ``generate`` with SIGSEGV once in clean-clone CI (a thread was entering ``select``). The
    price: a main thread inside one long C call that does not return prints when it returns
    (waits on locks, queues, ``select`` and sleeps are interrupted and print at once; for a
    process stuck in C, ``py-spy dump --pid PID`` reads it from outside)."""
    name = os.environ.get(STACKS_ENV, "").strip().upper().removeprefix("SIG")
    if name not in ("USR1", "USR2"):
        return False
    signal.signal(getattr(signal, f"SIG{name}"), _print_stacks)
    return True


def _print_stacks(signum: int, frame: Any) -> None:
    """Signal handler of :func:`stacks_on_signal`: every thread's Python stack, most recent
    call first (as ``faulthandler`` prints them), in one write to stderr. Never raises, so the
    run it interrupts goes on whatever stderr is; a signal that comes while it prints is
    dropped (a nested handler would print the same stacks again)."""
    if not _printing_stacks.acquire(blocking=False):
        return
    try:
        own = threading.get_ident()
        names = {t.ident: t.name for t in threading.enumerate()}
        text = [
            f"Python stacks of pid {os.getpid()} ({signal.Signals(signum).name}, {STACKS_ENV}):\n"
        ]
        for ident, top in sys._current_frames().items():
            where = "Current thread" if ident == own else "Thread"
            text.append(
                f'{where} 0x{ident:016x} "{names.get(ident, "?")}" (most recent call first):\n'
            )
            start = (frame or top) if ident == own else top
            for entry in traceback.StackSummary.extract(
                traceback.walk_stack(start), lookup_lines=False
            ):
                text.append(f'  File "{entry.filename}", line {entry.lineno} in {entry.name}\n')
            text.append("\n")
        sys.stderr.write("".join(text))
        sys.stderr.flush()
    except Exception:  # stderr closed, gone or a broken pipe: the run goes on regardless
        pass
    finally:
        _printing_stacks.release()


#: Held while :func:`_print_stacks` prints (signal handlers run in the main thread only, so
#: this guards against a nested signal, not against other threads).
_printing_stacks = threading.Lock()


#: Test-only: ``DLREPLAY_TEST_HOLD=POINT`` makes :func:`hold_point` wait at POINT for Ctrl-C.
HOLD_ENV = "DLREPLAY_TEST_HOLD"
#: Seconds a held point waits for Ctrl-C before it goes on (a test never hangs for good).
HOLD_MAX_S = 300.0


def hold_point(point: str) -> None:
    """Test-only blocking point: when ``DLREPLAY_TEST_HOLD`` names *point*, print ``held at
    POINT`` on stderr and wait there (at most :data:`HOLD_MAX_S`) for Ctrl-C, so that a test's
    Ctrl-C lands at that point on a machine of any speed. A no-op otherwise.

    ``POINT:exec`` waits inside code run by ``exec()`` of a string, where a Ctrl-C also lands
    when it comes while a module defines a dataclass (its methods are made that way): the case
    :func:`dlreplay.cli.forget_unhandled_ctrl_c` is for."""
    name = os.environ.get(HOLD_ENV)
    if name not in (point, f"{point}:exec"):
        return
    sys.stderr.write(f"held at {name} ({HOLD_ENV}); waiting for Ctrl-C\n")
    sys.stderr.flush()
    if name.endswith(":exec"):
        exec("_wait()", {"_wait": _wait_for_ctrl_c})  # noqa: S102 - a constant string
    else:
        _wait_for_ctrl_c()


def _wait_for_ctrl_c() -> None:
    deadline = time.monotonic() + HOLD_MAX_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
        INTERRUPT.check()


def reached_point(point: str) -> None:
    """Test-only marker: when ``DLREPLAY_TEST_HOLD`` names *point*, print ``at POINT`` on
    stderr and go on (no waiting, unlike :func:`hold_point`): the code under test must then
    answer a Ctrl-C by itself (e.g. ``dlreplay sql``, while the trace processor runs an
    endless query). A no-op otherwise."""
    if os.environ.get(HOLD_ENV) != point:
        return
    sys.stderr.write(f"at {point} ({HOLD_ENV})\n")
    sys.stderr.flush()


def wait_interruptibly(done: threading.Event, timeout: float | None = None) -> bool:
    """Wait for ``done`` (at most ``timeout`` seconds; None: for ever) in short slices.

    A process-directed signal may be delivered to any thread; when it lands on another
    thread while the main thread is blocked in one long C call (a socket ``recv``), Python
    runs its handler only when that call returns, maybe never. Waiting in slices, the main
    thread runs the Ctrl-C handler within a tenth of a second (and a Ctrl-C whose
    KeyboardInterrupt was swallowed raises here too, :meth:`Interrupt.check`). True when
    ``done`` is set."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
        if left <= 0:
            return done.is_set()
        if done.wait(left):
            return True
        INTERRUPT.check()


@contextmanager
def sigterm_as_exit(signals: tuple[int, ...] | None = None) -> Iterator[None]:
    """While inside, SIGTERM (and SIGHUP: the terminal closed) raise ``SystemExit(128 +
    signal)`` in the main thread, so that ``finally`` blocks and context managers remove
    what the command made (a temporary copy of a trace) before the process ends; their
    default action ends it at once. A signal that is ignored (``nohup``) stays ignored.
    Outside the main thread: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = signals if signals is not None else (signal.SIGTERM, signal.SIGHUP)

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = {
        s: signal.signal(s, handler) for s in wanted if signal.getsignal(s) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old if old is not None else signal.SIG_DFL)
