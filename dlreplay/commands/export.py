"""``dlreplay export``: write a trace as a Perfetto timeline."""

from __future__ import annotations

from pathlib import Path

import click

from dlreplay.commands.common import Status, check_output, echo


@click.command(short_help="Write a trace as a Perfetto timeline.")
@click.argument("trace", type=click.Path(path_type=Path))
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path),
    help="Timeline file: *.perfetto-trace (native, default) / *.pftrace, or *.json / *.json.gz.",
)
@click.option("--no-flows", is_flag=True, help="Do not draw item -> fetch hand-over arrows.")
@click.option("--force", is_flag=True, help="Overwrite an existing timeline file.")
def export(trace: Path, output: Path | None, no_flows: bool, force: bool) -> None:
    """Write the trace at TRACE as a Perfetto timeline (one track per process and thread).

    \b
    Example:
      dlreplay export traces/npz_fork -o npz_fork.perfetto-trace
    """
    from dlreplay.analyze import load_trace
    from dlreplay.analyze.perfetto import export_trace, format_for

    out = output or Path(f"{trace.resolve().name}.perfetto-trace")
    format_for(out)
    check_output(out, force, inputs=(trace,))
    with Status(f"loading {trace}"):
        loaded = load_trace(trace)
    with Status(f"writing {out}"):
        stats = export_trace(loaded.events, out, manifest=loaded.manifest, flows=not no_flows)
    echo(stats.summary())
    echo(f"next: dlreplay view {out}   |   dlreplay sql {out} --query io-per-thread")
