"""The ``dlreplay`` command line: the command group over :mod:`dlreplay.commands`.

Each command lives in a module of :mod:`dlreplay.commands`. This module holds the group
(its help lists the commands in pipeline order), ``main()``, and the error handling every
command runs under: a :class:`DlreplayError` becomes a one-line message on stderr (exit 1;
usage errors exit 2), never a traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

import dlreplay
from dlreplay import __version__
from dlreplay.commands import PIPELINE
from dlreplay.commands.common import fail
from dlreplay.errors import DlreplayError
from dlreplay.interrupt import INTERRUPT, hold_point, stacks_on_signal


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn dlreplay errors (and a few OS errors, and Ctrl-C: exit 130) into messages and exit codes."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            hold_point("command")  # test-only: a Ctrl-C as the command starts, on any machine
            result = fn(*args, **kwargs)
            INTERRUPT.check()  # a Ctrl-C whose KeyboardInterrupt a finalizer swallowed: not a finished run
            return result
        except DlreplayError as exc:
            fail(str(exc), exc.exit_code)
        except (
            BrokenPipeError
        ):  # `dlreplay analyze T | head`: the reader left; nothing to say to it
            import os

            os.dup2(
                os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno()
            )  # no error when Python flushes at exit
            sys.exit(1)
        except PermissionError as exc:
            fail(f"permission denied: {exc.filename or exc}", 1)
        except FileNotFoundError as exc:
            fail(f"no such file or directory: {exc.filename or exc}", 1)
        except (
            OSError
        ) as exc:  # read-only file system, disk full, ... : name the file, not a traceback
            where = f"{exc.filename}: " if exc.filename else ""
            fail(f"{where}{exc.strerror or exc}", 1)
        except KeyboardInterrupt:  # click would print "Aborted!" and exit 1
            # the command ends here: another Ctrl-C from now on (a second press, or one
            # delivered late after its signal was blocked while workers started) must not
            # raise out of the exit below, past click, and end the process by SIGINT
            _ignore_further_ctrl_c()
            fail("interrupted (Ctrl-C)", 130)

    return wrapper


def _ignore_further_ctrl_c() -> None:
    """SIGINT ignored from now on (main thread only: elsewhere the handler cannot change)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _guarded(command: click.Command) -> click.Command:
    """``command`` (and, for a group, each of its commands) running under :func:`handle_errors`."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _guarded(sub)
    elif command.callback is not None:
        command.callback = handle_errors(command.callback)
    return command


class _Group(click.Group):
    """The command group: its help lists the commands in the order they are added (the
    pipeline's); the process is set up for the work (:func:`dlreplay.prepare_process`)
    before a command is even parsed; and once a command has finished (its result printed,
    its exit code set), a late Ctrl-C is ignored while Python shuts down (closing a Dask
    cluster, joining threads), where it would print a traceback over a finished run."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        # before any command imports polars or numpy, which read their settings once, at import
        dlreplay.prepare_process()
        try:
            return super().main(*args, **kwargs)
        finally:
            import signal
            import threading

            if (
                kwargs.get("standalone_mode", True)
                and threading.current_thread() is threading.main_thread()
            ):
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                forget_unhandled_ctrl_c()


def forget_unhandled_ctrl_c() -> None:
    """Clear CPython's record of an unhandled Ctrl-C, so that the exit code the command chose
    (130 after a Ctrl-C) is the process's.

    A KeyboardInterrupt that comes out of code run by ``exec()`` of a string (a dataclass's
    generated methods, while a module is imported) makes CPython note it as unhandled, and the
    note stays even when dlreplay handles the exception: ``python -m dlreplay`` then ended by
    killing itself with SIGINT at exit, after printing "interrupted (Ctrl-C)" (seen in CI,
    about 1 run in 13 under load). Each ``exec()`` of a string clears the note when it
    starts and sets it only when a KeyboardInterrupt leaves it, so running one that cannot
    be interrupted (SIGINT is ignored by now) clears it; an interrupt still unhandled when
    the command returns would set it again as it leaves ``runpy``."""
    exec("None")  # noqa: S102 - a constant string


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dlreplay")
def main() -> None:
    """Trace-driven replay and analysis of deep-learning I/O.

    The commands follow the pipeline: capture a training job's I/O, analyze the
    trace, distill a workload model, generate its dataset and replay it, compare
    the replay with the real job. export, view and sql open traces in Perfetto;
    model converts to and from DLIO; demo runs it all on an example job.
    """
    # Ctrl-C raises KeyboardInterrupt as usual, and is also remembered: Python discards one
    # raised inside a finalizer or at-fork callback, and replay/generate check the flag.
    INTERRUPT.install("always")
    stacks_on_signal()  # DLREPLAY_STACKS_ON=USR1: kill -USR1 PID prints where it waits


for _command in PIPELINE:
    main.add_command(_guarded(_command))


if __name__ == "__main__":  # pragma: no cover
    main()
