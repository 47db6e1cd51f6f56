"""The ``dlreplay`` command line: thin click commands over the library.

Every command checks its inputs, builds one config, calls one library function and
prints a short summary plus the next command to run. :class:`DlreplayError` becomes
a one-line message on stderr (exit 1; usage errors exit 2), never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from dlreplay import __version__
from dlreplay.errors import DlreplayError


def _fail(message: str, code: int) -> None:
    click.echo(f"dlreplay: error: {message}", err=True)
    sys.exit(code)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn dlreplay errors (and a few OS errors) into messages and exit codes."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DlreplayError as exc:
            _fail(str(exc), exc.exit_code)
        except PermissionError as exc:
            _fail(f"permission denied: {exc.filename or exc}", 1)
        except FileNotFoundError as exc:
            _fail(f"no such file or directory: {exc.filename or exc}", 1)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dlreplay")
def main() -> None:
    """Trace-driven replay and analysis of deep-learning I/O.

    \b
    capture  run a training job under DFTracer, keep a trace directory
    analyze  summarise a trace (operations, files, transfer sizes, data-loader events)
    demo     run the whole pipeline on a bundled example job
    """


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--out", "-o", type=click.Path(path_type=Path), help="Trace directory (default traces/<name>-<UTC time>).")
@click.option("--data-dir", "data_dirs", multiple=True, help="Trace only files under this path (repeatable). Default: every file.")
@click.option("--name", help="Name of the capture (default: the command's name).")
@click.option("--force", is_flag=True, help="Replace a previous capture in a non-empty --out.")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@handle_errors
def capture(out: Path | None, data_dirs: tuple[str, ...], name: str | None, force: bool, quiet: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND under DFTracer and keep its trace.

    \b
    Example:
      dlreplay capture --data-dir data -- python train.py --epochs 2

    Every process is traced (DataLoader workers started by fork or spawn,
    multiprocessing pools, children of torchrun/mpiexec). PyTorch jobs also get
    data-loader events (epoch, fetch, step, item) and torch.save/torch.load
    checkpoint bytes, without code changes. Exits with the job's exit code.
    """
    from dlreplay.capture import CaptureConfig, run_capture

    result = run_capture(
        CaptureConfig(command=tuple(command), out=out, data_dirs=tuple(data_dirs), name=name, force=force)
    )
    if not quiet:
        _print_capture_summary(result)
    sys.exit(result.exit_code)


def _print_capture_summary(result: Any) -> None:
    from dlreplay.analyze import load_trace, summarize

    click.echo("", err=True)
    click.echo(f"dlreplay: capture {result.status} (exit code {result.exit_code}) in {result.wall_time_s:.1f} s", err=True)
    try:
        loaded = load_trace(result.trace_dir)
        s = summarize(loaded.events, data_dirs=(loaded.manifest or {}).get("data_dirs"))
        click.echo(
            f"  processes traced: {s.processes}   events: {loaded.events.height:,}   "
            f"dataset files: {s.dataset_files}   dataset bytes read: {_human(s.dataset_bytes_read)}",
            err=True,
        )
        if loaded.damaged:
            click.echo(f"  warning: {loaded.describe_damage()}", err=True)
    except DlreplayError as exc:
        click.echo(f"  (trace could not be summarised: {exc})", err=True)
    click.echo(f"  trace: {result.trace_dir}", err=True)
    click.echo(f"next: dlreplay analyze {result.trace_dir}", err=True)


def _human(n: float | int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


@main.command()
@click.argument("trace", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--data-dir", "data_dirs", multiple=True, help="Treat files under this path as the dataset.")
@handle_errors
def analyze(trace: Path, as_json: bool, data_dirs: tuple[str, ...]) -> None:
    """Summarise the trace at TRACE (a trace directory or .pfw/.pfw.gz files).

    Prints duration, processes and threads, a per-operation table (count, bytes,
    time), the top files, the read transfer-size histogram in Darshan's buckets and
    the dataset bytes read. Damaged files are salvaged and the dropped count shown.
    """
    from dlreplay.analyze import load_trace, render_text, summarize

    with _status(f"loading {trace}"):
        loaded = load_trace(trace)
    dirs = list(data_dirs) or (loaded.manifest or {}).get("data_dirs") or None
    summary = summarize(loaded.events, data_dirs=dirs)
    if as_json:
        payload = summary.to_dict()
        payload["trace"] = str(trace)
        payload["dropped_lines"] = loaded.dropped_lines
        payload["dropped_bytes"] = loaded.dropped_bytes
        click.echo(json.dumps(payload, indent=2))
        return
    click.echo(render_text(summary))
    if loaded.damaged:
        click.echo(f"\nwarning: {loaded.describe_damage()}")


class _status:
    """A live status line on a TTY (stderr); silent in pipes and CI."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.live = sys.stderr.isatty()

    def __enter__(self) -> _status:
        if self.live:
            sys.stderr.write(f"{self.text} …\r")
            sys.stderr.flush()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live:
            sys.stderr.write(" " * (len(self.text) + 2) + "\r")
            sys.stderr.flush()


@main.command()
@click.option("--out", "-o", type=click.Path(path_type=Path), default=Path("demo-out"), show_default=True,
              help="Directory for the demo's dataset, trace and reports.")
@click.option("--force", is_flag=True, help="Replace a previous demo run in --out.")
@handle_errors
def demo(out: Path, force: bool) -> None:
    """Run the pipeline on the bundled NPZ example job and print where everything is.

    Generates a small NPZ dataset, captures the training job under DFTracer
    (2 fork-started DataLoader workers, checkpoints), and analyses the trace.
    """
    from dlreplay.demo import DemoConfig, run_demo

    run_demo(DemoConfig(out=out, force=force), echo=lambda s: click.echo(s))


if __name__ == "__main__":  # pragma: no cover
    main()
