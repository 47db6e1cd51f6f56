"""What the commands share: safe printing, option types, the overwrite guard, a status line.

Nothing here imports polars or numpy: the command line sets their environment
(:func:`dlreplay.prepare_process`) after importing the commands and before any of them runs.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, NoReturn

import click

from dlreplay.units import terminal_safe


def echo(message: Any = "", err: bool = False, nl: bool = True) -> None:
    """``click.echo`` of text that may hold names from traces or models: control characters
    (escape sequences, bells, carriage returns) are shown escaped, never sent to the terminal."""
    click.echo(terminal_safe(message), err=err, nl=nl)


def fail(message: str, code: int) -> NoReturn:
    """Print ``dlreplay: error: MESSAGE`` on stderr and exit with ``code``."""
    echo(f"dlreplay: error: {message}", err=True)
    sys.exit(code)


class FiniteFloat(click.FloatRange):
    """A float option in [min, max] that is a number: click's FloatRange lets ``nan`` through."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if isinstance(rv, float) and not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


class Processes(click.IntRange):
    """How many processes an option starts (workers, jobs, accelerators): 1 up to what this system
    allows one command (:func:`dlreplay.osutil.process_limit`)."""

    name = "count"

    def __init__(self) -> None:
        super().__init__(min=1)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from dlreplay.osutil import process_limit

        rv = super().convert(value, param, ctx)
        limit, why = process_limit()
        if rv > limit:
            self.fail(
                f"{rv} processes are more than one command may start here (at most {limit}: {why})",
                param,
                ctx,
            )
        return rv


#: Seeds: non-negative integers below 2**63 (numpy's generators and JSON readers take them).
SEED = click.IntRange(min=0, max=2**63 - 1)


def check_output(path: Path, force: bool, inputs: Sequence[Path] = (), option: str = "-o") -> None:
    """Refuse (usage error, exit 2) an output file that is one of the command's *inputs* or a
    file of an input trace directory (with or without --force), a directory, or one that
    exists (a dangling link too) without *force*."""
    from dlreplay.errors import UsageError

    clash = _input_clash(path, inputs)
    if clash:
        raise UsageError(
            f"{path} is {clash}; a command never writes over what it reads, with or without "
            f"--force: choose another {option}."
        )
    if path.is_dir():
        raise UsageError(f"{path} is a directory; name a file with {option}.")
    if os.path.lexists(path) and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it or choose another {option}.")


def _input_clash(path: Path, inputs: Sequence[Path]) -> str | None:
    """What *path* is among *inputs* (``the input X``, ``a file of the input trace X``), or None."""
    from dlreplay.analyze.trace.inputs import TRACE_SUFFIXES
    from dlreplay.capture.run import CAPTURE_FILES

    def of_a_trace(name: str) -> bool:  # what a capture writes, or any DFTracer trace file
        return name.endswith(TRACE_SUFFIXES) or any(fnmatch(name, g) for g in CAPTURE_FILES)

    out = path.resolve()
    for inp in inputs:
        where = inp.resolve()
        if out == where or (path.exists() and inp.exists() and os.path.samefile(path, inp)):
            return f"the input {inp}"
        if where.is_dir() and out.is_relative_to(where) and of_a_trace(out.name):
            return f"a file of the input trace {inp}"
    return None


def check_report(path: Path, force: bool, inputs: Sequence[Path]) -> None:
    """``--report``: :func:`check_output`, and a Markdown report's figures folder
    (``<stem>.figures``) replaced only when it holds nothing but dlreplay's figures, and only
    with --force."""
    from dlreplay.analyze.report import check_figures_dir, figures_dir
    from dlreplay.errors import UsageError

    check_output(path, force, inputs, "--report")
    figs = figures_dir(path)
    if figs is None or not os.path.lexists(figs):
        return
    check_figures_dir(figs)
    if not force:
        raise UsageError(
            f"{figs} (the report's figures) exists; pass --force to replace it or choose another "
            f"--report."
        )


class Status:
    """A live status line on a TTY (stderr); silent in pipes and CI."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.live = sys.stderr.isatty()

    def __enter__(self) -> Status:
        if self.live:
            sys.stderr.write(f"{self.text} …\r")
            sys.stderr.flush()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live:
            sys.stderr.write(" " * (len(self.text) + 2) + "\r")
            sys.stderr.flush()


def signal_name(num: int) -> str:
    """``SIGKILL`` for 9; ``signal N`` for a number that names no signal."""
    import signal

    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def why_no_events(files: Any, manifest: dict | None) -> str:
    """Why a trace holds no events: per-file problems, and how the captured job ended."""
    lines = ["the trace holds no events."]
    lines += [f"  {f.name}: {'; '.join(f.problems) or 'no event lines'}" for f in files]
    manifest = manifest or {}
    sig = manifest.get("killed_by_signal")
    if sig:
        lines.append(
            f"  the captured job was killed by signal {sig} ({signal_name(sig)}): a process killed "
            f"that way cannot write the trace events DFTracer still held in memory."
        )
    elif manifest.get("status") == "running":
        lines.append(
            "  the manifest says the capture is still running (or its dlreplay process was killed)."
        )
    return "\n".join(lines)
